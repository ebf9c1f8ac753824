"""Jobs on object storage: a real S3 server on loopback (S3Proxy, tests/s3server.py), every table and
the live checkpoint on `s3a://` paths, the same commands as on local folders and the same results."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections import Counter
from datetime import datetime

import pytest
from aging import session_conf
from conftest import append, at
from s3server import BUCKET, server
from test_verify import EVENTS, HOUR, hour_rows
from test_verify import JOB as VERIFIED_JOB

from streamjoin import atomic, delta_io, lease
from streamjoin.cli import main
from streamjoin.jobfile import load_job
from streamjoin.runners.live import MARKER

JOB = VERIFIED_JOB.replace("name: verified", "name: stored")


@pytest.fixture(scope="module")
def s3(spark):
    """The S3 server, and the suite's session told how to reach it (Hadoop settings at run time)."""
    with server() as running:
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in running.hadoop_conf().items():
            conf.set(key, value)
        yield running


def add_hours(spark, root: str, hours: range, closer: int) -> None:
    """The rows of `hours`, then a left row at second `closer` that closes every window before it."""
    for hour in hours:
        left, right = hour_rows(hour)
        left.append((None, f"N{hour}", at(hour * HOUR + 50)))  # no key: rejected
        append(spark, f"{root}/l", left, EVENTS)
        append(spark, f"{root}/r", right, EVENTS)
    append(spark, f"{root}/l", [(f"z{closer}", f"Z{closer}", at(closer))], EVENTS)


def rows(spark, location: str) -> Counter:
    return Counter(tuple(r) for r in delta_io.read_snapshot(spark, location).collect())


def recorded(spark, location: str) -> Counter:
    """A side table's rows without the wall-clock times they were written at (none before 2025)."""
    frame = delta_io.read_snapshot(spark, location)
    kept = [f.name for f in frame.schema.fields if f.name not in ("recorded_at", "committed_at")]
    return Counter(
        tuple(v for v in r if not (isinstance(v, datetime) and v.year > 2025))
        for r in frame.select(*kept).collect()
    )


def test_a_job_on_object_storage_writes_what_it_writes_on_local_folders(
    spark, s3, tmp_path, capsys, monkeypatch
):
    """Sources, output, side tables, index, journal, metrics and the live checkpoint all on the S3
    server (`--root s3a://...`): a backfill of two hours, a hand-off to live there, live over the
    commits since and verify of the last hour all succeed through the CLI, the output and side
    tables hold what one replay of the same commits on local folders holds, and nothing of the run
    lands on local disk."""
    job_file, root, local = str(tmp_path / "stored.yaml"), f"s3a://{BUCKET}/stored", str(tmp_path / "local")
    (tmp_path / "stored.yaml").write_text(JOB)
    monkeypatch.chdir(tmp_path)  # a path wrongly taken as local lands here, where it is looked for
    checkpoint = f"{root}/ck"
    first, then = (range(2), 2 * HOUR + 1800), (range(2, 4), 6 * HOUR)  # no row after a closer is late
    add_hours(spark, root, *first)
    backfill = ["backfill", job_file, "--start", "2024-01-01", "--end", "2024-01-01T02:00", "--no-validate"]
    assert main(["--root", root, *backfill]) == 0
    handoff = ["handoff", job_file, "--at", "2024-01-01T02:00", "--checkpoint", checkpoint]
    assert main(["--root", root, *handoff]) == 0
    add_hours(spark, root, *then)
    assert main(["--root", root, "stream", job_file, "--checkpoint", checkpoint]) == 0
    capsys.readouterr()
    # Verify over the hour live alone wrote (the replay below compares all four hours).
    verify = ["verify", job_file, "--start", "2024-01-01T03:00", "--end", "2024-01-01T04:00"]
    assert main(["--root", root, *verify, "--checkpoint", checkpoint, "--json"]) == 0
    verified = json.loads(capsys.readouterr().out)
    assert verified["equal"] and verified["slices"][0]["rows_live"] > 0

    assert os.listdir(tmp_path) == ["stored.yaml"]  # the run on S3 wrote nothing on local disk

    for hours, closer in (first, then):
        add_hours(spark, local, hours, closer)
    replay = ["replay", job_file, "--start", "2024-01-01", "--end", "2024-01-02"]
    assert main(["--root", local, *replay]) == 0
    stored, replayed = load_job(job_file, root=root).output, load_job(job_file, root=local).output
    assert rows(spark, stored.location) == rows(spark, replayed.location)
    assert sum(rows(spark, stored.location).values()) == 12  # the four hours' left rows
    # The rejected rows as rows (the times they were recorded at differ); no row was late.
    assert recorded(spark, stored.side("rejected")) == recorded(spark, replayed.side("rejected"))
    assert delta_io.read_snapshot(spark, stored.side("rejected")).count() == 4  # the keyless rows
    # Every table the local replay made (index, journal, metrics, ...) is on S3 too, with the checkpoint.
    assert set(os.listdir(local)) | {"ck"} <= set(atomic.names(root))
    assert MARKER in atomic.names(checkpoint)
    kept = set(atomic.names(f"{checkpoint}/streamjoin"))
    assert {"progress", "state"} <= kept and "lease.json" not in kept  # the lease was given back
    assert (s3.folder / BUCKET / "stored" / "out" / "_delta_log").is_dir()


