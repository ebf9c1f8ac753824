"""The window join's decisions at the kernel's level, against tests/reference.py's `window_reference`.

Windows (TUMBLE, HOP), pairs per shared window, padding per closed window, accounting per input
row, lateness, live state across micro-batches and replay slices: each Hypothesis example stacks
`STACK` scenarios into one kernel step (tests/kernel_harness.py), their times shifted by multiples
of the hop so that every scenario's windows fall as they would unshifted.
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
from reference import BUCKETS, window_reference
from test_kernel_interval import LAID, STACK, commits

from streamjoin.plan import bind

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_EXAMPLES", "2"))  # stacks of STACK scenarios
LIVE_EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_LIVE_EXAMPLES", "1"))  # histories of LAID scenarios


@st.composite
def windows(draw):
    """(hop, size) in seconds: tumbling or hopping, small against the scenarios' time spread."""
    hop = draw(st.sampled_from((2, 3, 4, 5)))
    return hop, hop * draw(st.sampled_from((1, 1, 2, 3)))


@st.composite
def cases(draw):
    how = draw(st.sampled_from(("inner", "left", "right", "full")))
    hop, size = draw(windows())
    grace = draw(st.sampled_from((0, 1, 2, 5, 30)))
    residual = draw(st.booleans())
    scenarios = draw(st.lists(commits(), min_size=STACK, max_size=STACK))
    return how, hop, size, grace, residual, scenarios


def different_v(left, right):
    return left.v != right.v


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("kernel_window")
    return root, create_tables(spark, root)


@pytest.mark.parametrize("mode", ["exact", "complete"])
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(case=at_random(cases()), closed=st.booleans())
def test_one_step_decides_as_the_reference(spark, tables, mode, case, closed):
    how, hop, size, grace, residual, scenarios = case
    root, paths = tables
    plan = bind(spark, job(root, paths, how, 0, 0, grace, residual, window=(hop, size)))
    stacked = stack(scenarios, closed, align=hop)
    result = replay_step(spark, plan, stacked, mode, final=closed)
    expected = [
        window_reference(
            events,
            hop,
            size,
            grace,
            how,
            mode,
            different_v if residual else (lambda left, right: True),
            closed,
            end=PIVOT - stacked.shift[example],
        )
        for example, events in enumerate(stacked.events)
    ]
    assert_step_as_expected(result, stacked, expected, scenarios)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(case=at_random(cases()), cut=st.integers(-30, 2))
def test_slices_add_up_to_the_whole(spark, tables, case, cut):
    """[a, b) and [b, c), each given only the rows in its margins, write and count what [a, c) does."""
    how, hop, size, grace, residual, scenarios = case
    root, paths = tables
    plan = bind(spark, job(root, paths, how, 0, 0, grace, residual, window=(hop, size)))
    stacked = stack(scenarios, align=hop)
    b = PIVOT + cut
    windows_ = [(-PIVOT, b), (b, 2 * PIVOT)]
    whole = replay_step(spark, plan, stacked, "exact")
    parts = [replay_step(spark, plan, stacked, "exact", [window]) for window in windows_]
    assert_slices_add_up(whole, parts, stacked, scenarios)


@st.composite
def deliveries(draw):
    """LAID scenarios laid end to end and their cut into two to seven micro-batches."""
    how = draw(st.sampled_from(("inner", "left", "right", "full")))
    hop, size = draw(windows())
    grace = draw(st.sampled_from((0, 2, 5)))
    scenarios = draw(st.lists(commits(), min_size=LAID, max_size=LAID))
    events = laid_streams(scenarios)
    return how, hop, size, grace, events, batches(draw, events)


@settings(max_examples=LIVE_EXAMPLES, **SETTINGS)
@given(case=at_random(deliveries()))
def test_micro_batches_decide_as_one_step(spark, tables, case):
    """The live runner's `decide`, batch after batch with the (row, window) state each leaves,
    writes and counts what the reference does for all rows at once."""
    how, hop, size, grace, events, batches = case
    root, paths = tables
    plan = bind(spark, job(root, paths, how, 0, 0, grace, window=(hop, size)))
    run = live_steps(spark, plan, events, batches)
    output, counts = window_reference(events, hop, size, grace, how, "exact")
    assert run.output == output
    assert {side: {b: run.counts[side][b] for b in BUCKETS} for side in (0, 1)} == counts
