"""ROWS-window joins (SQLstream's `OVER (ROWS n PRECEDING)`): a row joins the latest rows of the
other stream, counted per key in arrival order.

`rows: {s: w}` keeps, per key, the w latest rows of stream s. Rows of both streams are ordered by
arrival: position (commit timestamp, source, version), then, within one commit, event time and
then content (the rule changelog versions and ASOF ties use). A row x of the other stream pairs
with each row y of s that came before it and is among the w latest rows of s with x's key when x
arrives (and the residual holds); with windows on both streams, each pair is found from its
later row. A stream without a window is seen by the other only as its rows arrive: "the join
evaluates for the current row only" (SQLstream).

Nothing is late: matching reads only the arrival order, which is final once settled. A row of a
stream without a window is decided as it arrives (paired, or padded on a preserved side, or
dropped); a row of a windowed stream stays open while it is in its key's window, and is decided
once w later rows of its key have come (or a closed input ends): `joined` if it ever paired,
else padded or dropped. A joined row's event time is the later of the two rows' times; a padded
row's its own. docs/design-window-joins.md, section 2, gives the reasons and an example.

Live, a windowed stream keeps its key's w latest rows (with their number in the key and whether
they paired); a replay reads each stream whole (`margins`), since a partner may be far away in
event time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from streamjoin import family
from streamjoin.enums import JoinType, LinkKind, SourceKind
from streamjoin.errors import JobError
from streamjoin.links import STREAMS, Conditioned

if TYPE_CHECKING:
    from streamjoin.plan import BoundJoin, Plan


@dataclass(frozen=True, kw_only=True)
class RowsLink(Conditioned):
    """Two streams in ROWS windows (SQLstream): per source of the link, how many of its latest rows
    per key the other stream sees; a stream not named is seen only as its rows arrive."""

    rows: tuple[tuple[str, int], ...]

    kind = LinkKind.ROWS
    refused = {
        "bounds": "give either 'rows' (the latest rows per key) or 'window'/'within'/'between' (time), not both",
        "window": "give either 'rows' (the latest rows per key) or 'window'/'within'/'between' (time), not both",
        "emit": "a ROWS-window join decides each row as rows arrive; remove 'emit'",
        "grace": "a ROWS window judges no row late (it reads only the order rows arrive in); remove 'grace'",
    }

    def _check(self, where: str) -> None:
        super()._check(where)
        object.__setattr__(self, "rows", tuple(self.rows))
        if self.type == JoinType.CROSS:
            raise JobError(
                f"{where}: ROWS windows count rows per key; a CROSS join has no key. Use type inner with "
                "on: a.id = b.id"
            )
        for name, count in self.rows:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise JobError(
                    f"{where}: rows {{{name}: {count!r}}} must be a whole number of rows, 1 or more "
                    "(SQLstream's ROWS 5 PRECEDING is 6: the five before and the current one)"
                )

    def check_pair(self, left: SourceKind, right: SourceKind, where: str) -> None:
        if (left, right) != STREAMS:
            raise JobError(
                f"{where}: ROWS windows keep the latest rows of streams (SQLstream: a table takes no OVER); "
                f"{self.source!r} is a {right}"
            )


def _settings(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`rows: {prices: 6}`: per source of the join, how many of its latest rows per key are kept."""
    if not isinstance(item["rows"], dict) or not item["rows"]:
        raise JobError(
            f"{where}: rows {item['rows']!r} should map a source of the join to a number of rows, e.g. rows: {{prices: 6}}"
        )
    return {"rows": tuple((str(name), count) for name, count in item["rows"].items())}


_ROWS_FRAME = re.compile(
    r"ROWS\s+(?:CURRENT\s+ROW|(\d+)\s+PRECEDING|BETWEEN\s+(\d+)\s+PRECEDING\s+AND\s+CURRENT\s+ROW)"
)


def _counts_rows(window: exp.Expr) -> bool:
    return isinstance(window, exp.Var) and window.name.upper().startswith("ROWS")


def _sql_rows(query: family.SqlQuery) -> dict[str, Any] | None:
    """SQLstream's `<source> OVER (ROWS n PRECEDING)` on the sources of a query's one join: its
    `rows`; None when no OVER window counts rows."""
    counted = {name: _rows_window(over, query) for name, over in query.overs.items() if _counts_rows(over)}
    if not counted:
        return None
    if len(counted) != len(query.overs) or query.joins != 1:
        raise JobError(
            f"{query.where}: {query.at(query.query)}ROWS windows take one join whose windows all count rows "
            "(SQLstream: a joined reference takes no OVER); for RANGE windows write RANGE on every side"
        )
    return {"rows": counted}


def _rows_window(window: exp.Expr, query: family.SqlQuery) -> int:
    """How many rows a SQLstream ROWS frame holds: `n PRECEDING` (or `BETWEEN n PRECEDING AND
    CURRENT ROW`) is the n rows before the current one and it, n + 1; `CURRENT ROW` is 1."""
    text = " ".join(window.name.split()).upper()
    found = _ROWS_FRAME.fullmatch(text)
    if found is None:
        raise JobError(
            f"{query.where}: {query.at(window)}the window OVER ({window.name}) is not supported: write ROWS <n> "
            "PRECEDING, ROWS BETWEEN <n> PRECEDING AND CURRENT ROW or ROWS CURRENT ROW (UNBOUNDED would keep "
            "every row)"
        )
    preceding = found.group(1) or found.group(2)
    return int(preceding) + 1 if preceding else 1


def _bind(binding: family.Binding) -> dict[str, Any]:
    """A ROWS window is kept of a side of its join: a source it names must be one."""
    link = binding.link
    assert isinstance(link, RowsLink)
    sides = (binding.left[-1], link.source)
    strangers = [name for name, _ in link.rows if name not in sides]
    if strangers:
        raise JobError(
            f"{binding.where}: rows names {strangers[0]!r}, which is not a side of this join ({', '.join(sides)})"
        )
    return {}


def _explain(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    kept = ", ".join(f"the {count} latest {name} rows" for name, count in join.link(RowsLink).rows)
    return [
        f"     ROWS windows: per key, {kept} (a stream not named is seen as its rows arrive); rows "
        "ordered by arrival, nothing late; live state keeps them for every key ever seen"
    ]


family.register(
    family.Family(
        name="rows",
        links=(RowsLink,),
        claims=(family.Claim.key(10, "rows", RowsLink),),
        keys=("rows",),
        settings=_settings,
        sql=family.SqlSyntax(query=_sql_rows),
        bind=_bind,
        explain=_explain,
        operator="streamjoin.joins.rows.step:RowsJoin.build",
    )
)
