"""The arrival index's decisions, tested without Spark where they are pure.

The replay takes each commit's watermark from the index (per source, the largest event time so
far); the live runner computes it from the commits it has seen, in position order. Both must give
the same number for every commit, whatever the sources and their interleaving: hundreds of
generated examples in well under a second.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin import arrival
from streamjoin.delta_io import Commit
from streamjoin.errors import JobError
from streamjoin.index import _runs, sweep
from streamjoin.spec import JoinSpec, spec_from_dict


@st.composite
def histories(draw):
    """Per source, commits with increasing timestamps (ties across sources allowed) and max events."""
    sources = draw(st.integers(1, 3))
    commits = []
    for src in range(sources):
        ts, version = draw(st.integers(0, 5)), draw(st.integers(0, 3))
        for _ in range(draw(st.integers(1, 8))):
            ts += draw(st.integers(1, 4))
            version += draw(st.integers(1, 2))
            event = draw(st.one_of(st.none(), st.integers(-20, 40)))
            commits.append(arrival.CommitStats((ts, src, version), event, rows=1))
    return sources, commits


def _entries(commits):
    """Index entries of `commits`: each position with its source's largest event time so far."""
    entries, so_far = [], {}
    for c in sorted(commits, key=lambda c: c.position):  # what the index stores per source
        src = c.position.source
        if c.max_event is not None:
            so_far[src] = max(so_far.get(src, c.max_event), c.max_event)
        entries.append((c.position, so_far.get(src)))
    return entries


@settings(max_examples=400, deadline=None)
@given(histories(), st.data())
def test_watermarks_from_the_index_equal_those_the_live_runner_computes(history, data):
    sources, commits = history
    newest = arrival.newest_positions(commits)
    frontier = arrival.frontier(newest, sources)
    settled = sorted((c for c in commits if c.position <= frontier), key=lambda c: c.position)
    live = arrival.timeline(settled, None)

    entries = _entries(commits)
    targets = data.draw(st.sets(st.sampled_from([c.position for c in settled])), label="commits of the slice")
    # The index is read from each source's last entry before the earliest target on.
    earliest = min(targets, default=frontier)
    kept = [e for e in entries if e[0][0] >= earliest[0]]
    for src in range(sources):
        before = [e for e in entries if e[0][1] == src and e[0][0] < earliest[0]]
        kept += before[-1:]
    from_index = sweep(kept, targets, frontier)

    assert from_index.max_event == live.max_event
    assert {(p[1], p[2]) for p in targets} <= from_index.before.keys()
    # The slice's commits, and where the clock rises from its first on and the frontier (a chain's
    # derived rows arrive there): the marks the live runner has at those commits.
    assert from_index.before == {key: live.before[key] for key in from_index.before}
    assert from_index.through == {key: live.through[key] for key in from_index.through}
    if targets:
        assert from_index.rises == tuple(rise for rise in live.rises if rise[1] >= min(targets))


@st.composite
def started_histories(draw):
    """Commits after a job start: each source's history is one commit at the start instant S
    (its start version, any), then commits after S (ties across sources allowed)."""
    sources, start = draw(st.integers(1, 3)), draw(st.integers(0, 5))
    commits = []
    for src in range(sources):
        ts, version = start, draw(st.integers(0, 3))
        commits.append(
            arrival.CommitStats((ts, src, version), draw(st.one_of(st.none(), st.integers(-20, 40))), 1)
        )
        for _ in range(draw(st.integers(0, 6))):
            ts += draw(st.integers(1, 4))
            version += draw(st.integers(1, 2))
            commits.append(
                arrival.CommitStats((ts, src, version), draw(st.one_of(st.none(), st.integers(-20, 40))), 1)
            )
    history_end = max(c.position for c in commits if c.position.time == start)
    return sources, commits, history_end


@settings(max_examples=400, deadline=None)
@given(started_histories(), st.data())
def test_the_history_of_every_source_arrives_at_once_and_is_never_late(history, data):
    sources, commits, history_end = history
    newest = arrival.newest_positions(commits)
    frontier = arrival.frontier(newest, sources, history_end)
    assert frontier is not None and frontier >= history_end  # the history settles as one
    settled = sorted((c for c in commits if c.position <= frontier), key=lambda c: c.position)
    live = arrival.timeline(settled, None, history_end)
    in_history = [c for c in settled if c.position <= history_end]
    all_history = arrival.max_present(c.max_event for c in in_history)
    for c in in_history:  # no history row is late: nothing came before the start
        assert live.before[(c.position.source, c.position.version)] is None
        assert live.through[(c.position.source, c.position.version)] == all_history
    first_after = next((c for c in settled if c.position > history_end), None)
    if first_after is not None:  # after it, every source's history is behind every commit
        assert live.before[(first_after.position.source, first_after.position.version)] == all_history
    assert [p for _, p in live.rises if p <= history_end] in ([], [history_end])

    # The replay's sweep of the index agrees, for any commits of a slice.
    targets = data.draw(st.sets(st.sampled_from([c.position for c in settled])), label="commits of the slice")
    from_index = sweep(_entries(commits), targets, frontier, history_end)
    assert from_index.before == {key: live.before[key] for key in from_index.before}
    assert from_index.through == {key: live.through[key] for key in from_index.through}
    if targets:
        assert from_index.rises == tuple(rise for rise in live.rises if rise[1] >= min(targets))


