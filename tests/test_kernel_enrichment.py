"""The enrichment joins' decisions at the kernel's level, against the plain-Python reference.

Event-time temporal join with a changelog or a table updated in place (out-of-order and late
versions, tombstones and deletes, NULL keys and times; exact and complete mode), ASOF join with a
table updated in place (upserts, updates, deletes; with and without a clock skew that keeps the
newest rows open; rows of equal time that tie), and ASOF over the table's history (nearest
preceding and following, on the temporal join's histories). tests/kernel_harness.py
lays `STACK` generated examples end to end as one history; each Hypothesis example decides it with
one replay step, replays it in three slices that must add up to the whole, and runs it as live
micro-batches cut at random commits.
"""

from __future__ import annotations

import os
import re

import pytest
from harness import create_tables, enrichment_job
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_harness import (
    SETTINGS,
    at_random,
    check_live,
    check_replay,
    cuts,
    lay_end_to_end,
    slices,
)
from reference import asof_reference, history_asof_reference, temporal_reference

from streamjoin.errors import JobError
from streamjoin.plan import bind

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_EXAMPLES", "1"))  # histories of STACK examples
STACK = 60


@pytest.fixture(scope="module")
def paths(spark, tmp_path_factory):
    """Two empty source tables: the plan binds against their schemas; no row is ever written."""
    root = tmp_path_factory.mktemp("kernel_enrichment")
    return root, create_tables(spark, root)


# ---------------------------------------------------------------------------- examples


@st.composite
def temporal_commits(draw, in_place: bool):
    """Commits (side, rows) of a stream and a versioned table: stream rows (id, key, seconds |
    None, v); table rows (id, key, seconds | None, v, change type), one change per key and commit
    (their order would otherwise be the content's). A changelog's tombstone has id and v None and
    its own time; a table updated in place inserts, updates (post-image) and deletes (the change
    feed brings the deleted row, its time too)."""
    commits, n, present = [], 0, {}
    for c in range(draw(st.integers(1, 6))):
        side = draw(st.sampled_from((0, 1, 1)))
        rows, keys = [], set()
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            key = draw(st.sampled_from(("a", "b", "c", "a", None) if side == 0 else ("a", "b", "c", None)))
            t = None if draw(st.integers(0, 12)) == 0 else 3 * c + draw(st.integers(-6, 5))
            if side == 0:
                rows.append((f"l{n}", key, t, draw(st.integers(0, 2))))
                continue
            if key in keys:
                continue
            keys.add(key)
            tombstone = draw(st.integers(0, 4)) == 0
            if not in_place:
                rows.append((None, key, t, None, "insert") if tombstone else (f"r{n}", key, t, 0, "insert"))
            elif tombstone and key in present:
                rows.append((*present.pop(key), "delete"))
            elif not tombstone:
                change = "update_postimage" if key in present else "insert"
                if key is not None:
                    present[key] = (f"r{n}", key, t, 0)
                rows.append((f"r{n}", key, t, 0, change))
        commits.append((side, rows))
    return commits


@st.composite
def asof_commits(draw, ties: bool):
    """Commits (side, rows) of a stream and a table changed in place: stream rows (id, key,
    seconds | None, v); table rows (id, key, seconds, v, change type): inserts, update post-images
    of present keys, and single deletes (with the deleted row). The table's primary key is (key,
    time), or with `ties` (key, id) over a few ids and coarse times, so that rows of one key tie
    across commits (inside one commit their order would be the content's)."""
    commits, n, present = [], 0, {}
    for c in range(draw(st.integers(1, 6))):
        side = draw(st.sampled_from((0, 1)))
        if side == 1 and present and draw(st.integers(0, 3)) == 0:
            victim = draw(st.sampled_from(sorted(present)))
            commits.append((1, [(*present.pop(victim), "delete")]))
            continue
        rows, keys = [], set()
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            key = draw(st.sampled_from(("a", "b", "a", None) if side == 0 else ("a", "b")))
            if side == 0:
                t = None if draw(st.integers(0, 12)) == 0 else 3 * c + draw(st.integers(-6, 5))
                rows.append((f"l{n}", key, t, draw(st.integers(0, 2))))
                continue
            row_id = draw(st.sampled_from(("x", "y", "z"))) if ties else f"r{n}"
            t = 3 * c + draw(st.sampled_from((-3, 0)) if ties else st.integers(-6, 5))
            primary = (key, row_id) if ties else (key, t)
            if primary not in keys and (key, t) not in keys:  # no tie inside one commit
                keys |= {primary, (key, t)}
                change = "update_postimage" if primary in present else "insert"
                present[primary] = (row_id, key, t, 0)
                rows.append((*present[primary], change))
        commits.append((side, rows))
    return commits


