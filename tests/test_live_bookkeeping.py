"""The live runner's bookkeeping, as pure functions: hundreds of generated deliveries in seconds.

A micro-batch brings some files of each source's next commits (maxFilesPerTrigger may cut a
commit); `live.settle` moves the sources' clocks, the rows at or before the frontier settle, and
the batch's Timeline decides their lateness. Whatever the cut into batches, the frontier and the
watermarks must be those of a replay that sees every commit at once: that is what makes the live
output equal the replay's (docs/architecture.md, Equivalence).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin import arrival
from streamjoin.runners.live import Progress, settle


@dataclass(frozen=True)
class Row:
    position: arrival.Position
    t: int | None  # None: rejected (it still counts among its commit's rows)


@st.composite
def histories(draw):
    """Commits of two sources in position order, each with rows split into files, and a delivery:
    how many of each source's next files every micro-batch takes."""
    commits: list[tuple[arrival.Position, list[list[Row]]]] = []
    versions = {0: 0, 1: 0}
    for j in range(draw(st.integers(1, 8))):
        source = draw(st.sampled_from((0, 1)))
        versions[source] += 1
        position = (j * 1000, source, versions[source])
        rows = [
            Row(position, draw(st.one_of(st.none(), st.integers(0, 3 * j + 6))))
            for _ in range(draw(st.integers(1, 4)))
        ]
        cuts = sorted(draw(st.sets(st.integers(1, len(rows) - 1), max_size=2))) if len(rows) > 1 else []
        files = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
        commits.append((position, files))
    files = {s: [f for p, fs in commits if p[1] == s for f in fs] for s in (0, 1)}
    batches = []
    left = {s: len(files[s]) for s in (0, 1)}
    while left[0] or left[1]:
        take = {s: draw(st.integers(0, left[s])) for s in (0, 1)}
        if not any(take.values()):
            source = 0 if left[0] else 1
            take[source] = 1
        batches.append(take)
        left = {s: left[s] - take[s] for s in (0, 1)}
    return commits, files, batches


def stats(rows: list[Row]) -> list[arrival.CommitStats]:
    """The batch's commits as the live runner tallies them (arrival.commit_stats, in Python)."""
    by_position: dict[arrival.Position, list[Row]] = {}
    for r in rows:
        by_position.setdefault(r.position, []).append(r)
    return [
        arrival.CommitStats(p, max((r.t for r in rs if r.t is not None), default=None), len(rs))
        for p, rs in sorted(by_position.items())
    ]


def deliveries(files, batches):
    """The rows each micro-batch brings: the next `take[source]` files of each source."""
    taken = {0: 0, 1: 0}
    for take in batches:
        yield [r for s in (0, 1) for f in files[s][taken[s] : taken[s] + take[s]] for r in f]
        taken = {s: taken[s] + take[s] for s in (0, 1)}


def commit_rows(commits):
    """Rows per commit by (source, version), as the arrival index answers `settle`'s question."""
    by_version = {p[1:]: sum(len(f) for f in fs) for p, fs in commits}
    return lambda source, version: by_version[(source, version)]


def run_live(commits, files, batches):
    """Feed the batches through `settle` and the per-batch Timeline the way the live runner does;
    (the frontiers after each batch, every settled row's watermark-before, the last progress)."""
    rows_of = commit_rows(commits)
    previous: Progress | None = None
    pending: list[Row] = []
    frontiers, before = [], {}
    for batch_id, new in enumerate(deliveries(files, batches)):
        settling = settle(stats(new), 2, previous, rows_of)
        pending += new
        settled = [r for r in pending if settling.frontier is not None and r.position <= settling.frontier]
        pending = [r for r in pending if r not in settled]
        accepted = [r for r in settled if r.t is not None]
        timeline = arrival.timeline(stats(accepted), previous.max_event if previous else None)
        before.update(timeline.before)
        previous = Progress(batch_id, timeline.max_event, settling.newest, {}, settling.partial)
        previous = Progress.from_json(previous.to_json())  # what a restart would read back
        frontiers.append(settling.frontier)
    return frontiers, before, previous


@settings(max_examples=500, deadline=None)
@given(histories())
def test_any_cut_into_micro_batches_settles_as_one_replay(history):
    commits, files, batches = history
    frontiers, before, last = run_live(commits, files, batches)

    # The frontier only moves forward, and ends where a replay of everything puts it.
    moved = [f for f in frontiers if f is not None]
    assert moved == sorted(moved)
    newest = arrival.newest_positions(arrival.CommitStats(p, None, 1) for p, _ in commits)
    assert frontiers[-1] == arrival.frontier(newest, 2)
    assert last.partial == {}, "every cut commit was completed by the last batch"

    # Every settled commit's watermark-before is the replay's.
    all_rows = [r for _, fs in commits for f in fs for r in f]
    settled = [r for r in all_rows if frontiers[-1] is not None and r.position <= frontiers[-1]]
    replayed = arrival.timeline(stats([r for r in settled if r.t is not None]), None)
    assert before == replayed.before
    assert last.max_event == replayed.max_event


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_cut_commit_waits_for_its_last_file(history):
    """After each batch, a source's newest position is its newest commit delivered whole, and a
    commit delivered in part is recorded with exactly the rows that came."""
    commits, files, batches = history
    total_rows = {p: sum(len(f) for f in fs) for p, fs in commits}
    delivered: dict[arrival.Position, int] = {}
    previous = None
    for batch_id, new in enumerate(deliveries(files, batches)):
        for r in new:
            delivered[r.position] = delivered.get(r.position, 0) + 1
        settling = settle(stats(new), 2, previous, commit_rows(commits))
        for source in (0, 1):
            whole = [p for p in delivered if p[1] == source and delivered[p] == total_rows[p]]
            assert settling.newest.get(source) == (max(whole) if whole else None)
            cut = [p for p in delivered if p[1] == source and delivered[p] < total_rows[p]]
            assert settling.partial.get(source) == ((cut[0], delivered[cut[0]]) if cut else None)
        previous = Progress(batch_id, None, settling.newest, {}, settling.partial)


def test_a_position_is_read_by_name_and_stored_as_before():
    """A position names its parts (commit time, source index, commit version), orders as the
    plain tuple did, and a progress record stores it as a list, as 0.1.0 did."""
    commit = arrival.CommitStats((5, 1, 7), None, 1)  # a plain tuple is taken as a position
    assert (commit.position.time, commit.position.source, commit.position.version) == (5, 1, 7)
    assert arrival.Position(5, 1, 7) < arrival.Position(5, 2, 0) < arrival.Position(6, 0, 0)
    progress = Progress(3, None, {1: commit.position}, {}, {1: (commit.position, 2)})
    assert json.loads(progress.to_json())["newest"] == {"1": [5, 1, 7]}
    back = Progress.from_json(progress.to_json())
    assert back.newest[1].version == 7 and back.partial[1][0].time == 5