def test_change_feed_reads_merge_nearby_versions():
    assert _runs([]) == []
    assert _runs([3, 4, 5, 20, 21, 40]) == [(3, 5), (20, 21), (40, 40)]
    assert _runs([1, 9, 18], gap=8) == [(1, 9), (18, 18)]


@pytest.mark.parametrize(
    "operation, mode, rewrites",
    [
        ("WRITE", "Append", False),
        ("STREAMING UPDATE", "Append", False),
        ("OPTIMIZE", None, False),
        ("VACUUM END", None, False),
        ("SET TBLPROPERTIES", None, False),
        ("DELETE", None, True),
        ("MERGE", None, True),
        ("UPDATE", None, True),
        ("WRITE", "Overwrite", True),
        ("STREAMING UPDATE", "Complete", True),
        ("RESTORE", None, True),
        ("REPLACE TABLE AS SELECT", None, True),
    ],
)
def test_commits_that_would_change_decided_arrivals_are_recognised(operation, mode, rewrites):
    assert Commit(3, datetime(2024, 1, 1), operation, mode).rewrites_rows is rewrites


@pytest.mark.parametrize(
    "operation, mode, appended",
    [
        ("WRITE", "Append", 7),  # numOutputRows: every row it wrote is an insert
        ("STREAMING UPDATE", "Append", 7),
        ("CREATE TABLE AS SELECT", None, 7),
        ("OPTIMIZE", None, 0),  # files rewritten, no row changed: nothing in the change feed
        ("SET TBLPROPERTIES", None, 0),
        ("WRITE", "Overwrite", None),  # its numOutputRows are not its inserts alone
        ("MERGE", None, None),
        ("ROW TRACKING BACKFILL", None, None),  # not known: the change feed tells
    ],
)
def test_the_rows_a_commit_appended_are_known_from_the_log_only_for_plain_appends(operation, mode, appended):
    """Issue 14: a micro-batch indexes a commit from its own rows only when the log says how many
    rows the commit inserted; anything else has its change feed read."""
    assert Commit(3, datetime(2024, 1, 1), operation, mode, output_rows=7).appended_rows == appended
    if appended:
        assert Commit(3, datetime(2024, 1, 1), operation, mode).appended_rows is None  # no metrics logged


@pytest.mark.parametrize(
    "operation, mode, created",
    [
        ("CREATE TABLE", None, 0),  # DDL: the table starts empty
        ("WRITE", "ErrorIfExists", 7),  # a DataFrame's save: what it wrote is all the table holds
        ("WRITE", "Overwrite", 7),
        ("CREATE TABLE AS SELECT", None, 7),
        ("CREATE OR REPLACE TABLE AS SELECT", None, None),  # not known: its rows tell
        ("MERGE", None, None),
    ],
)
def test_the_rows_a_table_was_created_with_are_known_from_its_first_commits_log(operation, mode, created):
    """A new live checkpoint indexes its sources' start; a start at version 0 whose log says the
    table was created empty needs no read of its rows."""
    assert Commit(0, datetime(2024, 1, 1), operation, mode, output_rows=7).created_rows == created


def _job(**extra) -> dict:
    document = {
        "name": "j",
        "from": "a",
        "sources": {"a": {"path": "/x/a", "time": "t"}, "b": {"path": "/x/b", "time": "t"}},
        "joins": [{"join": "b", "on": "a.k = b.k", "within": "1m"}],
        "output": {"path": "/x/out"},
    }
    document.update(extra)
    return document


def test_start_at_in_job_files():
    document = _job(start_at="2024-05-01T00:00:00Z")
    document["sources"]["a"]["start_at"] = 120
    document["sources"]["b"]["start_at"] = datetime(2024, 5, 2)  # YAML reads bare dates and times as such
    spec: JoinSpec = spec_from_dict(document)
    assert spec.start_at == "2024-05-01T00:00:00Z"
    assert spec.source("a").start_at == 120 and spec.source("b").start_at == "2024-05-02T00:00:00"


@pytest.mark.parametrize(
    "where, value, message",
    [
        ("job", 12, "a job-wide start is a time"),
        ("job", "yesterday-ish", "not an ISO date"),
        ("source", -3, "negative"),
        ("source", True, "neither a version nor a time"),
    ],
)
def test_bad_starts_are_refused_before_any_table_is_read(where, value, message):
    document = _job()
    if where == "job":
        document["start_at"] = value
    else:
        document["sources"]["a"]["start_at"] = value
    with pytest.raises(JobError, match=message):
        spec_from_dict(document)
