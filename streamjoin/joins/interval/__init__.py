"""Interval (windowed) stream-stream joins: ksqlDB WITHIN, Flink/RisingWave interval, SQLstream RANGE.

A left row l and a right row r join when their keys are equal, the residual predicate holds, both
are on time, and  lower <= r.time - l.time <= upper  (both ends included). A joined row's event
time is the later of the two; an unmatched row's is its own. A CROSS join (SQLstream) has no keys
and no residual: every pair in the time bounds joins, and no side is padded.

Final emission (default): an outer row padded with NULLs is written once its window has closed,
that is once the watermark has passed the last time a partner could have: for a left row,
watermark > l.time + upper; for a right row, watermark > r.time - lower. A partner at that edge
arriving later would be strictly below the watermark, hence late: closing and lateness are the same
instant, so a row comes out joined or padded, never both.

Eager emission (`emit: eager`, SQLstream, ksqlDB without grace): an on-time outer row is decided
as soon as the joined streams' clock (the largest settled event time) has moved past its time, as
SQLstream decides per rowtime millisecond; it is padded then if no partner arrived before that
(or at or before its own position, if the clock was already past it when it came). Rows of equal
event time thus meet whichever source committed first. Matches that arrive later are emitted as
they come, and the pad is not retracted. A row whose window closes before the clock passes its
time is decided when it closes. All of it is read from positions and the timeline, so replays
reproduce it exactly.

`evaluate` is the whole semantics. Both runners call it: the replay once over all settled rows,
the live runner once per micro-batch over its state plus the newly settled rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from streamjoin import family
from streamjoin.enums import Emit, JoinType, LinkKind, SourceKind
from streamjoin.errors import JobError
from streamjoin.links import STREAMS, Conditioned, Graced, Link
from streamjoin.sql import interval_micros
from streamjoin.timeutil import format_duration, parse_duration

if TYPE_CHECKING:
    from streamjoin.plan import BoundJoin, Plan


@dataclass(frozen=True)
class TimeBounds:
    """right.time - left.time must lie in [lower, upper], both ends included."""

    lower: timedelta
    upper: timedelta

    def describe(self) -> str:
        if self.lower == -self.upper:
            return f"WITHIN {format_duration(self.upper)}"
        return f"BETWEEN {format_duration(self.lower)} AND {format_duration(self.upper)}"

    def plain(self) -> dict[str, str]:
        """As JSON data (`links.plain`)."""
        return {"lower": format_duration(self.lower), "upper": format_duration(self.upper)}


@dataclass(frozen=True, kw_only=True)
class IntervalLink(Graced, Conditioned):
    """Two streams whose rows pair when right.time - left.time lies in `bounds` (ksqlDB's WITHIN),
    a CROSS link pairing every two rows so; padded rows written once their window closes (`emit:
    final`) or at once (`eager`). Without bounds it is refused by the job (`check_pair`)."""

    bounds: TimeBounds | None = None
    emit: Emit = Emit.FINAL

    kind = LinkKind.INTERVAL

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.bounds is not None and self.bounds.lower > self.bounds.upper:
            raise JobError(
                f"{where}: 'between' lower bound {format_duration(self.bounds.lower)} is above its upper bound "
                f"{format_duration(self.bounds.upper)}; write [lower, upper] with lower <= upper"
            )
        if self.emit not in list(Emit):
            raise JobError(f"{where}: emit is {self.emit!r}; write 'final' (default) or 'eager'")
        object.__setattr__(self, "emit", Emit(self.emit))

    def check_pair(self, left: SourceKind, right: SourceKind, where: str) -> None:
        words = f"{left}-{right}"
        if (left, right) != STREAMS and self.bounds is None and self.emit == Emit.EAGER:
            raise JobError(
                f"{where}: 'emit: eager' applies to stream-stream joins only; remove it from this {words} join"
            )
        if (left, right) != STREAMS:
            raise JobError(
                f"{where}: 'within'/'between' apply to stream-stream joins only; remove them from this {words} join"
            )
        if self.bounds is None and self.type == JoinType.CROSS:
            raise JobError(
                f"{where}: a CROSS join of two streams needs time bounds, or every row would pair with every "
                "row of the other stream forever; add 'within: 1m' (SQLstream's RANGE INTERVAL '1' MINUTE on "
                "both sides) or 'between: [-1m, 0s]'"
            )
        if self.bounds is None:
            raise JobError(
                f"{where}: a stream-stream join needs time bounds, or its state would grow with all history; "
                "add 'within: 1h' (|right.time - left.time| <= 1h) or 'between: [-1h, 2h]' (right.time - left.time), or time windows: 'window: {tumble: 10m}'"
            )


def _claim_bounds(
    given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None
) -> type[Link] | None:
    """Bounds or eager emission given to a join that is not stream-stream: an interval link, which
    refuses them in the words given (before the enrichment families look at as_of/asof)."""
    given_bounds = "bounds" in given or given.get("emit") == Emit.EAGER
    return IntervalLink if (left, right) != STREAMS and given_bounds else None


def _claim_streams(
    given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None
) -> type[Link] | None:
    """Two streams (or bounds, or eager emission): an interval link."""
    streams = (left, right) == STREAMS
    return IntervalLink if streams or "bounds" in given or given.get("emit") == Emit.EAGER else None


def _settings(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`within: 1h` (|right.time - left.time| <= 1h) or `between: [-4h, 0s]` as `bounds`; `emit`."""
    given: dict[str, Any] = {} if item.get("emit") is None else {"emit": item["emit"]}
    if "within" in item and "between" in item:
        raise JobError(f"{where}: give either 'within' or 'between', not both")
    if "within" in item:
        width = parse_duration(item["within"], f"{where}: within")
        if width < timedelta(0):
            raise JobError(
                f"{where}: within {item['within']!r} is negative; write a positive width such as 1h"
            )
        return given | {"bounds": TimeBounds(-width, width)}
    if "between" not in item:
        return given
    pair = item["between"]
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise JobError(
            f"{where}: 'between' takes two durations [lower, upper] of right.time - left.time, e.g. [-4h, 0s]"
        )
    lower, upper = (parse_duration(end, f"{where}: between") for end in pair)
    return given | {"bounds": TimeBounds(lower, upper)}


# ---------------------------------------------------------------------------- SQL: WITHIN, OVER (RANGE ...), time terms


def _sql_query(query: family.SqlQuery) -> None:
    """ksqlDB's WITHIN belongs after a joined stream; Lenses' WITHIN after the query is its one
    join's (set on it here); SQLstream's RANGE windows must each be one."""
    select, where, at = query.query, query.where, query.at
    start = select.args.get("from_") or select.args.get("from")
    if start is not None and start.this.args.get("within") is not None:
        raise JobError(
            f"{where}: {at(start.this)}WITHIN belongs after a joined stream, not after FROM {query.first}"
        )
    for over in query.overs.values():
        _window_micros(over, query)
    trailing = select.args.get("within")  # Lenses: WITHIN after the query, the window of its one join
    if trailing is None:
        return None
    joined = select.args.get("joins") or []
    if len(joined) != 1:
        raise JobError(
            f"{where}: {at(trailing)}a WITHIN after the query belongs to its one join; with {len(joined)} "
            "joins, write WITHIN after each joined stream"
        )
    given = joined[0].this.args.get("within")
    if given is not None and [query.duration(span) for span in given.expressions] != [
        query.duration(trailing)
    ]:
        raise JobError(
            f"{where}: {at(trailing)}the join and the query give different WITHIN windows; give one"
        )
    joined[0].this.set("within", exp.Tuple(expressions=[trailing]))
    return None


def _window_micros(window: exp.Expr, query: family.SqlQuery | family.SqlJoin) -> int:
    """A SQLstream join window's length: `RANGE INTERVAL '1' MINUTE PRECEDING`."""
    span = interval_micros(window)
    if span is None:
        raise JobError(
            f"{query.where}: {query.at(window)}the window OVER ({window.sql()}) is not supported: write RANGE "
            "INTERVAL '<n>' <unit> PRECEDING or ROWS <n> PRECEDING"
        )
    return span


def _sql_join(join: family.SqlJoin) -> None:
    """SQLstream's RANGE windows on the two streams and ksqlDB's `WITHIN`, as the item's bounds."""
    item, table, name = join.item, join.join.this, join.name
    windows = {source: _window_micros(over, join) for source, over in join.overs.items()}
    if windows and join.sources[name]["kind"] == "stream":
        # SQLstream: each side keeps its rows for its window, no OVER: the current row only; the
        # sources joined so far (a joined reference, which takes no OVER) count as their current row.
        if table.args.get("within") is not None:
            raise JobError(f"{join.where}: {join.at(table)}give WITHIN or OVER windows, not both")
        before = windows.get(join.seen[0], 0) if len(join.seen) == 1 else 0
        item["between"] = [_duration_text(-windows.get(name, 0)), _duration_text(before)]
        if item.get("type") in ("left", "right", "full"):
            # SQLstream emits a padded row once the stream clock passes its rowtime (its LEFT
            # listing's `05:03:15 NULL 1000 NULL`): eager; ksqlDB's WITHIN keeps final emission.
            item["emit"] = "eager"
    within = table.args.get("within")
    if within is not None:
        spans = [join.duration(span) for span in within.expressions]
        if len(spans) == 1:
            item["within"] = spans[0]
        elif len(spans) == 2:  # ksqlDB: WITHIN (before, after) the left row
            item["between"] = [f"-{spans[0]}", spans[1]]
        else:
            raise JobError(f"{join.where}: {join.at(table)}WITHIN takes one duration or two, (before, after)")


def _sql_terms(join: family.SqlJoin, terms: list[exp.Expr]) -> list[exp.Expr]:
    """Flink's and RisingWave's interval conditions on the two streams' time columns, as the
    join's bounds (`between`), when it joins a stream to the one stream before it and has no
    WITHIN; the other terms are returned."""
    streams_before = [s for s in join.seen if join.sources[s]["kind"] == "stream"]
    # An ASOF join's inequality picks the nearest row, it bounds no interval: the job checks say
    # what an ASOF join of two streams needs (a table), as they do for YAML.
    interval = "within" not in join.item and not join.item.get("asof")
    if join.sources[join.name]["kind"] != "stream" or len(streams_before) != 1 or not interval:
        return terms
    streams = _Streams(streams_before[0], join.name, join.sources, join.aliases, join.where)
    bounds, rest = _interval_bounds(terms, streams)
    if bounds is not None:
        join.item["between"] = bounds
    return rest


@dataclass(frozen=True)
class _Streams:
    """The two streams an interval condition relates: `left` (joined before) and `right`."""

    left: str
    right: str
    sources: Mapping[str, Mapping[str, Any]]
    aliases: Mapping[str, str]
    where: str

    def linear(self, node: exp.Expr) -> tuple[str, int] | None:
        """`s.t`, `s.t + INTERVAL ...`, `s.t - INTERVAL ...` of a stream's time column: (s, offset)."""
        node = node.unnest()
        if isinstance(node, exp.Column):
            if node.table:
                owner = self.aliases.get(node.table)
            else:  # a bare name (Flink's `ltime = rtime`): the one of the two whose time column it is
                owners = [s for s in (self.left, self.right) if self.sources[s].get("time") == node.name]
                owner = owners[0] if len(owners) == 1 else None
            return (owner, 0) if owner and self.sources[owner].get("time") == node.name else None
        if isinstance(node, exp.Add | exp.Sub):
            base, span = self.linear(node.this), interval_micros(node.expression)
            if isinstance(node, exp.Add) and base is None:
                base, span = self.linear(node.expression), interval_micros(node.this)
            if base is not None and span is not None:
                return base[0], base[1] + (span if isinstance(node, exp.Add) else -span)
        return None

    def bound(self, x: exp.Expr, op: str, y: exp.Expr) -> list[tuple[str, int]] | None:
        """What `x op y` says of right.time - left.time: [(lower or upper, micros)], None: nothing."""
        a, b = self.linear(x), self.linear(y)
        if a is None or b is None:
            return None
        if (a[0], b[0]) == (self.right, self.left):  # r.t + ka op l.t + kb: d op kb - ka
            c = b[1] - a[1]
        elif (a[0], b[0]) == (self.left, self.right):  # l.t + ka op r.t + kb: d op' ka - kb
            c, op = a[1] - b[1], _MIRRORED[op]
        else:
            return None
        return {
            ">=": [("lower", c)],
            ">": [("lower", c + 1)],
            "<=": [("upper", c)],
            "<": [("upper", c - 1)],
            "=": [("lower", c), ("upper", c)],
        }[op]

    def limits(self, term: exp.Expr) -> list[tuple[str, int]] | None:
        """The bounds one term of the condition gives, None when it gives none."""
        if isinstance(term, exp.Between):
            low = self.bound(term.this, ">=", term.args["low"])
            high = self.bound(term.this, "<=", term.args["high"])
            return None if low is None or high is None else low + high
        op = _BOUNDS.get(type(term))
        return None if op is None else self.bound(term.this, op, term.expression)


_BOUNDS: dict[type[exp.Expr], str] = {exp.GTE: ">=", exp.GT: ">", exp.LTE: "<=", exp.LT: "<", exp.EQ: "="}
_MIRRORED = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "=": "="}


