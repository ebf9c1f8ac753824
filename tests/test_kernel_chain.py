"""Chains of enrichment joins at the kernel's level, against tests/reference.py's `chain_reference`.

A stream l enriched by an event-time temporal changelog r (out-of-order, late and NULL versions,
tombstones), then by a table s updated in place as the row saw it on arrival (inserts, updates,
deletes, a clock skew that keeps the newest rows open), ON l.k = s.k or ON r.k = s.k (a condition
on the first link's columns, NULL when that link padded); each link INNER or LEFT. Examples are
laid end to end (tests/kernel_harness.py); each Hypothesis example replays the history whole, in
three slices that must add up to it and together, and as live micro-batches cut at random commits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from harness import SCHEMA, create_tables
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_harness import (
    BAND,
    SETTINGS,
    Laid,
    at_random,
    check_live,
    check_replay,
    cuts,
    lay_end_to_end,
    slices,
    stream_commit,
    table_commit,
)
from reference import arrival_table, by_stream_key, chain_reference, temporal_table

from streamjoin.plan import Plan, bind
from streamjoin.spec import spec_from_dict

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_EXAMPLES", "1"))  # histories of STACK examples
STACK = 60


@pytest.fixture(scope="module")
def paths(spark, tmp_path_factory):
    """Three empty source tables (l, r, s): the plan binds against their schemas."""
    root = tmp_path_factory.mktemp("kernel_chain")
    paths = create_tables(spark, root)
    paths[2] = f"{root}/s"
    spark.createDataFrame([], SCHEMA).write.format("delta").save(paths[2])
    return root, paths


@dataclass(frozen=True)
class Case:
    first: str  # join type of l JOIN r
    second: str  # join type of ... JOIN s
    grace: int  # r's grace, seconds
    skew: int  # s's clock skew, seconds
    through_r: bool  # s joins ON r.k = s.k, else ON l.k = s.k
    laid: Laid


@st.composite
def chain_commits(draw):
    """Commits (side, rows) of a stream (side 0: id, key, seconds | None, v), a changelog r
    (side 1: id, key, seconds | None, v, change type; a tombstone has id and v None), and a table s
    updated in place (side 2: inserts, update post-images, deletes with the deleted row); one
    change per key and commit."""
    commits, n, present = [], 0, {}
    for c in range(draw(st.integers(1, 6))):
        side = draw(st.sampled_from((0, 0, 1, 2)))
        if side:
            commit, n = table_commit(draw, side, c, n, "rs"[side - 1], side == 1, present, ("a", "b", "c"))
        else:
            commit, n = stream_commit(draw, side, c, n, "l", ("a", "b", "c", "a", None))
        commits.append(commit)
    return commits


@st.composite
def chain_cases(draw) -> Case:
    return Case(
        first=draw(st.sampled_from(("left", "inner")), label="l JOIN r"),
        second=draw(st.sampled_from(("left", "inner")), label="JOIN s"),
        grace=draw(st.sampled_from((0, 2, 5)), label="grace"),
        skew=draw(st.sampled_from((0, 3, 3600)), label="s's clock skew (seconds)"),
        through_r=draw(st.booleans(), label="ON r.k = s.k"),
        laid=lay_end_to_end(draw(st.lists(chain_commits(), min_size=STACK, max_size=STACK)), "k", tables=2),
    )


def chain_plan(spark, paths, case: Case) -> Plan:
    root, p = paths
    return bind(
        spark,
        spec_from_dict(
            {
                "name": "chain",
                "sources": {
                    "l": {"path": p[0], "time": "t"},
                    # max_future: none, since the examples' event times lie apart from their commit times
                    "r": {
                        "path": p[1],
                        "kind": "table",
                        "key": ["k"],
                        "time": "t",
                        "changelog": True,
                        "max_future": "none",
                    },
                    "s": {"path": p[2], "kind": "table", "key": ["k"], "clock_skew": f"{case.skew}s"},
                },
                "from": "l",
                "joins": [
                    {
                        "join": "r",
                        "type": case.first,
                        "on": "l.k = r.k",
                        "as_of": "event_time",
                        "grace": f"{case.grace}s",
                    },
                    {"join": "s", "type": case.second, "on": "r.k = s.k" if case.through_r else "l.k = s.k"},
                ],
                "select": ["l.id AS lid", "r.id AS rid", "s.id AS sid"],
                "output": {"path": f"{root}/out"},
            }
        ),
    )


def expected(case: Case, mode: str = "exact", closed: bool = False):
    """(output, stream counts, each table's counts by side, counts per link) as the reference decides them."""
    r_counts, temporal = temporal_table(case.laid.tables[1], case.grace, mode)
    on_arrival = arrival_table(case.laid.tables[2], case.laid.stream, case.skew * 1_000_000)

    def through_r(e, matches):
        return None if matches[0] is None else matches[0].key[0]

    output, stream, links = chain_reference(
        case.laid.stream,
        [
            (case.first, temporal, by_stream_key),
            (case.second, on_arrival, through_r if case.through_r else by_stream_key),
        ],
        closed,
    )
    changes = len(case.laid.tables[2])
    s_counts = {"rows_in": changes, "rejected": 0, "late": 0, "applied": changes}
    return output, stream, {1: r_counts, 2: s_counts}, links


@pytest.mark.parametrize("mode", ["exact", "complete"])
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_chain_replay_and_slices_decide_as_the_reference(spark, paths, mode, data):
    case = data.draw(at_random(chain_cases()))
    closed = data.draw(st.booleans(), label="closed input")
    output, stream, tables, links = expected(case, mode, closed)
    check_replay(
        spark,
        chain_plan(spark, paths, case),
        case.laid,
        mode,
        slices(data.draw, STACK),
        output,
        stream,
        tables,
        final=closed,
    )


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_chain_live_batches_decide_as_the_reference(spark, paths, data):
    case = data.draw(at_random(chain_cases()))
    check_live(
        spark,
        chain_plan(spark, paths, case),
        case.laid,
        data.draw(cuts(case.laid), label="cuts"),
        *expected(case),
    )


@pytest.mark.parametrize("waits_for", ["s", "r"])
def test_a_row_waits_for_every_link(spark, paths, waits_for):
    """A row one link has decided waits for the other: r's watermark is past it but s (a clock
    skew of an hour) has not committed since it arrived, or the other way round. Drawn histories
    rarely end this way (only the last example's rows can be open)."""
    ahead = [(1, [("r1", "a", 0, 0, "insert")]), (1, [("r2", "b", 20, 0, "insert")])]
    if waits_for == "s":  # r decides the row (5 < 20 - grace); s has nothing after it
        history = [*ahead, (2, [("s1", "a", 0, 0, "insert")]), (0, [("l1", "a", 5, 0)])]
    else:  # s decides the row (it commits after it); r's watermark is still below it
        history = [
            (1, [("r1", "a", 0, 0, "insert")]),
            (0, [("l1", "a", 5, 0)]),
            (2, [("s1", "a", 0, 0, "insert")]),
        ]
    case = Case("left", "left", 2, 3600, False, lay_end_to_end([history], "k", tables=2))
    output, stream, tables, links = expected(case)
    assert stream["open"] == 1 and not output  # the reference agrees that it waits
    plan = chain_plan(spark, paths, case)
    check_replay(spark, plan, case.laid, "exact", [(-BAND, BAND)], output, stream, tables, links)
    check_live(spark, plan, case.laid, [len(history) - 1], output, stream, tables, links)
