"""Faults and refusals as a user meets them (issue 77, items 7 to 9): a DELETE on an append-only
stream source, commits that left a source's log, a run whose counts do not add up, and storage
that fails (a file where a folder must be, a damaged log commit, a full disk). Each ends in one
line on stderr and the exit code the docs give, never a trace. CLI commands run in-process."""

from __future__ import annotations

import glob
import os
import subprocess
from contextlib import contextmanager

import pytest
from aging import forget_snapshots
from delta.tables import DeltaTable
from harness import create_tables, write_commit

from streamjoin import cli
from streamjoin.delta_io import storage_fault
from streamjoin.errors import StorageError
from streamjoin.metrics import LinkCounts, RunMetrics, SourceCounts

EVERYTHING = ["--start", "2000-01-01", "--end", "2100-01-01"]


def write_job(root, paths: dict[int, str], output: str) -> str:
    """l LEFT JOIN r within [-2s, 5s], as a YAML job file in `root`."""
    job = os.path.join(root, "job.yaml")
    with open(job, "w", encoding="utf-8") as file:
        file.write(
            f"""name: faults
sources:
  l: {{path: {paths[0]}, kind: stream, time: t}}
  r: {{path: {paths[1]}, kind: stream, time: t}}
from: l
joins:
  - join: r
    type: left
    on: l.k = r.k
    between: [-2s, 5s]
    grace: 3s
select: [l.id AS lid, r.id AS rid]
output: {{path: {output}, time: event_time}}
"""
        )
    return job


def one_error_line(capfd) -> str:
    """What the command printed on stderr (Python's and the JVM's), which must be one error line."""
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("streamjoin: error: "), lines
    return lines[0]


def test_a_delete_on_a_stream_source_is_refused_by_the_first_live_batch_that_sees_it(spark, tmp_path, capfd):
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("l1", "a", 0, 0)])
    write_commit(spark, paths[1], [("r1", "a", 1, 0)])
    job = write_job(tmp_path, paths, f"{tmp_path}/out")
    assert cli.main(["stream", job]) == 0
    capfd.readouterr()
    DeltaTable.forPath(spark, paths[0]).delete("id = 'l1'")  # version 2, and nothing after it

    assert cli.main(["stream", job]) == 2
    error = one_error_line(capfd)
    assert "stream source 'l'" in error and "version 2 is a DELETE" in error and "kind: table" in error
    assert cli.main(["replay", job, *EVERYTHING]) == 2  # the replay refuses it the same way
    assert "version 2 is a DELETE" in one_error_line(capfd)


def _row_tracked_tables(spark, root) -> dict[int, str]:
    """Both sources with row tracking, l with commits at versions 1 and 2, r at version 1."""
    paths = create_tables(spark, root, row_tracking=True)
    write_commit(spark, paths[0], [("l0", "a", 0, 0)])
    write_commit(spark, paths[1], [("r0", "a", 1, 0)])
    write_commit(spark, paths[0], [("l1", "a", 9, 0)])
    return paths


def _clean_log(spark, path: str) -> None:
    """What Delta's log clean-up does after the log retention: a checkpoint of the newest version,
    and every commit file before it deleted."""
    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    newest = log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty()).version()
    log.createCheckpointAtVersion(newest)
    for commit in sorted(glob.glob(f"{path}/_delta_log/0*.json"))[:-1]:
        os.remove(commit)
        if os.path.exists(commit[: -len(".json")] + ".crc"):
            os.remove(commit[: -len(".json")] + ".crc")
    forget_snapshots(spark, path)


def test_commits_that_left_the_log_before_the_index_placed_them_are_refused(spark, tmp_path, capfd):
    paths = _row_tracked_tables(spark, tmp_path)
    job = write_job(tmp_path, paths, f"{tmp_path}/out")
    assert cli.main(["index", job]) == 0  # the index reaches l's version 2
    write_commit(spark, paths[0], [("l2", "a", 2, 0)])
    write_commit(spark, paths[0], [("l3", "a", 3, 0)])
    _clean_log(spark, paths[0])  # l's version 3 leaves the log unindexed
    capfd.readouterr()

    assert cli.main(["replay", job, *EVERYTHING]) == 2  # before: "in 5 ... adds up: NO", exit 0
    error = one_error_line(capfd)
    assert "source 'l'" in error and "version 3 has left its Delta log" in error
    assert "--from 4" in error


def test_a_run_that_does_not_add_up_fails_and_names_the_missing_rows(spark, tmp_path, capfd):
    paths = _row_tracked_tables(spark, tmp_path)
    job = write_job(tmp_path, paths, f"{tmp_path}/out")
    assert cli.main(["index", job]) == 0
    # The index loses l's version 1 (damaged by hand): its row is read but placed nowhere.
    DeltaTable.forPath(spark, f"{tmp_path}/out_index").delete("source = 'l' AND version = 1")
    capfd.readouterr()

    assert cli.main(["replay", job, *EVERYTHING]) == 1  # before: exit 0
    captured = capfd.readouterr()
    assert "adds up: NO" in captured.out
    assert captured.err.count("\n") == 1
    assert "does not add up: source l: 1 of its 2 rows in no bucket" in captured.err

    assert cli.main(["backfill", job, *EVERYTHING, "--every", "36500d", "--no-validate"]) == 1
    record = spark.read.format("delta").load(f"{tmp_path}/out_backfill").orderBy("slice_start").collect()
    assert [r.status for r in record] == ["failed", "succeeded"]  # the second slice holds no row
    assert "source l: 1 of its 2 rows in no bucket" in record[0].error