# ---------------------------------------------------------------------------- event-time temporal


def temporal_plan(spark, paths, how: str, grace: int, in_place: bool):
    # max_future: none, since the examples' event times are shifted away from their commit times
    table = {"key": ["k"], "time": "t", "changelog": not in_place, "max_future": "none"}
    return bind(
        spark,
        enrichment_job(*paths, how, table, {"on": "l.k = r.k", "as_of": "event_time", "grace": f"{grace}s"}),
    )


@st.composite
def temporal_cases(draw):
    """(join type, grace, in place, a history of STACK examples laid end to end)."""
    how = draw(st.sampled_from(("left", "inner")), label="join type")
    grace = draw(st.sampled_from((0, 2, 5)), label="grace")
    in_place = draw(st.booleans(), label="table updated in place")
    examples = draw(st.lists(temporal_commits(in_place), min_size=STACK, max_size=STACK))
    return how, grace, in_place, lay_end_to_end(examples, "k")


@pytest.mark.parametrize("mode", ["exact", "complete"])
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_temporal_replay_and_slices_decide_as_the_reference(spark, paths, mode, data):
    how, grace, in_place, laid = data.draw(at_random(temporal_cases()))
    closed = data.draw(st.booleans(), label="closed input")
    plan = temporal_plan(spark, paths, how, grace, in_place)
    output, stream, table = temporal_reference(laid.stream, laid.table, grace, how, mode, in_place, closed)
    check_replay(spark, plan, laid, mode, slices(data.draw, STACK), output, stream, {1: table}, final=closed)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_temporal_live_batches_decide_as_the_reference(spark, paths, data):
    how, grace, in_place, laid = data.draw(at_random(temporal_cases()))
    plan = temporal_plan(spark, paths, how, grace, in_place)
    output, stream, table = temporal_reference(laid.stream, laid.table, grace, how, in_place=in_place)
    check_live(spark, plan, laid, data.draw(cuts(laid), label="cuts"), output, stream, {1: table})


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ({"as_of": "l.v"}, "as_of l.v is a column of type int, not a time; name a timestamp column of l or its time column l.t"),
        ({"as_of": "l.shown"}, "as_of l.shown names no column of l; its columns are id, k, t, v"),
        ({"as_of": "r.t"}, "as_of r.t cannot be honoured: 'r' is the table this link looks up"),
        ({"as_of": "x.t"}, "as_of x.t cannot be honoured: no source is named 'x'. Name a time column of a stream joined before it (l.t)"),
        ({"as_of": "l.t + 1"}, "as_of is 'l.t + 1'; write 'arrival'"),
        ({"as_of": "l.t", "asof": True, "on": "l.k = r.k AND r.t <= l.t"}, "an ASOF join picks its row by its inequality"),
    ],
)  # fmt: skip
def test_as_of_a_column_that_cannot_be_honoured_is_refused(spark, paths, join, message):
    """`as_of: <source>.<column>` takes a time column of a stream before the link; anything else is
    refused before any data moves, saying what to name instead."""
    table = {"key": ["k"], "time": "t", "changelog": True}
    with pytest.raises(JobError, match=re.escape(message)):
        bind(spark, enrichment_job(*paths, "left", table, {"on": "l.k = r.k", **join}))


def test_as_of_the_streams_own_time_column_is_its_event_time(spark, paths):
    """`as_of: l.T` (any letter case) names l's declared time: the row's own event time, as
    `event_time` (the plan binds no other time)."""
    table = {"key": ["k"], "time": "t", "changelog": True}
    plan = bind(spark, enrichment_job(*paths, "left", table, {"on": "l.k = r.k", "as_of": "l.T"}))
    assert (plan.joins[0].family, plan.joins[0].named_time) == ("temporal", None)


