"""UNNEST and table-function joins decided at the kernel's level, against `reference.lateral_reference`.

Hundreds of rows per example (arrays empty, NULL or holding NULLs; texts blank, NULL or of several
words; NULL times rejected), many commits: one replay step over slices of every size, and the
live runner's `decide` over micro-batches that cut commits, each against the reference.
"""

from __future__ import annotations

import os

import pytest
from conftest import append
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_harness import SETTINGS, assert_one_stream_slices, at_random, one_stream_frame, one_stream_live
from pyspark.sql.types import ArrayType, StringType, StructField, StructType, TimestampType
from reference import BUCKETS, lateral_reference

from streamjoin.plan import bind
from streamjoin.spec import spec_from_dict

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_EXAMPLES", "5"))
LIVE_EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_LIVE_EXAMPLES", "3"))
ORDERS = StructType(
    [
        StructField("id", StringType()),
        StructField("tags", ArrayType(StringType())),
        StructField("note", StringType()),
        StructField("t", TimestampType()),
    ]
)
# What each join makes of a row's value, as the reference sees it: (made rows, columns per row).
KINDS = {
    "unnest": (lambda tags: [(tag,) for tag in tags or []], 1),
    "function": (lambda note: [(w, i) for i, w in enumerate((note or "").split())], 2),
}
WORDS = st.sampled_from(["a", "b", "cc", "d e"])


@st.composite
def histories(draw, most: int = 60):
    """Rows (id, tags, note, seconds) in commits: [(version, rows)], versions 1, 2, ..."""
    rows = draw(
        st.lists(
            st.tuples(
                st.none() | st.lists(st.none() | WORDS, max_size=3),
                st.none() | st.lists(WORDS, max_size=3).map(" ".join),
                st.none() | st.integers(0, 200),
            ),
            min_size=1,
            max_size=most,
        )
    )
    sizes = draw(st.lists(st.integers(1, 8), min_size=len(rows), max_size=len(rows)))
    commits, start = [], 0
    for size in sizes:
        if start >= len(rows):
            break
        commits.append(
            (len(commits) + 1, [(f"{start + i}", *r) for i, r in enumerate(rows[start : start + size])])
        )
        start += size
    return commits


def plan_for(spark, root, kind: str, how: str):
    join = (
        {"unnest": "tags", "as": "m", "columns": ["tag"]}
        if kind == "unnest"
        else {"function": "table_functions:split_words", "args": ["note"], "as": "m"}
    )
    select = ["orders.id", "m.tag"] if kind == "unnest" else ["orders.id", "m.word", "m.position"]
    return bind(
        spark,
        spec_from_dict(
            {
                "name": "lateral",
                "sources": {"orders": {"path": str(root / "orders"), "time": "t"}},
                "from": "orders",
                "joins": [{**join, "type": how}],
                "select": select,
                "output": {"path": str(root / "out")},
            }
        ),
    )


@pytest.fixture(scope="module")
def root(spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("kernel_lateral")
    append(spark, folder / "orders", [], ORDERS)
    return folder


def expected(commits, kind, how, inside=lambda t: True):
    made, width = KINDS[kind]
    value = 1 if kind == "unnest" else 2
    rows = [(r[0], r[value], r[3]) for _, part in commits for r in part if r[3] is None or inside(r[3])]
    return lateral_reference(rows, how, made, width)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    how=st.sampled_from(("inner", "left")),
    commits=at_random(histories()),
    cuts=st.lists(st.integers(0, 200), max_size=3).map(sorted),
)
def test_replayed_slices_decide_as_the_reference(spark, root, kind, how, commits, cuts):
    """One replay step over consecutive slices: each slice writes and counts what the reference
    gives for the rows whose event time it holds."""
    plan = plan_for(spark, root, kind, how)
    frame = one_stream_frame(spark, plan, commits)
    assert_one_stream_slices(
        spark, plan, frame, cuts, lambda a, b: expected(commits, kind, how, lambda t: a <= t < b)
    )


@settings(max_examples=LIVE_EXAMPLES, **SETTINGS)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    how=st.sampled_from(("inner", "left")),
    commits=at_random(histories()),
    data=st.data(),
)
def test_micro_batches_decide_as_the_reference(spark, root, kind, how, commits, data):
    """The live runner's `decide`, batch after batch over cuts that may split a commit: every row is
    written and counted once, as the reference says, and nothing is left open or waiting."""
    plan = plan_for(spark, root, kind, how)
    frame = one_stream_frame(spark, plan, commits)
    total = sum(len(rows) for _, rows in commits)
    ends = sorted(data.draw(st.sets(st.integers(1, total), max_size=4)) | {total})
    run = one_stream_live(spark, plan, frame, ends)
    rows, counts = expected(commits, kind, how)
    assert run.output == rows
    assert run.waiting == 0
    assert {b: run.counts[b] for b in BUCKETS if b != "unsettled"} == {
        b: counts[b] for b in BUCKETS if b != "unsettled"
    }
