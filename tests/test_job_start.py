"""A job starts at one instant: every row committed at or before it, in any source, is history
and is never late, whatever each source's commits before it (docs/semantics.md, "Where a job
starts"). End-to-end: the minimal forms of what went wrong when each source's start took its own
commit's time. The decisions themselves are proven on generated examples in tests/test_index.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from aging import write_commits
from harness import EVERYTHING, create_tables, job, read_output, read_side, write_commit

from streamjoin import delta_io, index
from streamjoin.cli import main
from streamjoin.errors import JobError
from streamjoin.plan import bind
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict


def _started(spec, starts: dict[int, object]):
    return replace(spec, sources=tuple(replace(s, start_at=starts[i]) for i, s in enumerate(spec.sources)))


def test_history_of_two_sources_is_judged_together_live_and_replayed(spark, tmp_path):
    """l holds l1 (0 s) and l2 (100 s) in one commit, r holds r1 (1 s) and r2 (101 s) in one
    commit written after it; l3 and r3 come later. Started at version 1 of each, r1 is history:
    not late against l2's clock (it was, when each source's history sat at its own commit)."""
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("l1", "a", 0, 0), ("l2", "b", 100, 0)])
    write_commit(spark, paths[1], [("r1", "a", 1, 0), ("r2", "b", 101, 0)])
    write_commit(spark, paths[0], [("l3", "c", 200, 0)])
    write_commit(spark, paths[1], [("r3", "c", 201, 0)])
    write_commit(spark, paths[0], [("l4", "d", 300, 0)])  # settles r3
    spec = _started(job(tmp_path, paths, "inner", -5, 5, 10), {0: 1, 1: 1})

    replay(spark, spec, *EVERYTHING)
    expected = {("l1", "r1", 1): 1, ("l2", "r2", 101): 1, ("l3", "r3", 201): 1}
    assert read_output(spark, spec.output.path) == expected
    assert read_side(spark, spec.output.side("late")) == {}

    live = replace(spec, output=replace(spec.output, path=f"{tmp_path}/live"))
    LiveRunner(spark, live, f"{tmp_path}/checkpoint").run()
    assert read_output(spark, live.output.path) == expected

    # One start instant: the later of the two start commits; both sources' history sits there.
    positions = index.update(spark, bind(spark, spec))
    assert positions.starts["l"].commit_ts == positions.starts["r"].commit_ts
    assert {name: e.version for name, e in positions.starts.items()} == {"l": 1, "r": 1}


def test_a_start_given_per_source_takes_in_every_commit_up_to_the_latest_of_them(spark, tmp_path):
    """Started at l's version 1 and r's version 2, l's version 2 (committed before r's) is
    history too: every row committed at or before the start instant is, in any source."""
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("l1", "a", 0, 0)])
    write_commit(spark, paths[1], [("r1", "a", 50, 0)])
    write_commit(spark, paths[0], [("l2", "b", 100, 0)])
    write_commit(spark, paths[1], [("r2", "b", 1, 0), ("r3", "a", 3, 0)])
    write_commit(spark, paths[0], [("l3", "c", 200, 0)])  # settles the history
    spec = _started(job(tmp_path, paths, "inner", -5, 5, 10), {0: 1, 1: 2})
    positions = index.update(spark, bind(spark, spec))
    assert {name: e.version for name, e in positions.starts.items()} == {"l": 2, "r": 2}
    replay(spark, spec, *EVERYTHING)
    assert read_output(spark, spec.output.path) == {("l1", "r3", 3): 1}
    assert read_side(spark, spec.output.side("late")) == {}


def test_a_new_job_over_week_old_inputs_started_at_their_newest_versions_joins_all_of_them(spark, tmp_path):
    """Eight-day-old inputs, committed every six hours, interleaved; a job started now at each
    source's newest version holds all of it as history and writes every pair (it wrote none
    when the sources' histories were judged one after the other)."""
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(days=8)
    paths = {0: f"{tmp_path}/l", 1: f"{tmp_path}/r"}
    ddl = "id string, k string, t timestamp, v int"
    props = {"delta.enableChangeDataFeed": "true", "delta.enableRowTracking": "true"}
    for side in (0, 1):
        commits = []
        for n in range(4):  # four commits of four rows each, six hours apart, r an hour after l
            when = base + timedelta(hours=6 * n + side)
            rows = [
                (
                    f"{'lr'[side]}{n}{k}",
                    f"k{n}{k}",
                    (base + timedelta(hours=6 * n, seconds=side)).replace(tzinfo=None),
                    0,
                )
                for k in range(4)
            ]
            commits.append((when, rows))
        write_commits(spark, paths[side], commits, ddl, props)
    newest = {side: delta_io.latest_version(spark, paths[side]) for side in (0, 1)}
    spec = _started(job(tmp_path, paths, "inner", -5, 5, 60), newest)
    replay(spark, spec, *EVERYTHING)
    pairs = read_output(spark, spec.output.path)
    assert sum(pairs.values()) == 16
    assert {(l[1:], r[1:]) for l, r, _ in pairs} == {
        (f"{n}{k}", f"{n}{k}") for n in range(4) for k in range(4)
    }
    assert read_side(spark, spec.output.side("late")) == {}


def test_a_changed_start_is_refused_naming_both_starts_and_reset_lets_it_begin_again(spark, tmp_path, capsys):
    paths = create_tables(spark, tmp_path)
    for n in range(3):
        write_commit(spark, paths[0], [(f"l{n}", "a", n, 0)])
        write_commit(spark, paths[1], [(f"r{n}", "a", n, 0)])
    document = {
        "name": "eq",
        "sources": {name: {"path": paths[i], "kind": "stream", "time": "t"} for i, name in enumerate("lr")},
        "from": "l",
        "joins": [{"join": "r", "type": "inner", "on": "l.k = r.k", "within": "5s", "grace": "10s"}],
        "output": {"path": f"{tmp_path}/out"},
    }
    first = _started(spec_from_dict(document), {0: 1, 1: 1})
    replay(spark, first, *EVERYTHING)
    index.update(spark, bind(spark, first))  # the same start again: fine
    index.update(spark, bind(spark, spec_from_dict(document)))  # none declared: the pinned one
    moved = _started(first, {0: 2, 1: 2})
    with pytest.raises(JobError) as refused:
        index.update(spark, bind(spark, moved))
    text = str(refused.value)
    assert "l: 2, r: 2" in text and "l at version 1, r at version 1" in text
    assert "streamjoin reset <job file> --yes" in text

    job_file = tmp_path / "eq.yaml"
    job_file.write_text(
        yaml.safe_dump(
            document
            | {"sources": {name: {**body, "start_at": 2} for name, body in document["sources"].items()}}
        )
    )
    assert main(["reset", str(job_file)]) == 2  # without --yes nothing goes
    assert delta_io.exists(spark, f"{tmp_path}/out_index")
    assert main(["reset", str(job_file), "--yes"]) == 0
    said = capsys.readouterr().out
    assert f"{tmp_path}/out_index" in said and f"{tmp_path}/out_late" not in said  # never written
    assert not delta_io.exists(spark, f"{tmp_path}/out") and not delta_io.exists(
        spark, f"{tmp_path}/out_index"
    )
    positions = index.update(spark, bind(spark, moved))
    assert {name: e.version for name, e in positions.starts.items()} == {"l": 2, "r": 2}
