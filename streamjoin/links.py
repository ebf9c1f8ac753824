"""The links of a join chain, one frozen class per kind, each holding and checking its own settings.

A job joins its first source with each link in turn. What a link means depends on its kind: two
streams within time bounds (`IntervalLink`); a stream looking a table up as each row arrived
(`StreamTableLink`), at an event time (`TemporalLink`) or by an inequality (`AsofLink`). A family
that is a plug-in holds its link classes in its own module (streamjoin/family.py; e.g. two
streams in time or ROWS windows or bounds, two tables, rows made from each row or looked up in a
database: streamjoin/joins/).
The kind is decided by the job, since its sources declare stream or table (`link_class`); the
plan's family of a link is its kind (streamjoin/plan.py). Settings shared by several kinds live in
small bases (`Conditioned`: on/using/natural; `Graced`: grace; `LooksUp`: as_of).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, ClassVar

from streamjoin import family
from streamjoin.enums import Emit, JoinType, LinkKind, SourceKind
from streamjoin.errors import JobError
from streamjoin.family import Claim
from streamjoin.timeutil import format_duration

DEFAULT_GRACE = timedelta(hours=24)  # ksqlDB's default grace period
# A stream-table join's point in time: `arrival` (the row's commit), `event_time` (the row's event
# time) or a named time column of a stream before the join, `source.column` (Flink's `FOR
# SYSTEM_TIME AS OF o.order_time`; docs/job-spec.md, "Event-time temporal").
AS_OF_WORDS = ("arrival", "event_time")
_AS_OF_COLUMN = re.compile(r"^`?([A-Za-z_][A-Za-z0-9_]*)`?\.`?([A-Za-z_][A-Za-z0-9_]*)`?$")
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
STREAM_TABLE = (SourceKind.STREAM, SourceKind.TABLE)


# ---------------------------------------------------------------------------- the base and shared parts


def _pair_words(left: SourceKind, right: SourceKind) -> str:
    return f"{left}-{right}"


@dataclass(frozen=True)
class Link:
    """One link of the join chain: everything joined so far, joined with `source` (for a lateral
    link: the name the rows it makes go by)."""

    source: str
    type: JoinType = JoinType.INNER

    kind: ClassVar[str]  # its family's word: a LinkKind for the built-in families, any word for a new one
    lateral: ClassVar[bool] = False  # joined with rows made for each row, not with a source
    asof: ClassVar[bool] = False  # picks the nearest row by an inequality
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
    def at_event_time(self) -> bool:
        """Looks its table up at an event time: the row's (`event_time`) or a named column's."""
        return False

    def expressions(self) -> list[tuple[str, str]]:
        """The SQL expressions this link holds, with what each is (what a parser will read)."""
        return []

    def check_pair(self, left: SourceKind, right: SourceKind, where: str) -> None:
        """Refuse this kind of link between what is joined so far (`left`) and its source (`right`);
        `where` names the job and the link."""

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


_AS_OF_STREAM_TABLE_ONLY = "'as_of' and 'asof' apply to stream-table joins only; remove them"


@dataclass(frozen=True)
class LooksUp(Link):
    """A stream row looking its table up, at `as_of`: `arrival` (the table as it was when the row
    arrived; the default), `event_time` or a named time column `<source>.<column>`."""

    as_of: str | None = None

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.as_of is not None and self.as_of not in AS_OF_WORDS and self.as_of_column is None:
            raise JobError(
                f"{where}: as_of is {self.as_of!r}; write 'arrival' (the table as it was when the row arrived), "
                "'event_time' (the version valid at the row's event time) or a time column of a stream before "
                "the join, <source>.<column> (the version valid at that time)"
            )

    @property
    def as_of_column(self) -> tuple[str, str] | None:
        """The (source, column) `as_of` names, e.g. `impressions.ts`; None for arrival/event_time."""
        named = _AS_OF_COLUMN.match(str(self.as_of)) if self.as_of is not None else None
        return (named.group(1), named.group(2)) if named else None

    @property
    def at_event_time(self) -> bool:
        return self.as_of == "event_time" or self.as_of_column is not None

    def check_pair(self, left: SourceKind, right: SourceKind, where: str) -> None:
        if (left, right) != STREAM_TABLE:
            raise JobError(f"{where}: {_AS_OF_STREAM_TABLE_ONLY} from this {_pair_words(left, right)} join")


_AS_OF_REFUSED = {"as_of": _AS_OF_STREAM_TABLE_ONLY, "asof": _AS_OF_STREAM_TABLE_ONLY}


# ---------------------------------------------------------------------------- a stream and a table


@dataclass(frozen=True)
class Enriching(LooksUp, Graced, Conditioned):
    """A stream row enriched from a table (the three kinds below, one join operator: temporal.py)."""


@dataclass(frozen=True)
class StreamTableLink(Enriching):
    """Each stream row joined with the table as committed when the row arrived (ksqlDB's
    stream-table join; as_of: arrival, Flink's FOR SYSTEM_TIME AS OF PROCTIME())."""

    kind = LinkKind.STREAM_TABLE

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.as_of not in (None, "arrival"):
            raise JobError(
                f"{where}: a stream-table link looks its table up at arrival; for {self.as_of} "
                "use a temporal link"
            )


@dataclass(frozen=True)
class TemporalLink(Enriching):
    """Each stream row joined with the table's version valid at its event time or at a named time
    column (Flink's event-time temporal join), decided once the table's watermark passed."""

    as_of: str | None = "event_time"

    kind = LinkKind.TEMPORAL

    def _check(self, where: str) -> None:
        super()._check(where)
        if not self.at_event_time:
            raise JobError(
                f"{where}: a temporal link looks its table up at an event time: as_of: event_time or "
                "<source>.<column>; for arrival use a stream-table link"
            )


@dataclass(frozen=True)
class AsofLink(Enriching):
    """Each stream row joined with the nearest table row by one inequality (RisingWave's ASOF
    JOIN): among the rows that had arrived before it, or (as_of: event_time) over the table's whole
    history."""

    kind = LinkKind.ASOF
    asof = True

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.as_of_column is not None:
            raise JobError(
                f"{where}: an ASOF join picks its row by its inequality; as_of takes 'event_time' (the nearest "
                f"row over the table's whole history) or 'arrival', not a column ({self.as_of}): compare that "
                "column in the inequality instead"
            )

    def check_pair(self, left: SourceKind, right: SourceKind, where: str) -> None:
        if (left, right) == STREAMS:
            raise JobError(
                f"{where}: ASOF between two streams is not supported yet (RisingWave's ASOF JOIN of two "
                f"append-only relations); declare {self.source!r} as a table (kind: table, key: [...], time: "
                "<column>) and add as_of: event_time for RisingWave's result, the nearest row over its whole "
                "history, final once its watermark has passed; without as_of each stream row gets the "
                "nearest row that had arrived before it"
            )
        super().check_pair(left, right, where)


# ---------------------------------------------------------------------------- which kind a job's link is


# Which kind of link a join item is, for the kinds whose family is not yet a plug-in
# (streamjoin/family.py): by precedence among the families' claims.
def _claim_nearest(
    given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None
) -> type[Link] | None:
    return AsofLink if given.get("asof") else None


def _claim_point_in_time(
    given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None
) -> type[Link] | None:
    as_of = given.get("as_of")
    return None if as_of is None else StreamTableLink if as_of == "arrival" else TemporalLink


_UNMOVED_CLAIMS = (
    Claim(40, _claim_nearest),
    Claim(50, _claim_point_in_time),
)


def link_class(given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None) -> type[Link]:
    """The kind of a link with these settings (`given`, as a job file writes them) between what is
    joined so far (`left`) and its source (`right`; None when the job names no such source, which
    the job refuses): the first family's claim, by precedence, that takes it; a stream and a table
    otherwise. Settings the kind cannot honour are refused by it (`check_pair`, `refused`), in
    the words a user wrote them."""
    for claim in sorted((*family.claims(), *_UNMOVED_CLAIMS), key=lambda c: c.precedence):
        found = claim.test(given, left, right)
        if found is not None:
            return found
    return StreamTableLink


def build_link(
    source: str, given: dict[str, Any], left: SourceKind | None, right: SourceKind | None
) -> tuple[Link, str | None]:
    """The link of this kind (`link_class`) with the settings given it takes, and why it refuses
    the first one it does not take (None: it takes them all; `emit: final`, every kind's
    behaviour, is taken by all). The job raises that refusal after checking the link against
    the kinds it joins, which says more when both fail."""
    kind = link_class(given, left, right)
    own = {f.name for f in fields(kind)} | ({"asof"} if kind.asof else set())
    refusal = next(
        (
            f"join with {source!r}: {kind.refused.get(name) or _AS_OF_REFUSED.get(name) or _does_not_apply(name, kind.kind)}"
            for name, value in given.items()
            if name not in own and not (name == "emit" and value == Emit.FINAL)
        ),
        None,
    )
    return kind(source, **{k: v for k, v in given.items() if k in own and k != "asof"}), refusal


def _does_not_apply(setting: str, kind: str) -> str:
    words = "'within'/'between'" if setting == "bounds" else f"'{setting}'"
    return f"{words} does not apply to this {kind} join; remove it"
