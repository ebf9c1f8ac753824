"""The interval join's decisions at the kernel's level, against the plain-Python reference.

Lateness, watermarks, closing, padding and the bucket counts are decided by `kernel.step` from
positions and a Timeline; tests/kernel_harness.py stacks many generated examples into one step, so
each Hypothesis example below checks `STACK` scenarios against tests/reference.py in one Spark job.
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
    unstacked_output,
)
from reference import BUCKETS, reference

from streamjoin.plan import bind

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_EXAMPLES", "2"))  # stacks of STACK scenarios
LIVE_EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_LIVE_EXAMPLES", "1"))  # histories of LAID scenarios
LAID = 16  # scenarios laid end to end in one live history
STACK = 60  # scenarios decided by one kernel step


@st.composite
def commits(draw, max_commits: int = 7):
    """[(side, rows (id, key, seconds | None, v))]: a few keys, times drifting forward with jitter
    (so some rows arrive out of order or late), NULL keys and times now and then. Times are
    multiples of a drawn tick: a coarse tick makes rows of equal time frequent (as SQLstream's
    rowtimes in one millisecond), which is where eager emission's decisions differ."""
    out, n = [], 0
    tick = draw(st.sampled_from((1, 1, 4)))
    for c in range(draw(st.integers(1, max_commits))):
        rows = []
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            key = draw(st.sampled_from(("a", "b", "a", "c", "b", None)))
            t = None if draw(st.integers(0, 14)) == 0 else (3 * c + draw(st.integers(-8, 6))) // tick * tick
            rows.append((str(n), key, t, draw(st.integers(0, 2))))
        out.append((draw(st.sampled_from((0, 1))), rows))
    return out


@st.composite
def rowtimes(draw, max_commits: int = 10):
    """Commits in SQLstream's manner: one rowtime for both streams that often stays put from commit
    to commit, so that rows of equal time arrive in both orders (where eager emission decides per
    rowtime); now and then a row behind it, a NULL key or time."""
    out, n, clock = [], 0, 0
    for _ in range(draw(st.integers(1, max_commits))):
        clock += draw(st.sampled_from((0, 0, 0, 3, 6)))
        rows = []
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            key = draw(st.sampled_from(("a", "b", "a", "b", None)))
            t = None if draw(st.integers(0, 14)) == 0 else clock - draw(st.sampled_from((0, 0, 0, 3, 9)))
            rows.append((str(n), key, t, draw(st.integers(0, 2))))
        out.append((draw(st.sampled_from((0, 1))), rows))
    return out


@st.composite
def cases(draw):
    """Join parameters shared by one stack, and the stack's scenarios."""
    how = draw(st.sampled_from(("inner", "left", "right", "full")))
    emit = draw(st.sampled_from(("final", "eager")))
    eager = emit == "eager"  # rowtimes; a window around 0 lets rows of equal time meet
    lo = draw(st.integers(-8, 0 if eager else 4))
    hi = draw(st.integers(lo, lo + 8))
    grace = draw(st.sampled_from((0, 1, 2, 5, 30)))
    residual = draw(st.booleans())
    scenarios = draw(st.lists(rowtimes() if eager else commits(), min_size=STACK, max_size=STACK))
    return how, emit, lo, hi, grace, residual, scenarios


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    """Two empty source tables: the plan binds against their schemas; no row is ever written."""
    root = tmp_path_factory.mktemp("kernel_interval")
    return root, create_tables(spark, root)


@pytest.mark.parametrize("mode", ["exact", "complete"])
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(case=at_random(cases()), closed=st.booleans())
def test_one_step_decides_as_the_reference(spark, tables, mode, case, closed):
    """Final or eager emission (on INNER, eager changes nothing: SQLstream templates carry it);
    `closed`: a replay of an input that has ended (every row settled, every window closed)."""
    how, emit, lo, hi, grace, residual, scenarios = case
    root, paths = tables
    plan = bind(spark, job(root, paths, how, lo, hi, grace, residual, emit=emit))
    stacked = stack(scenarios, closed)
    result = replay_step(spark, plan, stacked, mode, final=closed)

    def different_v(left, right):
        return left.v != right.v

    expected = [
        reference(
            events,
            lo,
            hi,
            grace,
            how,
            mode,
            different_v if residual else (lambda left, right: True),
            closed,
            emit,
        )
        for events in stacked.events
    ]
    assert_step_as_expected(result, stacked, expected, scenarios)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(case=at_random(cases()), mode=st.sampled_from(("exact", "complete")))
