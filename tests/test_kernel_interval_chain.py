"""Chains after a stream-stream join at the kernel's level, against tests/reference.py's
`interval_chain_reference`.

Streams l and r joined ON l.k = r.k in drawn bounds (INNER, LEFT, RIGHT, FULL; final or eager
emission), then each emitted row looked up in a table s, ON l.k = s.k or ON r.k = s.k (NULL when
that side was padded), INNER or LEFT: either s updated in place, as the row saw it at its emission
(a clock skew that keeps the newest rows waiting), or an event-time temporal changelog (out of
order, late and NULL versions, tombstones) at the row's output time, or at l's or r's own time
(`as_of: l.t`, Flink's named time attribute; none where that side was padded). The emitted rows
carry the position at which they became known (a pair at its later row, a padded row where the clock closed
its window), so each Hypothesis example checks the whole history replayed, three slices that add up
to it, the middle one alone equal to its part, and live micro-batches cut at random commits,
against the reference.

The same for three streams in turn (l JOIN r WITHIN, then JOIN c WITHIN), and for ksqlDB's
`FROM l JOIN s JOIN c WITHIN ...` with s a table: l's rows looked up in s, then joined with c.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import pytest
from harness import SCHEMA, create_tables
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_harness import (
    SETTINGS,
    Decided,
    Laid,
    at_random,
    buckets,
    cuts,
    enrichment_live,
    enrichment_replay,
    first_difference,
    lay_end_to_end,
    slices,
    stream_commit,
    table_commit,
)
from reference import (
    LINK_BUCKETS,
    arrival_table,
    enrichment_then_interval,
    interval_chain_of_three,
    interval_chain_reference,
    temporal_table,
)

from streamjoin.joins.interval import chain_grace_warnings
from streamjoin.plan import Plan, bind
from streamjoin.spec import spec_from_dict

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_EXAMPLES", "1"))  # histories of STACK examples
STACK = 45
LINK = (*LINK_BUCKETS, "open")
DECIDED = ("rows_in", "rejected", "late", "joined", "unmatched_emitted", "unmatched_dropped", "open")


@pytest.fixture(scope="module")
def paths(spark, tmp_path_factory):
    """Three empty source tables (l, r, s): the plan binds against their schemas."""
    root = tmp_path_factory.mktemp("kernel_interval_chain")
    paths = create_tables(spark, root)
    paths[2] = f"{root}/s"
    spark.createDataFrame([], SCHEMA).write.format("delta").save(paths[2])
    return root, paths


@dataclass(frozen=True)
class Case:
    first: str  # l JOIN r
    emit: str
    lo: int  # r.t - l.t in [lo, hi], seconds
    hi: int
    grace: int  # the interval join's, seconds
    second: str  # ... JOIN s
    on: str  # "l" or "r": JOIN s ON <on>.k = s.k
    temporal: bool  # s is an event-time temporal changelog (else a table updated in place, at arrival)
    table_grace: int  # s's grace (temporal), seconds
    skew: int  # s's clock skew (in place), seconds
    laid: Laid
    as_of: str | None = None  # temporal: s looked up at l's or r's time (as_of: l.t), else the output time


@st.composite
def histories(draw, temporal: bool):
    """Commits (side, rows) of streams l, r (sides 0, 1: id, key, seconds | None, v) and a table s
    (side 2): a changelog (id, key, seconds, 0, insert; a tombstone's id is None) or a table updated
    in place (inserts, update post-images, deletes)."""
    commits, n, present = [], 0, {}
    for c in range(draw(st.integers(1, 7))):
        side = draw(st.sampled_from((0, 1, 0, 1, 2)))
        if side == 2:
            commit, n = table_commit(draw, side, c, n, "s", temporal, present, ("a", "b"))
        else:
            commit, n = stream_commit(draw, side, c, n, "lr"[side], ("a", "b", "a", None))
        commits.append(commit)
    return commits


@st.composite
def chain_cases(draw, named: str | None = None) -> Case:
    """A chain drawn at random; with `named` ("l" or "r"), s temporal, looked up at that side's time."""
    emit = draw(st.sampled_from(("final", "eager")), label="emit")
    lo = draw(st.integers(-6, 2), label="lo")
    temporal = bool(named) or draw(st.booleans(), label="s temporal")
    return Case(
        first=draw(st.sampled_from(("inner", "left", "right", "full")), label="l JOIN r"),
        emit=emit,
        lo=lo,
        hi=draw(st.integers(lo, lo + 6), label="hi"),
        grace=draw(st.sampled_from((0, 2, 5)), label="grace"),
        second=draw(st.sampled_from(("left", "inner")), label="JOIN s"),
        on=draw(st.sampled_from(("l", "r")), label="ON <side>.k = s.k"),
        temporal=temporal,
        table_grace=draw(st.sampled_from((0, 3)), label="s's grace"),
        skew=draw(st.sampled_from((0, 3, 3600)), label="s's clock skew (seconds)"),
        laid=lay_end_to_end(
            draw(st.lists(histories(temporal), min_size=STACK, max_size=STACK)), "k", tables=1, streams=2
        ),
        as_of=named
        or (draw(st.sampled_from((None, "l", "r")), label="as_of: <side>.t") if temporal else None),
    )


def chain_plan(spark, paths, case: Case) -> Plan:
    root, p = paths
    s = (
        {"path": p[2], "kind": "table", "key": ["k"], "time": "t", "changelog": True, "max_future": "none"}
        if case.temporal
        else {"path": p[2], "kind": "table", "key": ["k"], "clock_skew": f"{case.skew}s"}
    )
    at = f"{case.as_of}.t" if case.as_of else "event_time"
    lookup = {"as_of": at, "grace": f"{case.table_grace}s"} if case.temporal else {}
    return bind(
        spark,
        spec_from_dict(
            {
                "name": "interval_chain",
                # max_future: none, since the examples' event times lie apart from their commit times
                "sources": {
                    "l": {"path": p[0], "time": "t", "max_future": "none"},
                    "r": {"path": p[1], "time": "t", "max_future": "none"},
                    "s": s,
                },
                "from": "l",
                "joins": [
                    {
                        "join": "r",
                        "type": case.first,
                        "on": "l.k = r.k",
                        "between": [f"{case.lo}s", f"{case.hi}s"],
                        "grace": f"{case.grace}s",
                        "emit": case.emit,
                    },
                    {"join": "s", "type": case.second, "on": f"{case.on}.k = s.k", **lookup},
                ],
                "select": ["l.id AS lid", "r.id AS rid", "s.id AS sid"],
                "output": {"path": f"{root}/out"},
            }
        ),
    )


def expected(case: Case, mode: str = "exact", closed: bool = False):
    """(output, counts per stream side, counts per link) as the reference decides them."""
    laid = case.laid
    if case.temporal:
        _, lookup = temporal_table(laid.tables[2], case.table_grace, mode)
    else:
        lookup = arrival_table(laid.tables[2], laid.stream, case.skew * 1_000_000)
    interval = {
        "lo": case.lo,
        "hi": case.hi,
        "grace": case.grace,
        "how": case.first,
        "mode": mode,
        "emit": case.emit,
    }
    return interval_chain_reference(
        laid.stream, interval, [(case.second, lookup, lambda e, m: e.key)], case.on, closed, case.as_of
    )


def check(decided: Decided, case: Case, mode: str, closed: bool, live: bool = False) -> None:
    output, sides, links = expected(case, mode, closed)
    assert decided.output == output, first_difference(decided.output, output)
    kept = DECIDED + (("unsettled",) if live else ())
    for side in (0, 1):
        assert buckets(decided.sources[side], kept) == buckets(sides[side], kept), side
    assert [{b: decided.links[(n, b)] for b in LINK} for n in range(2)] == links


def add_up(parts: list[Decided], whole: Decided) -> None:
    """Slices decided together write and count, summed, what one slice over all of them does."""
    summed = Decided(sum((p.output for p in parts), start=type(whole.output)()))
    for part in parts:
        for side, counts in part.sources.items():
            summed.sources[side].update(counts)
        summed.links.update(part.links)
    assert summed.output == whole.output, first_difference(summed.output, whole.output)
    assert summed.sources == whole.sources and summed.links == whole.links


def replayed_in_slices(spark, plan: Plan, laid: Laid, mode: str, windows, closed: bool) -> Decided:
    """The history replayed as one slice over `windows` (returned, for the reference), then in
    those slices, which must add up to it, and the middle slice alone, which reads only its
    margins: it must equal its part (the margins add up along the chain)."""
    (whole,) = enrichment_replay(spark, plan, laid, mode, [(windows[0][0], windows[-1][1])], closed)
    parts = enrichment_replay(spark, plan, laid, mode, windows, closed)
    add_up(parts, whole)
    (alone,) = enrichment_replay(spark, plan, laid, mode, [windows[1]], closed)
    assert alone.output == parts[1].output, first_difference(alone.output, parts[1].output)
    assert alone.sources == parts[1].sources and alone.links == parts[1].links
    return whole


@pytest.mark.parametrize("mode", ["exact", "complete"])
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_interval_chain_replay_and_slices_decide_as_the_reference(spark, paths, mode, data):
    case = data.draw(at_random(chain_cases()))
    closed = data.draw(st.booleans(), label="closed input")
    plan = chain_plan(spark, paths, case)
    whole = replayed_in_slices(spark, plan, case.laid, mode, slices(data.draw, STACK), closed)
    check(whole, case, mode, closed)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_interval_chain_live_batches_decide_as_the_reference(spark, paths, data):
    case = data.draw(at_random(chain_cases()))
    plan = chain_plan(spark, paths, case)
    check(
        enrichment_live(spark, plan, case.laid, data.draw(cuts(case.laid), label="cuts")),
        case,
        "exact",
        False,
        live=True,
    )


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_a_table_looked_up_at_the_left_sides_time_decides_as_the_reference(spark, paths, data):
    """Flink's `FOR SYSTEM_TIME AS OF i.ts` after an interval join (`as_of: l.t`): each emitted
    row sees s's version at its left row's time, not at the pair's output time (the later of the
    two), in a replay (slices adding up) and in live batches alike. (The chains drawn above name
    l's or r's time at random too.)"""
    case = data.draw(at_random(chain_cases("l")))
    plan = chain_plan(spark, paths, case)
    assert (plan.joins[1].named_time.source, plan.joins[1].named_time.column) == ("l", "t")
    whole = replayed_in_slices(spark, plan, case.laid, "exact", slices(data.draw, STACK), False)
    check(whole, case, "exact", False)
    live = enrichment_live(spark, plan, case.laid, data.draw(cuts(case.laid), label="cuts"))
    check(live, case, "exact", False, live=True)


# ------------------------------------------------------------------ stream-stream-stream


@dataclass(frozen=True)
class ThreeWay:
    first: dict  # l JOIN r: how, lo, hi, grace, emit (seconds)
    second: dict  # ... JOIN c
    on: str  # "l" or "r": JOIN c ON <on>.k = c.k
    laid: Laid


@st.composite
def streams_of_three(draw):
    """Commits (side, rows) of streams l, r and c (sides 0, 1, 2): rows (id, key, seconds | None, v)."""
    commits, n = [], 0
    for c in range(draw(st.integers(1, 7))):
        side = draw(st.integers(0, 2))
        rows = []
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            key = draw(st.sampled_from(("a", "b", "a", None)))
            t = None if draw(st.integers(0, 12)) == 0 else 3 * c + draw(st.integers(-6, 5))
            rows.append((f"{'lrc'[side]}{n}", key, t, draw(st.integers(0, 2))))
        commits.append((side, rows))
    return commits


def link_of(draw, name: str) -> dict:
    lo = draw(st.integers(-6, 2), label=f"{name} lo")
    return {
        "how": draw(st.sampled_from(("inner", "left", "right", "full")), label=name),
        "lo": lo,
        "hi": draw(st.integers(lo, lo + 6), label=f"{name} hi"),
        "grace": draw(st.sampled_from((0, 2, 5, 12)), label=f"{name} grace"),
        "emit": draw(st.sampled_from(("final", "eager")), label=f"{name} emit"),
    }


@st.composite
def three_way_cases(draw) -> ThreeWay:
    return ThreeWay(
        first=link_of(draw, "l JOIN r"),
        second=link_of(draw, "JOIN c"),
        on=draw(st.sampled_from(("l", "r")), label="ON <side>.k = c.k"),
        laid=lay_end_to_end(
            draw(st.lists(streams_of_three(), min_size=STACK, max_size=STACK)), "k", tables=0, streams=3
        ),
    )


def three_way_plan(spark, paths, case: ThreeWay) -> Plan:
    root, p = paths

    def link(source: str, on: str, spec: dict) -> dict:
        return {
            "join": source,
            "type": spec["how"],
            "on": on,
            "between": [f"{spec['lo']}s", f"{spec['hi']}s"],
            "grace": f"{spec['grace']}s",
            "emit": spec["emit"],
        }

    return bind(
        spark,
        spec_from_dict(
            {
                "name": "three_way",
                "sources": {
                    name: {"path": p[side], "time": "t", "max_future": "none"}
                    for side, name in enumerate(("l", "r", "c"))
                },
                "from": "l",
                "joins": [
                    link("r", "l.k = r.k", case.first),
                    link("c", f"{case.on}.k = c.k", case.second),
                ],
                "select": ["l.id AS lid", "r.id AS rid", "c.id AS cid"],
                "output": {"path": f"{root}/out3"},
            }
        ),
    )


def check_three(decided: Decided, case: ThreeWay, mode: str, closed: bool, live: bool = False) -> None:
    first, second = ({**link, "mode": mode} for link in (case.first, case.second))
    output, sides, links = interval_chain_of_three(case.laid.stream, first, second, case.on, closed)
    assert decided.output == output, first_difference(decided.output, output)
    kept = DECIDED + (("unsettled",) if live else ())
    for side in (0, 1, 2):
        assert buckets(decided.sources[side], kept) == buckets(sides[side], kept), side
    assert [{b: decided.links[(n, b)] for b in LINK} for n in range(2)] == links


@pytest.fixture(scope="module")
def three_paths(spark, paths):
    """l, r and a third stream c (paths[2] is the table of the tests above: c has its own)."""
    root, p = paths
    c = f"{root}/c"
    spark.createDataFrame([], SCHEMA).write.format("delta").save(c)
    return root, {0: p[0], 1: p[1], 2: c}


@pytest.mark.parametrize("mode", ["exact", "complete"])
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_three_streams_replay_and_slices_decide_as_the_reference(spark, three_paths, mode, data):
    case = data.draw(at_random(three_way_cases()))
    closed = data.draw(st.booleans(), label="closed input")
    plan = three_way_plan(spark, three_paths, case)
    whole = replayed_in_slices(spark, plan, case.laid, mode, slices(data.draw, STACK), closed)
    check_three(whole, case, mode, closed)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_three_streams_live_batches_decide_as_the_reference(spark, three_paths, data):
    case = data.draw(at_random(three_way_cases()))
    plan = three_way_plan(spark, three_paths, case)
    cut = data.draw(cuts(case.laid), label="cuts")
    check_three(enrichment_live(spark, plan, case.laid, cut), case, "exact", False, live=True)


def test_a_second_stream_stream_link_warns_when_its_grace_lets_the_first_links_rows_be_late(
    spark, three_paths
):
    """Join 2 takes join 1's pairs (on time by join 1's grace) and its padded rows (out when the
    clock passes their window's end plus that grace): a shorter grace at join 2 is warned about."""
    base = {"how": "left", "lo": -4, "hi": 10, "grace": 5, "emit": "final"}
    laid = lay_end_to_end([], "k", tables=0, streams=3)
    short = three_way_plan(spark, three_paths, ThreeWay(base, {**base, "grace": 14}, "l", laid))
    assert chain_grace_warnings(short) == [
        "join 2 (LEFT JOIN c): grace is 14s, but the rows join 1 emits can come out up to 15s behind the "
        "newest event time (its grace 5s plus 10s for its padded rows): those would be late here. Set "
        "join 2's grace to at least 15s"
    ]
    assert not chain_grace_warnings(
        three_way_plan(spark, three_paths, ThreeWay(base, {**base, "grace": 15}, "l", laid))
    )
    right = {**base, "how": "right"}  # pads right rows: up to -lo = 4 s after their time
    assert not chain_grace_warnings(
        three_way_plan(spark, three_paths, ThreeWay(right, {**base, "grace": 9}, "l", laid))
    )
    assert chain_grace_warnings(
        three_way_plan(spark, three_paths, ThreeWay(right, {**base, "grace": 8}, "l", laid))
    )
    inner = {**base, "how": "inner"}  # pairs only: its own grace
    assert not chain_grace_warnings(three_way_plan(spark, three_paths, ThreeWay(inner, base, "l", laid)))


def test_a_slice_alone_reads_what_the_links_before_its_last_need(spark, three_paths):
    """l1 and r1 pair at 12 s, before the slice [15 s, ...); the pair meets c1 at 18 s, inside it.
    Replayed alone, the slice must still read l1 and r1 (join 2's margin on top of join 1's)."""
    link = {"how": "inner", "lo": 0, "hi": 8, "grace": 0, "emit": "final"}
    laid = lay_end_to_end(
        [
            [
                (0, [("l1", "a", 10, 0)]),
                (1, [("r1", "a", 12, 0)]),
                (2, [("c1", "a", 18, 0)]),
                (0, [("l2", "b", 40, 0)]),
                (1, [("r2", "b", 40, 0)]),
                (2, [("c2", "b", 40, 0)]),
            ]
        ],
        "k",
        tables=0,
        streams=3,
    )
    plan = three_way_plan(spark, three_paths, ThreeWay({**link, "hi": 5}, link, "l", laid))
    (alone,) = enrichment_replay(spark, plan, laid, "exact", [(15, 100)])
    assert alone.output == Counter({("0/l1", "0/r1", "0/c1", 18): 1})
    # Each input row is counted in the slice of its own time: c1 here, l1, r1 and their pair before it.
    assert alone.sources[2]["joined"] == 1 and alone.sources[0]["joined"] == alone.sources[1]["joined"] == 0
    assert [alone.links[(n, "matched")] for n in range(2)] == [0, 0]


# ------------------------------------------------------------------ a table link, then a stream


@dataclass(frozen=True)
class TableThenStream:
    first: str  # l JOIN s: inner | left
    temporal: bool  # s an event-time temporal changelog (else updated in place, looked up at arrival)
    table_grace: int  # s's grace (temporal), seconds
    skew: int  # s's clock skew (in place), seconds
    second: dict  # ... JOIN c ON l.k = c.k: how, lo, hi, grace (seconds); final emission
    laid: Laid


@st.composite
def table_then_stream_histories(draw, temporal: bool):
    """Commits of stream l (side 0), table s (side 1) and stream c (side 2), as `histories` draws them."""
    commits, n, present = [], 0, {}
    for c in range(draw(st.integers(1, 7))):
        side = draw(st.sampled_from((0, 2, 0, 2, 1)))
        if side == 1:
            commit, n = table_commit(draw, side, c, n, "s", temporal, present, ("a", "b"))
        else:
            commit, n = stream_commit(draw, side, c, n, "l" if side == 0 else "c", ("a", "b", "a", None))
        commits.append(commit)
    return commits


@st.composite
def table_then_stream_cases(draw) -> TableThenStream:
    temporal = draw(st.booleans(), label="s temporal")
    second = {**link_of(draw, "JOIN c"), "emit": "final"}
    return TableThenStream(
        first=draw(st.sampled_from(("inner", "left")), label="l JOIN s"),
        temporal=temporal,
        table_grace=draw(st.sampled_from((0, 3)), label="s's grace"),
        skew=draw(st.sampled_from((0, 3, 3600)), label="s's clock skew (seconds)"),
        second=second,
        laid=lay_end_to_end(
            draw(st.lists(table_then_stream_histories(temporal), min_size=STACK, max_size=STACK)),
            "k",
            kinds="sts",
        ),
    )


def table_then_stream_plan(spark, paths, case: TableThenStream) -> Plan:
    root, p = paths
    s = (
        {"path": p[1], "kind": "table", "key": ["k"], "time": "t", "changelog": True, "max_future": "none"}
        if case.temporal
        else {"path": p[1], "kind": "table", "key": ["k"], "clock_skew": f"{case.skew}s"}
    )
    lookup = {"as_of": "event_time", "grace": f"{case.table_grace}s"} if case.temporal else {}
    second = case.second
    return bind(
        spark,
        spec_from_dict(
            {
                "name": "table_then_stream",
                "sources": {
                    "l": {"path": p[0], "time": "t", "max_future": "none"},
                    "s": s,
                    "c": {"path": p[2], "time": "t", "max_future": "none"},
                },
                "from": "l",
                "joins": [
                    {"join": "s", "type": case.first, "on": "l.k = s.k", **lookup},
                    {
                        "join": "c",
                        "type": second["how"],
                        "on": "l.k = c.k",
                        "between": [f"{second['lo']}s", f"{second['hi']}s"],
                        "grace": f"{second['grace']}s",
                    },
                ],
                "select": ["l.id AS lid", "s.id AS sid", "c.id AS cid"],
                "output": {"path": f"{root}/out_tts"},
            }
        ),
    )


def check_table_then_stream(
    decided: Decided, case: TableThenStream, mode: str, closed: bool, live: bool = False
) -> None:
    laid = case.laid
    if case.temporal:
        _, lookup = temporal_table(laid.tables[1], case.table_grace, mode)
    else:
        lookup = arrival_table(laid.tables[1], laid.stream, case.skew * 1_000_000)
    second = {k: v for k, v in case.second.items() if k != "emit"} | {"mode": mode}
    output, sides, links = enrichment_then_interval(
        laid.stream, [(case.first, lookup, lambda e, m: e.key)], second, closed
    )
    assert decided.output == output, first_difference(decided.output, output)
    kept = DECIDED + (("unsettled",) if live else ())
    for side in (0, 2):
        assert buckets(decided.sources[side], kept) == buckets(sides[side], kept), side
    assert [{b: decided.links[(n, b)] for b in LINK} for n in range(2)] == links


@pytest.fixture(scope="module")
def table_then_stream_paths(spark, paths):
    """l, the table s (paths[2] of the tests above) and the stream c, in the job's order."""
    root, p = paths
    c = f"{root}/c2"
    spark.createDataFrame([], SCHEMA).write.format("delta").save(c)
    return root, {0: p[0], 1: p[2], 2: c}


@pytest.mark.parametrize("mode", ["exact", "complete"])
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_a_table_then_a_stream_replay_and_slices_decide_as_the_reference(
    spark, table_then_stream_paths, mode, data
):
    case = data.draw(at_random(table_then_stream_cases()))
    closed = data.draw(st.booleans(), label="closed input")
    plan = table_then_stream_plan(spark, table_then_stream_paths, case)
    whole = replayed_in_slices(spark, plan, case.laid, mode, slices(data.draw, STACK), closed)
    check_table_then_stream(whole, case, mode, closed)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_a_table_then_a_stream_live_batches_decide_as_the_reference(spark, table_then_stream_paths, data):
    case = data.draw(at_random(table_then_stream_cases()))
    plan = table_then_stream_plan(spark, table_then_stream_paths, case)
    cut = data.draw(cuts(case.laid), label="cuts")
    check_table_then_stream(enrichment_live(spark, plan, case.laid, cut), case, "exact", False, live=True)


def test_a_row_a_table_keeps_waiting_meets_its_partner_and_is_late_where_it_arrived(
    spark, table_then_stream_paths
):
    """FROM l JOIN s JOIN c WITHIN [0 s, 5 s], FULL, s updated in place with a long clock skew (a
    row waits for s's next commit). First history: l1 waits at s while c2 moves the clock far past
    c1's window; c1 must stay open for l1, which then meets it. Second: l9 arrives after c9 moved
    the clock to 30 s, so it is late at the stream-stream link, though s lets it through only in
    a later batch, where its own commit is long past."""
    laid = lay_end_to_end(
        [
            [
                (1, [("s1", "a", 0, 0, "insert")]),
                (0, [("l1", "a", 10, 0)]),
                (2, [("c1", "a", 12, 0)]),
                (2, [("c2", "b", 40, 0)]),
                (0, [("l2", "b", 41, 0)]),
                (1, [("s2", "b", 41, 0, "insert")]),
            ],
            [
                (1, [("s9", "a", 0, 0, "insert")]),
                (2, [("c9", "a", 30, 0)]),
                (0, [("l9", "a", 10, 0)]),
                (2, [("c10", "b", 31, 0)]),
                (1, [("s10", "b", 31, 0, "insert")]),
            ],
        ],
        "k",
        kinds="sts",
    )
    second = {"how": "full", "lo": 0, "hi": 5, "grace": 0, "emit": "final"}
    case = TableThenStream("left", False, 0, 3600, second, laid)
    plan = table_then_stream_plan(spark, table_then_stream_paths, case)
    for cut in ([3, 4, 9],):
        decided = enrichment_live(spark, plan, laid, cut)
        check_table_then_stream(decided, case, "exact", False, live=True)
        assert decided.output[("0/l1", "0/s1", "0/c1", 12)] == 1, cut
        assert not any(row[0] == "1/l9" for row in decided.output), cut  # late at join 2
    (replayed,) = enrichment_replay(spark, plan, laid, "exact", [(0, 200_000)], final=True)
    check_table_then_stream(replayed, case, "exact", True)


@pytest.mark.parametrize("mode", ["exact", "complete"])
def test_a_slice_replayed_alone_sees_the_enriched_partners_just_past_its_end(
    spark, table_then_stream_paths, mode
):
    """FROM l JOIN s JOIN c WITHIN [-4 s, 2 s], FULL: c1 (10 s) lies in the slice [5 s, 11 s) and
    its partner l1 (11 s) just past its end. Replayed alone, the slice reads l1 in its margin, and
    the table link must pass it on to the stream-stream link there: otherwise c1 is written
    padded, though the replay of the next slice writes it paired with l1."""
    laid = lay_end_to_end(
        [[(1, [("s1", "a", 0, 0, "insert")]), (2, [("c1", "a", 10, 0)]), (0, [("l1", "a", 11, 0)])]],
        "k",
        kinds="sts",
    )
    second = {"how": "full", "lo": -4, "hi": 2, "grace": 0, "emit": "final"}
    case = TableThenStream("left", False, 0, 0, second, laid)
    plan = table_then_stream_plan(spark, table_then_stream_paths, case)
    whole = replayed_in_slices(spark, plan, laid, mode, [(0, 5), (5, 11), (11, 200_000)], True)
    check_table_then_stream(whole, case, mode, True)
    assert whole.output == {("0/l1", "0/s1", "0/c1", 11): 1}
