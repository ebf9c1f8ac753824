"""A job's start at the kernel's level: every source's history arrives at the start instant at
once, whatever commits each source made before it, and the live runner's micro-batches decide it
as the reference does with all of it at one position (docs/semantics.md, "Where a job starts")."""

from __future__ import annotations

import os

import pytest
from harness import create_tables, job
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_harness import BASE_MICROS, SETTINGS, at_random, batches, live_steps
from reference import BUCKETS, Event, reference
from test_kernel_interval import commits

from streamjoin.plan import bind

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_LIVE_EXAMPLES", "1")) * 4
START = 0  # the start instant (micros); commits after it come a second apart


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("start")
    return root, create_tables(spark, root)


def started(history: list, after: list) -> tuple[list[Event], list[Event], tuple[int, int, int]]:
    """Events of commits made before the start (`history`, in any interleaving of the two sides)
    and after it: as the live runner sees them (each side's history at (START, side, its start
    version)), as the reference sees them (all history at one position), and the history's end."""
    versions, live, ref, starts = {0: 0, 1: 0}, [], [], {}
    for side, _ in history:
        versions[side] += 1
    starts = dict(versions)
    n = 0
    for side, rows in history:
        for _i, k, t, v in rows:
            n += 1
            live.append(Event(side, f"h{n}", k, t, (START, side, starts[side]), v))
            ref.append(Event(side, f"h{n}", k, t, (START, -1, -1), v))
    for j, (side, rows) in enumerate(after):
        versions[side] += 1
        position = (START + (j + 1) * 1_000_000, side, versions[side])
        for _i, k, t, v in rows:
            n += 1
            live.append(Event(side, f"a{n}", k, t, position, v))
            ref.append(Event(side, f"a{n}", k, t, position, v))
    # The runner reads commit times BASE_MICROS later (kernel_harness._arrival).
    return live, ref, max((BASE_MICROS + START, side, starts[side]) for side in (0, 1))


@st.composite
def cases(draw):
    how = draw(st.sampled_from(("inner", "left", "right", "full")))
    lo = draw(st.integers(-8, 4))
    hi = draw(st.integers(lo, lo + 8))
    grace = draw(st.sampled_from((0, 2, 5)))
    history = draw(commits(max_commits=6))
    after = draw(
        st.lists(
            st.tuples(st.sampled_from((0, 1)), commits(max_commits=1).map(lambda c: c[0][1])), max_size=6
        )
    )
    live, ref, history_end = started(history, after)
    return how, lo, hi, grace, live, ref, history_end, batches(draw, live)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(case=at_random(cases()))
def test_micro_batches_decide_the_history_as_arriving_at_once(spark, tables, case):
    """However the sources interleaved their commits before the start, and however the micro-batches
    cut the history, no history row is late and the output is the reference's with all history at
    one position."""
    how, lo, hi, grace, live, ref, history_end, cuts = case
    root, paths = tables
    plan = bind(spark, job(root, paths, how, lo, hi, grace))
    run = live_steps(spark, plan, live, cuts, history_end)
    output, counts = reference(ref, lo, hi, grace, how, "exact")
    assert run.output == output
    assert {side: {b: run.counts[side][b] for b in BUCKETS} for side in (0, 1)} == counts
