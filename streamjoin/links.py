"""The links of a join chain, one frozen class per kind, each holding and checking its own settings.

A job joins its first source with each link in turn. What a link means depends on its kind, and
each family holds its link classes in its own module (streamjoin/family.py; e.g. two streams in
time or ROWS windows or bounds, a stream looking a table up, two tables, rows made from each row
or looked up in a database: streamjoin/joins/). This module keeps what every family shares.
The kind is decided by the job, since its sources declare stream or table (`link_class`); the
plan's family of a link is its kind (streamjoin/plan.py). Settings shared by several kinds live in
small bases (`Conditioned`: on/using/natural; `Graced`: grace).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from streamjoin import family
from streamjoin.enums import Emit, JoinType, SourceKind
from streamjoin.errors import JobError
from streamjoin.timeutil import format_duration

if TYPE_CHECKING:
    from streamjoin.spec import JoinSpec

DEFAULT_GRACE = timedelta(hours=24)  # ksqlDB's default grace period
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOIN_TYPES = {
    "inner": JoinType.INNER,
    "join": JoinType.INNER,
    "left": JoinType.LEFT,
    "left outer": JoinType.LEFT,
    "left_outer": JoinType.LEFT,
    "right": JoinType.RIGHT,
    "right outer": JoinType.RIGHT,
    "right_outer": JoinType.RIGHT,
    "full": JoinType.FULL,
    "full outer": JoinType.FULL,
    "full_outer": JoinType.FULL,
    "outer": JoinType.FULL,
    "cross": JoinType.CROSS,
    "cross join": JoinType.CROSS,
}
STREAMS = (SourceKind.STREAM, SourceKind.STREAM)


# ---------------------------------------------------------------------------- the base and shared parts


@dataclass(frozen=True)
class Link:
    """One link of the join chain: everything joined so far, joined with `source` (for a lateral
    link: the name the rows it makes go by)."""

    source: str
    type: JoinType = JoinType.INNER

    kind: ClassVar[str]  # its family's word: a LinkKind for the built-in families, any word for a new one
    makes_rows: ClassVar[bool] = False  # joined with rows made for each row, not with a source
    # Settings a job gives only to choose this kind (ASOF's `asof: true`): taken, not held.
    marks: ClassVar[tuple[str, ...]] = ()
    # Settings a job file may give that this kind refuses, with why (after "join with 'x': ").
    refused: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        where = f"join with {self.source!r}"
        kind = _JOIN_TYPES.get(str(self.type).lower().strip())
        if kind is None:
            raise JobError(f"{where}: type {self.type!r} is unknown; write inner, left, right, full or cross")
        object.__setattr__(self, "type", kind)
        self._check(where)

    def _check(self, where: str) -> None:
        """This kind's own settings; each base and kind adds its checks after its parents'."""

    @property
    def described(self) -> str:
        """How a message names a join of this kind, before "join" (`a`, `an ASOF`)."""
        return "a"

    @property
    def at_event_time(self) -> bool:
        """Looks its table up at an event time: the row's (`event_time`) or a named column's."""
        return False

    def expressions(self) -> list[tuple[str, str]]:
        """The SQL expressions this link holds, with what each is (what a parser will read)."""
        return []

    def check_pair(self, left: SourceKind, right: SourceKind, where: str) -> None:
        """Refuse this kind of link between what is joined so far (`left`) and its source (`right`);
        `where` names the job and the link."""

    def check_job(self, spec: JoinSpec, where: str) -> None:
        """Refuse this link within its whole job (e.g. a source it names joined after it), once
        `check_pair` passed; `where` names the job and the link."""

    def settings(self) -> dict[str, Any]:
        """The link as plain data: its kind and every setting (what `explain --json` prints and the
        definition's hash covers)."""
        return {"kind": str(self.kind), **{f.name: plain(getattr(self, f.name)) for f in fields(self)}}


def plain(value: Any) -> Any:
    """A setting as JSON data: durations as text (1h30m), a value with a `plain()` method (a
    family's own setting: an interval join's bounds, a window join's windows, a lookup's database by
    its table and URL without parameters, which may hold secrets) as that says."""
    if isinstance(value, timedelta):
        return format_duration(value)
    if callable(getattr(value, "plain", None)):  # a family's setting that says itself as data
        return value.plain()
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return str(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Conditioned(Link):
    """A link with a source, joined on exactly one condition: `on` (an expression), `using`
    (columns both sides have) or `natural` (every column both sides have); a CROSS link on none."""

    on: str | None = None
    using: tuple[str, ...] = ()
    natural: bool = False

    def _check(self, where: str) -> None:
        super()._check(where)
        object.__setattr__(self, "using", tuple(self.using))
        conditions = sum([bool(self.on), bool(self.using), bool(self.natural)])
        if self.type == JoinType.CROSS and conditions:
            raise JobError(
                f"{where}: a CROSS join pairs every row with every row of the other side within its time "
                "bounds and takes no condition; remove 'on'/'using'/'natural' (filters go in 'where'), or "
                "use type inner with the condition"
            )
        if self.type != JoinType.CROSS and conditions != 1:
            raise JobError(
                f"{where}: give exactly one condition: 'on' (an expression), 'using' (columns) or 'natural: true'"
            )

    def expressions(self) -> list[tuple[str, str]]:
        return [("on", self.on)] if self.on is not None else []


@dataclass(frozen=True)
class Graced(Link):
    """A link that judges rows late: `grace` behind the newest event time (docs/semantics.md)."""

    grace: timedelta = DEFAULT_GRACE

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.grace < timedelta(0):
            raise JobError(
                f"{where}: grace {format_duration(self.grace)} is negative; write a grace of 0s or more"
            )


# ---------------------------------------------------------------------------- which kind a job's link is


def link_class(given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None) -> type[Link]:
    """The kind of a link with these settings (`given`, as a job file writes them) between what is
    joined so far (`left`) and its source (`right`; None when the job names no such source, which
    the job refuses): the first family's claim, by precedence, that takes it (the last claim takes
    every link: a stream and a table). Settings the kind cannot honour are refused by it
    (`check_pair`, `refused`), in the words a user wrote them."""
    for claim in family.claims():
        found = claim.test(given, left, right)
        if found is not None:
            return found
    raise JobError(f"no join family takes a link with the settings {', '.join(given) or 'none'}")


def build_link(
    source: str, given: dict[str, Any], left: SourceKind | None, right: SourceKind | None
) -> tuple[Link, str | None]:
    """The link of this kind (`link_class`) with the settings given it takes, and why it refuses
    the first one it does not take (None: it takes them all; `emit: final`, every kind's
    behaviour, is taken by all): its own words, else those of the family whose setting it is
    (`family.Family.refused_elsewhere`). The job raises that refusal after checking the link
    against the kinds it joins, which says more when both fail."""
    kind = link_class(given, left, right)
    held = {f.name for f in fields(kind)}
    refusal = next(
        (
            f"join with {source!r}: {kind.refused.get(name) or family.refused_elsewhere(name) or _does_not_apply(name, kind.kind)}"
            for name, value in given.items()
            if name not in held | set(kind.marks) and not (name == "emit" and value == Emit.FINAL)
        ),
        None,
    )
    return kind(source, **{k: v for k, v in given.items() if k in held}), refusal


def _does_not_apply(setting: str, kind: str) -> str:
    words = "'within'/'between'" if setting == "bounds" else f"'{setting}'"
    return f"{words} does not apply to this {kind} join; remove it"