def test_a_cross_join_pairs_every_row_in_the_bounds_as_the_reference(spark, tables, case, mode):
    """CROSS (SQLstream): no keys, every pair of on-time rows in the bounds, nothing padded. The
    examples cannot share an instant (nothing keeps their rows apart but time), so they are spread
    in time, and replayed as closed inputs (the one closing bound of the step fits only those)."""
    _, _, lo, hi, grace, _, scenarios = case
    root, paths = tables
    plan = bind(spark, job(root, paths, "cross", lo, hi, grace))
    stacked = stack(scenarios, closed=True, spread=True, keyed=False)
    result = replay_step(spark, plan, stacked, mode, final=True)
    expected = [reference(events, lo, hi, grace, "cross", mode, closed=True) for events in stacked.events]
    assert_step_as_expected(result, stacked, expected, scenarios)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(case=at_random(cases()), cut=st.integers(-30, 2))
def test_slices_add_up_to_the_whole(spark, tables, case, cut):
    """[a, b) and [b, c), each given only the rows in its margins, write and count what [a, c) does;
    and one step over both slices together writes what they write and counts each as it counts."""
    how, emit, lo, hi, grace, residual, scenarios = case
    root, paths = tables
    plan = bind(spark, job(root, paths, how, lo, hi, grace, residual, emit=emit))
    stacked = stack(scenarios)
    b = PIVOT + cut
    windows = [(-PIVOT, b), (b, 2 * PIVOT)]
    whole = replay_step(spark, plan, stacked, "exact")
    parts = [replay_step(spark, plan, stacked, "exact", [window]) for window in windows]
    together = replay_step(spark, plan, stacked, "exact", windows)
    assert_slices_add_up(whole, parts, stacked, scenarios)
    sliced = [unstacked_output(part.output, stacked) for part in parts]
    for example, both in enumerate(unstacked_output(together.output, stacked)):
        assert both == sliced[0][example] + sliced[1][example], (
            f"scenario {example}, slices together: {scenarios[example]}"
        )
    assert together.by_slice == [part.counts for part in parts]


@st.composite
def deliveries(draw, eager: bool = False):
    """LAID scenarios laid end to end (`laid_streams`) and their cut into two to seven micro-batches:
    how many of each side's next rows each batch brings (a commit may be cut, a batch may end inside
    one scenario and begin the next). `eager`: an outer join with eager emission, over rowtimes."""
    how = draw(st.sampled_from(("left", "right", "full") if eager else ("inner", "left", "right", "full")))
    emit = "eager" if eager else "final"
    lo = draw(st.integers(-8, 0 if eager else 4))
    hi = draw(st.integers(lo, lo + 8))
    grace = draw(st.sampled_from((0, 2, 5)))
    scenarios = draw(st.lists(rowtimes() if eager else commits(), min_size=LAID, max_size=LAID))
    events = laid_streams(scenarios)
    return how, emit, lo, hi, grace, events, batches(draw, events)


@settings(max_examples=LIVE_EXAMPLES, **SETTINGS)
@given(case=at_random(deliveries()))
def test_micro_batches_decide_as_one_step(spark, tables, case):
    """The live runner's `decide`, batch after batch with the state each leaves, writes what the
    reference writes for all rows at once: any cut into batches (commits cut too) gives one result."""
    check_micro_batches(spark, tables, case)


@settings(max_examples=LIVE_EXAMPLES, **SETTINGS)
@given(case=at_random(deliveries(eager=True)))
def test_eager_emission_over_micro_batches_decides_as_one_step(spark, tables, case):
    """Eager emission live: a row kept undecided in the state (the clock has not passed its time
    yet) is decided in the batch that moves the clock past it, as the reference decides it."""
    check_micro_batches(spark, tables, case)


def check_micro_batches(spark, tables, case) -> None:
    how, emit, lo, hi, grace, events, batches = case
    root, paths = tables
    plan = bind(spark, job(root, paths, how, lo, hi, grace, emit=emit))
    run = live_steps(spark, plan, events, batches)
    output, counts = reference(events, lo, hi, grace, how, "exact", emit=emit)
    assert run.output == output
    assert {side: {b: run.counts[side][b] for b in BUCKETS} for side in (0, 1)} == counts
