"""The ROWS-window join's decisions at the kernel's level, against `reference.rows_reference`.

Arrival order per key, the windows of one or both streams, decisions at arrival or eviction, no
lateness: one kernel step over stacked scenarios (a replay, closed or not), slices, and the live
runner's `decide` over micro-batch cuts with the state each leaves.
"""

from __future__ import annotations

import os

import pytest
from harness import create_tables, job
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_harness import (
    PIVOT,
    SETTINGS,
    assert_slices_add_up,
    assert_step_as_expected,
    at_random,
    batches,
    laid_streams,
    live_steps,
    replay_step,
    stack,
)
from reference import BUCKETS, rows_reference
from test_kernel_interval import LAID, STACK, commits

from streamjoin.plan import bind

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_EXAMPLES", "2"))
LIVE_EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_LIVE_EXAMPLES", "1"))
NAMES = ("l", "r")


@st.composite
def widths(draw) -> dict[int, int]:
    """The ROWS windows: on the right only, the left only, or both; 1 to 3 rows."""
    sides = draw(st.sampled_from(((1,), (0,), (0, 1))))
    return {side: draw(st.integers(1, 3)) for side in sides}


def plan_for(spark, tables, how, windows, residual=False):
    root, paths = tables
    rows = {NAMES[side]: count for side, count in windows.items()}
    return bind(spark, job(root, paths, how, 0, 0, 0, residual, rows=rows))


def different_v(left, right):
    return left.v != right.v


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("kernel_rows")
    return root, create_tables(spark, root)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(
    how=st.sampled_from(("inner", "left", "right", "full")),
    windows=widths(),
    residual=st.booleans(),
    closed=st.booleans(),
    scenarios=at_random(st.lists(commits(), min_size=STACK, max_size=STACK)),
)
def test_one_step_decides_as_the_reference(spark, tables, how, windows, residual, closed, scenarios):
    plan = plan_for(spark, tables, how, windows, residual)
    stacked = stack(scenarios, closed)
    result = replay_step(spark, plan, stacked, "exact", final=closed)
    check = different_v if residual else (lambda left, right: True)
    expected = [rows_reference(events, windows, how, check, closed) for events in stacked.events]
    assert_step_as_expected(result, stacked, expected, scenarios)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(
    how=st.sampled_from(("inner", "left", "right", "full")),
    windows=widths(),
    cut=st.integers(-30, 2),
    scenarios=at_random(st.lists(commits(), min_size=STACK, max_size=STACK)),
)
def test_slices_add_up_to_the_whole(spark, tables, how, windows, cut, scenarios):
    plan = plan_for(spark, tables, how, windows)
    stacked = stack(scenarios)
    b = PIVOT + cut
    whole = replay_step(spark, plan, stacked, "exact")
    parts = [replay_step(spark, plan, stacked, "exact", [w]) for w in [(-PIVOT, b), (b, 2 * PIVOT)]]
    assert_slices_add_up(whole, parts, stacked, scenarios)


@st.composite
def deliveries(draw):
    how = draw(st.sampled_from(("inner", "left", "right", "full")))
    windows = draw(widths())
    scenarios = draw(st.lists(commits(), min_size=LAID, max_size=LAID))
    events = laid_streams(scenarios)
    return how, windows, events, batches(draw, events)


@settings(max_examples=LIVE_EXAMPLES, **SETTINGS)
@given(case=at_random(deliveries()))
def test_micro_batches_decide_as_one_step(spark, tables, case):
    """Live `decide`, batch after batch, with each key's latest rows kept in the state."""
    how, windows, events, batches = case
    plan = plan_for(spark, tables, how, windows)
    run = live_steps(spark, plan, events, batches)
    output, counts = rows_reference(events, windows, how)
    assert run.output == output
    assert {side: {b: run.counts[side][b] for b in BUCKETS} for side in (0, 1)} == counts