def test_columns_in_another_letter_case_bind_to_the_tables_spelling(spark, paths):
    """`on: l.K = r.K` and `using: [K]` over columns spelt `k`: Spark resolves names without regard
    to letter case, so the join binds them as the tables spell them (the kernel looks keys up by
    those names)."""
    for condition in ({"on": "l.K = r.K"}, {"using": ["K"]}):
        plan = bind(spark, enrichment_job(*paths, "left", {"key": ["k"]}, condition))
        assert plan.joins[0].equi == (("l.k", "r.k"),), condition


# ---------------------------------------------------------------------------- ASOF


def asof_plan(spark, paths, how: str, skew: int, ties: bool):
    table = {"key": ["k", "id"] if ties else ["k", "t"], "clock_skew": f"{skew}s"}
    return bind(spark, enrichment_job(*paths, how, table, {"on": "l.k = r.k AND r.t <= l.t", "asof": True}))


@st.composite
def asof_cases(draw):
    """(join type, clock skew in seconds, ties, a history of STACK examples laid end to end)."""
    how = draw(st.sampled_from(("left", "inner")), label="join type")
    skew = draw(st.sampled_from((0, 3, 3600)), label="clock skew (seconds)")
    ties = draw(st.booleans(), label="table keyed by (key, id): equal times tie")
    examples = draw(st.lists(asof_commits(ties), min_size=STACK, max_size=STACK))
    return how, skew, ties, lay_end_to_end(examples, "k,id" if ties else "k,t")


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_asof_replay_and_slices_decide_as_the_reference(spark, paths, data):
    how, skew, ties, laid = data.draw(at_random(asof_cases()))
    plan = asof_plan(spark, paths, how, skew, ties)
    expected = asof_reference(laid.stream, laid.table, how, skew * 1_000_000)
    check_replay(spark, plan, laid, "exact", slices(data.draw, STACK), *expected)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_asof_live_batches_decide_as_the_reference(spark, paths, data):
    how, skew, ties, laid = data.draw(at_random(asof_cases()))
    plan = asof_plan(spark, paths, how, skew, ties)
    expected = asof_reference(laid.stream, laid.table, how, skew * 1_000_000)
    check_live(spark, plan, laid, data.draw(cuts(laid), label="cuts"), *expected)


# ---------------------------------------------------------------------------- ASOF over the history


def history_asof_plan(spark, paths, how: str, grace: int, in_place: bool, following: bool):
    table = {"key": ["k"], "time": "t", "changelog": not in_place, "max_future": "none"}
    on = "l.k = r.k AND " + ("r.t >= l.t" if following else "r.t <= l.t")
    join = {"on": on, "asof": True, "as_of": "event_time", "grace": f"{grace}s"}
    return bind(spark, enrichment_job(*paths, how, table, join))


@pytest.mark.parametrize("mode", ["exact", "complete"])
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_history_asof_replay_and_slices_decide_as_the_reference(spark, paths, mode, data):
    how, grace, in_place, laid = data.draw(at_random(temporal_cases()))
    following = data.draw(st.booleans(), label="nearest following")
    closed = data.draw(st.booleans(), label="closed input")
    plan = history_asof_plan(spark, paths, how, grace, in_place, following)
    output, stream, table = history_asof_reference(
        laid.stream, laid.table, grace, how, following, mode, in_place, closed
    )
    check_replay(spark, plan, laid, mode, slices(data.draw, STACK), output, stream, {1: table}, final=closed)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_history_asof_live_batches_decide_as_the_reference(spark, paths, data):
    """A nearest following row is known only after the lookup: rows held back then stay in the
    state and are answered in a later batch, as the reference answers them at once."""
    how, grace, in_place, laid = data.draw(at_random(temporal_cases()))
    following = data.draw(st.booleans(), label="nearest following")
    plan = history_asof_plan(spark, paths, how, grace, in_place, following)
    output, stream, table = history_asof_reference(
        laid.stream, laid.table, grace, how, following, in_place=in_place
    )
    check_live(spark, plan, laid, data.draw(cuts(laid), label="cuts"), output, stream, {1: table})
