"""End-to-end tests of the contracts Equivalence, Determinism, Slice invariance and Nothing is lost,
on the fixed example of tests/harness.py written as real Delta commits.

The same join's decisions on hundreds of generated cases are tested at the kernel's level
(tests/test_kernel_interval.py); the live runner in several runs against one is in
tests/test_restart.py. Here: one replay in each mode and at several shuffle partitionings, and
slices that add up to the whole, compared with the plain-Python reference (tests/reference.py) on
the commit positions read back from the change data feed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta

import pytest
from aging import write_commits
from conftest import at
from harness import (
    EVERYTHING,
    FIXED_GRACE,
    FIXED_HI,
    FIXED_HOW,
    FIXED_LO,
    FIXED_PARTS,
    SIDES,
    by_source,
    create_tables,
    events,
    job,
    live_metrics,
    read,
    read_output,
    read_side,
    with_output,
    write_commit,
)
from reference import BUCKETS, Event, reference

from streamjoin import delta_io, index
from streamjoin.errors import JobError
from streamjoin.plan import bind, describe
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict
from streamjoin.timeutil import from_spark


def write_all(spark, paths, commits, after=None):
    """Write the commits in order; return [(side, version, rows)]; call after(i) after commit i."""
    versions, written = {0: 0, 1: 0}, []
    for i, (side, rows, files) in enumerate(commits):
        write_commit(spark, paths[side], rows, files)
        versions[side] += 1
        written.append((side, versions[side], rows))
        if after:
            after(i)
    return written


def counts_of(metrics) -> dict[int, dict[str, int]]:
    """A replay's counts by side, in the reference's form."""
    return {side: {b: asdict(metrics.sources[name])[b] for b in BUCKETS} for side, name in enumerate(SIDES)}


def check_live_metrics(rows, expected: dict[int, dict[str, int]]) -> None:
    """One balanced row per batch id; batches hand over what they carry; totals match the reference."""
    assert [r["batch"] for r in rows] == list(range(len(rows))), (
        "exactly one metrics row per batch, none missing"
    )
    for side, name in enumerate(SIDES):
        previous_left = 0
        total = Counter()
        for row in rows:
            c = by_source(row)[name]
            assert c["rows_in"] + c["carried_in"] == sum(c[b] for b in BUCKETS if b != "rows_in"), (
                row["batch"],
                c,
            )
            assert c["carried_in"] == previous_left, (row["batch"], c)
            previous_left = c["open"] + c["unsettled"]
            total.update(
                {
                    b: c[b]
                    for b in (
                        "rows_in",
                        "rejected",
                        "late",
                        "joined",
                        "unmatched_emitted",
                        "unmatched_dropped",
                    )
                }
            )
        last = by_source(rows[-1])[name]
        total.update({"open": last["open"], "unsettled": last["unsettled"]})
        assert {b: total[b] for b in BUCKETS} == expected[side], name


def test_replay_modes_partitions_and_slices(spark, tmp_path):
    how, lo, hi, grace = FIXED_HOW, FIXED_LO, FIXED_HI, FIXED_GRACE
    cut = 12  # inside the example: rows on both sides of it, windows open across it
    root = tmp_path
    # Row tracking on, as a user's table should have it: replays read slices from snapshots here,
    # from the change feed in the other young-table tests (tests/conftest.py).
    paths = create_tables(spark, root, row_tracking=True)
    spec = job(root, paths, how, lo, hi, grace)
    written = write_all(spark, paths, [c for part in FIXED_PARTS for c in part])
    positioned = events(spark, paths, written)
    a, c = EVERYTHING
    b = at(cut)
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    runs = {}
    try:
        for name, mode, shuffle, start, end in [
            ("complete", "complete", 1, a, c),
            ("closed", "complete", 2, a, c),
            ("exact", "exact", 3, a, c),
            ("sliced", "exact", 1, a, b),
            ("sliced", "exact", 5, b, c),
            ("sliced", "exact", 2, a, b),  # re-running a slice replaces it
        ]:
            spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
            runs.setdefault(name, []).append(
                replay(
                    spark,
                    with_output(spec, f"{root}/{name}"),
                    start,
                    end,
                    RunOptions(mode=mode, closed=name == "closed"),
                )
            )
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)

    for mode in ("complete", "exact"):
        expected, counts = reference(positioned, lo, hi, grace, how, mode)
        assert read_output(spark, f"{root}/{mode}") == expected, mode
        assert runs[mode][0].balanced() and counts_of(runs[mode][0]) == counts, mode
    # A closed history (issue 15, item 5): the input ends at the pinned versions, so the rows the
    # open windows and the unsettled commits held come out too, padded where their side is kept.
    expected, counts = reference(positioned, lo, hi, grace, how, "complete", closed=True)
    closed = read_output(spark, f"{root}/closed")
    assert closed == expected and runs["closed"][0].balanced() and counts_of(runs["closed"][0]) == counts
    assert sum(closed.values()) > sum(read_output(spark, f"{root}/complete").values())
    assert runs["closed"][0].frontier.startswith("input closed at ")
    assert read_output(spark, f"{root}/sliced") == read_output(spark, f"{root}/exact")
    for side in ("late", "rejected"):
        assert read_side(spark, f"{root}/sliced_{side}") == read_side(spark, f"{root}/exact_{side}"), side
    first, second, again = runs["sliced"]
    assert all(m.balanced() for m in runs["sliced"])
    assert counts_of(first) == counts_of(again)
    both = {side: dict(Counter(counts_of(first)[side]) + Counter(counts_of(second)[side])) for side in (0, 1)}
    exact = counts_of(runs["exact"][0])
    assert {s: {b: both[s].get(b, 0) for b in BUCKETS} for s in (0, 1)} == exact, (
        "slice counts add up to the whole"
    )


def test_fixed_data_exercises_every_case():
    """The fixed example has what the tests over it rely on (by the reference, commits in write
    order): joined pairs, rows padded on both sides, late and rejected rows on both sides."""
    versions, positioned = {0: 0, 1: 0}, []
    for n, (side, rows, _) in enumerate(c for part in FIXED_PARTS for c in part):
        versions[side] += 1
        positioned += [Event(side, i, k, t, (n, side, versions[side]), v) for i, k, t, v in rows]
    expected, counts = reference(positioned, FIXED_LO, FIXED_HI, FIXED_GRACE, FIXED_HOW)
    assert any(l and r for l, r, _ in expected) and any(l is None for l, _, _ in expected)
    assert any(r is None for _, r, _ in expected)
    for side in (0, 1):
        assert counts[side]["late"] and counts[side]["rejected"], counts


def test_live_commit_cut_into_micro_batches_waits_for_its_last_rows(spark, tmp_path):
    """Regression: maxFilesPerTrigger cut a two-file commit into two micro-batches; the second half
    was judged against a watermark raised by the first half of its own commit (rows of one commit
    share a position, so neither is before the other), and a row the replay keeps came out late."""
    paths = create_tables(spark, tmp_path)
    spec = job(tmp_path, paths, "left", -5, 5, 0)
    written = write_all(
        spark,
        paths,
        [
            (0, [("l1", "a", 100, 0), ("l2", "b", 10, 0), ("l3", "a", 100, 0), ("l4", "b", 10, 0)], 2),
            (1, [("r1", "a", 100, 0)], 1),
        ],
    )
    LiveRunner(spark, spec, f"{tmp_path}/checkpoint", max_files_per_trigger=1).run()
    replayed = with_output(spec, f"{tmp_path}/replay")
    replay(spark, replayed, *EVERYTHING)
    expected, counts = reference(events(spark, paths, written), -5, 5, 0, "left")
    assert expected == Counter({("l2", None, 10): 1, ("l4", None, 10): 1}) and counts[0]["late"] == 0
    assert read_output(spark, replayed.output.path) == expected
    assert read_output(spark, spec.output.path) == expected
    rows = live_metrics(spark, spec)
    assert len(rows) == 2, "the commit was not cut into two micro-batches"
    check_live_metrics(rows, counts)


# Seconds after BASE (2024-01-01): about 2037, ten years ahead of any commit this suite makes.
FAR_AHEAD = 13 * 365 * 86_400


def test_the_index_compacts_itself_and_keeps_its_entries(spark, tmp_path, monkeypatch):
    """Every COMPACT_EVERY versions of the arrival index, the update that wrote the last of them
    compacts the table (OPTIMIZE): its entries stay those of an index written in one update, and
    it is read (from the files its checksum lists) the same before and after."""
    monkeypatch.setattr(index, "COMPACT_EVERY", 3)
    paths = create_tables(spark, tmp_path)
    for n in range(4):
        write_commit(spark, paths[n % 2], [(f"x{n}", "k", 10 * n, 1)])
    spec = job(tmp_path, paths, "inner", -5, 5, 0)
    plan = bind(spark, spec)
    steps = [
        (0, 0),
        (1, 0),
        (1, 1),
        (2, 1),
        (2, 2),
    ]  # (l, r): index versions 0, 1, 2 + OPTIMIZE, 4, 5 + OPTIMIZE
    newest = []
    for left, right in steps:
        newest.append(index.update(spark, plan, {"l": left, "r": right}).newest())
    history = delta_io.history(spark, index.location(plan))
    assert [c.version for c in history if c.operation == "OPTIMIZE"] == [3, 6], [c.operation for c in history]
    whole = bind(spark, with_output(spec, f"{tmp_path}/whole"))
    assert index.update(spark, whole, {"l": 2, "r": 2}).newest() == newest[-1]

    def entries(where: str) -> list[tuple]:
        return sorted(tuple(r) for r in delta_io.read_snapshot(spark, where).collect())

    assert entries(index.location(plan)) == entries(index.location(whole))
    stored = index._read_at(spark, index.location(plan))
    assert stored is not None and sorted(tuple(r) for r in stored.frame.collect()) == entries(
        index.location(plan)
    )


def test_the_index_kept_live_equals_the_index_read_from_the_change_feed(spark, tmp_path, monkeypatch):
    """Issue 14: a micro-batch indexes the commits it holds whole from its own tagged rows, and reads
    the change feed only for a commit cut by maxFilesPerTrigger. Its entries must be those an index
    reads from the change feed: rows, rejected rows (a NULL time, a NULL key, a time years ahead),
    event-time ranges, untimed rows, watermarks, for an event-time and a commit-time source, across
    an OPTIMIZE (a commit without rows). The runner is made after the first commits: a new
    checkpoint indexes its sources' start (version 0, created empty: known from the log) and leaves
    the commits after it to its batches, rather than reading every row once more before them."""
    paths = create_tables(spark, tmp_path)
    spec = job(tmp_path, paths, "left", -5, 5, 0)
    spec = replace(spec, sources=(spec.sources[0], replace(spec.sources[1], time="commit")))
    reads: list[list[int]] = []
    stats_query = index._stats_query
    monkeypatch.setattr(index, "_stats_query", lambda *a: reads.append(a[-1]) or stats_query(*a))
    runner = None
    groups = [
        [
            (0, [("a1", "k1", 10, 1), ("a2", None, 12, 1), ("a3", "k2", None, 1)], None),
            (1, [("b1", "k1", 11, 1)], None),
        ],
        [(0, [("a4", "k1", 20, 1), ("af", "k3", FAR_AHEAD, 1)], None), (1, [("b2", None, None, 1)], None)],
        [(0, [("a5", "k1", 30, 1), ("a6", "k2", 28, 1), ("a7", "k1", 31, 1)], 3)],  # cut: two files, then one
        [(1, [("b3", "k1", 40, 1), ("b4", "k2", 41, 1)], 2), (0, [("a8", "k2", 45, 1)], None)],
    ]
    for n, group in enumerate(groups):
        if n == 3:
            spark.sql(f"OPTIMIZE delta.`{paths[0]}`")
        for side, rows, files in group:
            write_commit(spark, paths[side], rows, files)
        if runner is None:
            runner = LiveRunner(spark, spec, f"{tmp_path}/checkpoint", max_files_per_trigger=2)
            assert not delta_io.exists(spark, index.location(runner.plan))  # made under the lease, by run()
        runner.run()
    assert runner is not None and len(runner.runs) >= 5, "the three-file commit was not cut"
    # Only the cut commit (l's version 3) was read: every other came whole in one batch, the
    # OPTIMIZE (l's version 4) is known from the log to hold no rows, and so is version 0.
    assert reads == [[3]]

    def entries(location: str) -> list[tuple]:
        return sorted(tuple(r) for r in spark.read.format("delta").load(location).distinct().collect())

    fresh = with_output(spec, f"{tmp_path}/fresh")
    index.update(spark, bind(spark, fresh))
    kept, read_back = entries(index.location(runner.plan)), entries(index.location(bind(spark, fresh)))
    assert kept == read_back
    assert {(e[0], e[1]): e[4] for e in kept if e[4]} == {("l", 1): 2, ("l", 2): 1, ("r", 2): 1}


def test_a_row_far_ahead_of_its_commit_is_rejected_and_the_rows_after_it_still_join(spark, tmp_path):
    """Issue 20, item 5: one row dated years ahead (a clock error) would lift the watermark past every
    row to come. It is rejected as `future_event_time` instead, live and replayed alike, and the
    join goes on; an index computed with the bound refuses a job that drops it."""
    paths = create_tables(spark, tmp_path)
    write_all(
        spark,
        paths,
        [
            (0, [("a1", "k1", 10, 1)], None),
            (1, [("b1", "k1", 12, 1)], None),
            (0, [("a2", "k2", 20, 1), ("af", "k3", FAR_AHEAD, 1)], None),
            (1, [("b2", "k2", 22, 1), ("bf", "k2", FAR_AHEAD, 1)], None),
            (0, [("a3", "k1", 40, 1)], None),
            (1, [("b3", "k1", 41, 1)], None),
            (0, [("a9", "k9", 60, 1)], None),  # moves the frontier past b3
        ],
    )
    spec = job(tmp_path, paths, "inner", -5, 5, 5)
    live = LiveRunner(spark, spec, str(tmp_path / "checkpoint")).run(600)
    # Up to a day from now: every commit, not the rejected rows' event times. A rejected row is owned
    # by its commit time, so the replay of the period it arrived in reports it.
    until = datetime.now(UTC).replace(tzinfo=None) + timedelta(days=1)
    replayed = replay(
        spark, with_output(spec, f"{tmp_path}/replayed"), EVERYTHING[0], until, RunOptions(mode="exact")
    )
    expected = Counter({("a1", "b1", 12): 1, ("a2", "b2", 22): 1, ("a3", "b3", 41): 1})
    assert read_output(spark, f"{tmp_path}/out") == expected
    assert read_output(spark, f"{tmp_path}/replayed") == expected
    for output in ("out", "replayed"):
        assert not read_side(spark, f"{tmp_path}/{output}_late")
        rejected = read(spark, f"{tmp_path}/{output}_rejected")
        assert sorted((r.source, r.reason) for r in rejected) == [
            ("l", "future_event_time"),
            ("r", "future_event_time"),
        ], output
    assert sum(m.sources["l"].rejected + m.sources["r"].rejected for m in live) == 2
    assert replayed.sources["l"].rejected == 1 and replayed.sources["r"].rejected == 1

    unbounded = replace(spec, sources=tuple(replace(s, max_future=None) for s in spec.sources))
    with pytest.raises(JobError, match=r"max_future none, but .*_index was computed with 1d"):
        replay(spark, unbounded, EVERYTHING[0], until, RunOptions(mode="exact"))


def test_streams_without_a_time_column_join_on_their_commit_times(spark, tmp_path):
    """Issue 15, item 6: `time: commit` (Lenses' examples, ksqlDB's record timestamps): a stream's
    event time is its commit timestamp. The commits are dated (tests/aging.py) so that the bounds
    decide: c1 two minutes after v1 joins it, c2 six minutes after v2 does not (within 5m), and v2
    comes out padded once the commit clock passed its window. Live and the replay agree."""
    t0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None) - timedelta(days=2)
    minute = timedelta(minutes=1)
    paths = {"views": str(tmp_path / "views"), "clicks": str(tmp_path / "clicks")}
    plan = {
        "views": [
            (t0, [("v1", "a")]),
            (t0 + 10 * minute, [("v2", "b")]),
            (t0 + 20 * minute, [("v3", "c")]),
            (t0 + 60 * minute, [("v9", "z")]),
        ],
        "clicks": [
            (t0 + 2 * minute, [("c1", "a")]),
            (t0 + 16 * minute, [("c2", "b")]),
            (t0 + 21 * minute, [("c3", "c")]),
            (t0 + 61 * minute, [("c9", "y")]),
        ],
    }
    for name, commits in plan.items():
        write_commits(
            spark, paths[name], commits, "id string, k string", {"delta.enableChangeDataFeed": "true"}
        )
    spec = spec_from_dict(
        {
            "name": "commit_time",
            "sources": {name: {"path": path, "time": "commit"} for name, path in paths.items()},
            "from": "views",
            "joins": [
                {"join": "clicks", "type": "left", "on": "views.k = clicks.k", "within": "5m", "grace": "1m"}
            ],
            "select": ["views.id AS view", "clicks.id AS click"],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    assert "event time = commit timestamp (time: commit)" in describe(bind(spark, spec))
    LiveRunner(spark, spec, str(tmp_path / "checkpoint")).run(600)
    replay(
        spark, with_output(spec, str(tmp_path / "replayed")), t0 - timedelta(hours=1), t0 + timedelta(days=1)
    )
    # a joined row at the later commit's time, a padded one at its own; v9's window is still open
    expected = Counter(
        {
            ("v1", "c1", t0 + 2 * minute): 1,
            ("v2", None, t0 + 10 * minute): 1,
            ("v3", "c3", t0 + 21 * minute): 1,
        }
    )
    for output in ("out", "replayed"):
        rows = read(spark, str(tmp_path / output))
        assert (
            Counter((r.view, r.click, from_spark(r.event_time).replace(tzinfo=None)) for r in rows)
            == expected
        ), output