def _interval_bounds(terms: list[exp.Expr], streams: _Streams) -> tuple[list[str] | None, list[exp.Expr]]:
    """Bounds of right.time - left.time from the terms comparing the two streams' time columns
    (`l.t BETWEEN r.t - INTERVAL '4' HOUR AND r.t`, `l.t >= r.t AND l.t < r.t + INTERVAL '10'
    MINUTE`, `l.t = r.t`), as `between`; None and the terms unchanged when none does. A strict
    comparison bounds one microsecond inside (the bounds include their ends)."""
    found: dict[str, list[int]] = {"lower": [], "upper": []}
    rest = []
    for term in terms:
        limits = streams.limits(term)
        if limits is None:
            rest.append(term)
            continue
        for side, micros in limits:
            found[side].append(micros)
    if not found["lower"] and not found["upper"]:
        return None, terms
    if not found["lower"] or not found["upper"]:
        raise JobError(
            f"{streams.where}: the time condition of the join with {streams.right!r} bounds it on one side only; "
            f"an interval join needs both, e.g. {streams.left}.t BETWEEN {streams.right}.t - INTERVAL '4' HOUR "
            f"AND {streams.right}.t"
        )
    return [_duration_text(max(found["lower"])), _duration_text(min(found["upper"]))], rest