def test_imbalance_names_each_source_and_link_that_does_not_add_up():
    balanced = SourceCounts(rows_in=3, joined=2, late=1)
    short = SourceCounts(rows_in=5, carried_in=1, joined=2, open=1)
    links = [
        LinkCounts("1. JOIN r", reached=4, matched=3, padded=1),
        LinkCounts("2. JOIN s", reached=2, matched=2),
    ]
    run = RunMetrics(
        "j", "replay", "exact", "id", started_at=None, sources={"a": balanced, "b": short}, links=links
    )  # type: ignore[arg-type]

    assert run.imbalance() == [
        "source b: 3 of its 6 rows in no bucket",
        "link 2. JOIN s: reached by 2 rows, handed 4",
    ]
    assert not run.balanced() and "adds up: NO" in run.summary()
    error = run.unbalanced()
    assert error is not None and error.exit_code == 1
    assert (
        RunMetrics("j", "replay", "exact", "id", started_at=None, sources={"a": balanced}).unbalanced()
        is None
    )  # type: ignore[arg-type]


def test_an_output_folder_that_cannot_be_made_ends_replay_and_backfill_in_one_line(spark, tmp_path, capfd):
    """A file where the output's folder must be (what stops a write as root too, where a chmod
    does not)."""
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("l1", "a", 0, 0)])
    (tmp_path / "blocker").write_text("not a folder")
    job = write_job(tmp_path, paths, f"{tmp_path}/blocker/out")
    capfd.readouterr()

    for command in (["replay", job, *EVERYTHING], ["backfill", job, *EVERYTHING, "--every", "36500d"]):
        assert cli.main(command) == 2  # before: an uncaught Py4JJavaError, pages long
        error = [line for line in capfd.readouterr().err.splitlines() if line.startswith("streamjoin")]
        assert len(error) == 1
        assert f"under {tmp_path}/blocker, which is a file" in error[0]
        assert "a file stands where a folder must be" in error[0] and "then run the command again" in error[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only folder; the test above covers it")
def test_a_read_only_output_folder_ends_replay_in_one_line(spark, tmp_path, capfd):
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("l1", "a", 0, 0)])
    (tmp_path / "locked").mkdir(mode=0o555)
    job = write_job(tmp_path, paths, f"{tmp_path}/locked/out")
    capfd.readouterr()
    assert cli.main(["replay", job, *EVERYTHING]) == 2
    assert "permission denied" in one_error_line(capfd)


def test_a_damaged_source_commit_is_refused_by_explain_and_replay(spark, tmp_path, capfd):
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("l1", "a", 0, 0)])
    write_commit(spark, paths[0], [("l2", "a", 2, 0)])
    commit = f"{paths[0]}/_delta_log/{2:020d}.json"
    with open(commit, "r+", encoding="utf-8") as file:  # cut in the middle of its second action
        file.truncate(len(file.read()) // 2)
    job = write_job(tmp_path, paths, f"{tmp_path}/out")
    capfd.readouterr()

    for command in (["explain", job], ["replay", job, *EVERYTHING]):
        assert cli.main(command) == 2  # before: explain exit 0; replay an uncaught Py4JJavaError
        error = one_error_line(capfd)
        assert f"table {paths[0]}: commit 2 ({commit}) of its Delta log is damaged" in error
        assert "Restore that file" in error


def test_a_full_disk_is_said_with_the_file_and_what_to_do():
    """/dev/full answers every write with ENOSPC: a real full disk, for Python's side of a run."""
    with pytest.raises(OSError) as raised, open("/dev/full", "w", encoding="utf-8") as file:
        file.write("x")
    error = storage_fault(raised.value)
    assert isinstance(error, StorageError)
    assert "the disk is full (no space left on device). To go on, free space on that disk" in str(error)


@contextmanager
def mounted(folder, options: str):
    """A tmpfs mounted at `folder` with `options`, unmounted after; skips the test where this
    process may not mount (not root, or a container without the capability)."""
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.parametrize(
    ("options", "said"),
    [("size=64k", "the disk is full (no space left on device)"), ("ro", "the file system is read-only")],
)
def test_an_output_on_a_full_or_read_only_disk_ends_replay_in_one_line(spark, tmp_path, capfd, options, said):
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("l1", "a", 0, 0)])
    with mounted(tmp_path / "disk", options) as disk:
        if "size" in options:  # filled to the last byte
            with pytest.raises(OSError), open(disk / "filler", "wb") as filler:
                while True:
                    filler.write(bytes(4096))
                    filler.flush()
        job = write_job(tmp_path, paths, f"{disk}/out")
        capfd.readouterr()
        assert cli.main(["replay", job, *EVERYTHING]) == 2
        error = one_error_line(capfd)
    assert f"table {disk}/out" in error and said in error and "then run the command again" in error