def test_a_live_checkpoint_lease_on_object_storage_is_exclusive_and_taken_over_when_stale(spark, s3):
    """The lease on S3: a second taker is refused while the first holds it; a lease naming a process
    that has died is taken over (replaced while it is still the one read); given back, it is gone."""
    path = f"s3a://{BUCKET}/leases/ck/streamjoin/lease.json"
    token = lease.acquire(path, lambda: True)
    with pytest.raises(lease.CheckpointInUseError, match=f"in use by process {os.getpid()}"):
        lease.acquire(path, lambda: True)
    lease.release(path, token)
    assert not atomic.exists(path)

    dead = {"pid": 2**22 + 1, "host": socket.gethostname(), "since": "2024-01-01T00:00:00Z", "token": "x"}
    atomic.create_file(path, json.dumps(dead))
    with pytest.raises(FileExistsError):
        atomic.create_file(path, json.dumps(dead))  # created only if absent (a conditional PUT)
    token = lease.acquire(path, lambda: True)
    assert json.loads(atomic.read_text(path))["token"] == token
    lease.release(path, token)
    assert not atomic.exists(path)


def test_a_second_driver_on_an_s3_output_is_refused_until_the_first_is_gone(spark, s3, tmp_path, capsys):
    """Delta's default S3 log store keeps a table's commits safe only while one Spark driver writes
    it: a replay of a job whose tables another process's driver holds (its driver lease,
    `<output>_driver.json`) is refused before it writes anything, naming that process and what to
    do; once that process is gone, its lease is taken over and the replay runs. Local folders take
    no such lease, and neither does S3 with Delta's DynamoDB log store."""
    job_file, root = str(tmp_path / "stored.yaml"), f"s3a://{BUCKET}/guarded"
    (tmp_path / "stored.yaml").write_text(JOB)
    add_hours(spark, root, range(1), HOUR + 1800)
    output = load_job(job_file, root=root).output.location
    assert delta_io.single_driver_store(spark, output) and not delta_io.single_driver_store(
        spark, str(tmp_path)
    )
    replay = ["--root", root, "replay", job_file, "--start", "2024-01-01", "--end", "2024-01-01T01:00"]
    other = subprocess.Popen(["sleep", "300"])  # a driver of this machine, still running
    try:
        holder = {
            "pid": other.pid,
            "host": socket.gethostname(),
            "since": "2024-01-01T00:00:00Z",
            "token": "x",
        }
        atomic.create_file(lease.driver_lease(output), json.dumps(holder))
        assert main(replay) == 2
        said = capsys.readouterr().err
        assert (
            f"output {output} is being written by process {other.pid}" in said
            and "DynamoDB log store" in said
        )
        assert not delta_io.exists(spark, output)  # refused before it wrote anything
    finally:
        other.kill()
        other.wait()
    assert main(replay) == 0
    assert rows(spark, output) and not atomic.exists(lease.driver_lease(output))  # written, then given back
    with session_conf(spark, {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3DynamoDBLogStore"}):
        assert not delta_io.single_driver_store(spark, output)


def test_a_url_root_is_joined_with_relative_paths_as_url_paths(tmp_path):
    """`--root s3a://bucket/prefix` puts each relative path under the URL (it once became a local
    folder named after the URL, under the working directory); absolute paths and URLs stay."""
    job_file = tmp_path / "stored.yaml"
    job_file.write_text(JOB.replace("path: r,", f"path: {tmp_path}/r,").replace("path: out", "path: ../out"))
    spec = load_job(job_file, root=f"s3a://{BUCKET}/prefix/")
    assert [s.location for s in spec.sources] == [f"s3a://{BUCKET}/prefix/l", f"{tmp_path}/r"]
    assert spec.output.location == f"s3a://{BUCKET}/out"
    assert spec.output.side("metrics") == f"s3a://{BUCKET}/out_metrics"