def _duration_text(micros: int) -> str:
    return format_duration(timedelta(microseconds=micros))


# ---------------------------------------------------------------------------- explain and warnings


def _explain(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    """An interval link's bounds, grace and state, and (after a first link) its left side."""
    j = join.link(IntervalLink)
    if j.bounds is None:
        return []
    span = j.bounds.upper - j.bounds.lower
    lines = [
        f"     time bounds: {j.bounds.describe()} (right.time - left.time in "
        f"[{format_duration(j.bounds.lower)}, {format_duration(j.bounds.upper)}]), grace {format_duration(j.grace)}, emit {j.emit}",
        f"     live state: rows newer than the watermark minus {format_duration(span)}, i.e. "
        f"about ({format_duration(span)} + grace {format_duration(j.grace)}) x input rate per side",
    ]
    if step > 1:
        lines.append(
            f"     left side: the rows join {step - 1} emits ({' + '.join(join.left)}), each at the commit "
            "where it became known; lateness and closing by the whole job's clock"
        )
    return lines


def _explain_json(join: BoundJoin) -> dict[str, Any]:
    j = join.link(IntervalLink)
    bounds = None if j.bounds is None else [j.bounds.lower.total_seconds(), j.bounds.upper.total_seconds()]
    return {"bounds_s": bounds, "emit": j.emit}


def chain_grace_warnings(plan: Plan) -> list[str]:
    """Interval links after an interval link whose grace is shorter than the one before needs
    (docs/semantics.md, "Chains after a stream-stream join"): a pair comes out when its later row
    arrives, on time by the grace before; a padded row when the clock passes its window's end plus
    that grace, up to `upper` (left rows) or `-lower` (right rows) after its own time."""
    warnings = []
    for step, (first, then) in enumerate(zip(plan.joins, plan.joins[1:], strict=False), 2):
        if first.family != LinkKind.INTERVAL or then.family != LinkKind.INTERVAL:
            continue
        before, join = first.link(IntervalLink), then.link(IntervalLink)
        bounds = before.bounds
        assert bounds is not None  # every interval join has its bounds (spec validation)
        widest = timedelta(0)
        if before.type in ("left", "full"):
            widest = max(widest, bounds.upper)
        if before.type in ("right", "full"):
            widest = max(widest, -bounds.lower)
        needed = before.grace + widest
        if join.grace < needed:
            warnings.append(
                f"join {step} ({join.type.upper()} JOIN {then.right}): grace is {format_duration(join.grace)}, "
                f"but the rows join {step - 1} emits can come out up to {format_duration(needed)} behind the newest "
                f"event time (its grace {format_duration(before.grace)}"
                + (f" plus {format_duration(widest)} for its padded rows" if widest else "")
                + f"): those would be late here. Set join {step}'s grace to at least {format_duration(needed)}"
            )
    return warnings


family.register(
    family.Family(
        name="interval",
        links=(IntervalLink,),
        claims=(family.Claim(30, _claim_bounds), family.Claim(60, _claim_streams)),
        keys=("within", "between", "emit"),
        settings=_settings,
        sql=family.SqlSyntax(query=_sql_query, join=_sql_join, terms=_sql_terms),
        warnings=chain_grace_warnings,
        graced=family.sides,
        explain=_explain,
        explain_json=_explain_json,
        json_keys=("bounds_s", "emit"),
        operator="streamjoin.joins.interval.step:IntervalJoin.build",
    )
)
