"""The same job on a real Spark standalone cluster (infra/spark-cluster.sh) and locally: same rows, same counts.

The test process holds a local session, so the cluster run is the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import create_tables, read_output, read_side, with_output, write_commit
from spark_cluster import ONE_SMALL_REPLAY, cluster_script, finished_apps, free_ports, master_view

from streamjoin.jobfile import load_job
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.timeutil import parse_instant

pytestmark = pytest.mark.slow  # a standalone master and worker of their own

CLI = Path(sys.executable).with_name("streamjoin")
START, END = "2023-12-31", "2100-01-01"  # one slice holding every row
PINNED = {"l": 3, "r": 3}  # l's fourth commit is left out by both runs

JOB = """\
name: cluster_eq
sources:
  l: {path: l, kind: stream, time: t}
  r: {path: r, kind: stream, time: t}
from: l
joins:
  - join: r
    type: full
    on: l.k = r.k
    between: [0s, 10s]
    grace: 5s
select: [l.id AS lid, r.id AS rid]
output: {path: out_cluster}
"""

COMMITS = [  # (side, rows (id, key, seconds after BASE, v)), in commit order
    (0, [("l1", "a", 0, 1), ("l2", "b", 5, 1), ("l3", None, 7, 1)]),  # l3: NULL key, rejected
    (1, [("r1", "a", 3, 1), ("r2", "c", 8, 1)]),
    (0, [("l4", "b", 20, 1)]),
    (1, [("r3", "b", 22, 1), ("r4", "a", 200, 1)]),
    (0, [("l5", "c", 30, 1), ("l6", "a", 198, 1)]),  # l5 is behind the watermark r4 moved to 195 s: late
    (1, [("r5", "a", 205, 1)]),
    (0, [("l7", "a", 200, 1)]),  # r5's partner too, but after the pinned version l=3
]


def test_status_reports_a_running_cluster_and_start_is_idempotent(cluster):
    status = cluster_script("status", cluster["env"])
    assert status.returncode == 0, status.stdout + status.stderr
    assert "master: running" in status.stdout and "worker: running" in status.stdout
    assert f"master URL: {cluster['url']} (alive workers: 1" in status.stdout
    again = cluster_script("start", cluster["env"])
    assert again.returncode == 0 and again.stdout.strip() == f"already running: {cluster['url']}"
    assert len(master_view(cluster)["workers"]) == 1  # no second worker


def test_replay_on_the_cluster_equals_the_local_replay(spark, cluster, tmp_path):
    paths = create_tables(spark, str(tmp_path))
    for side, rows in COMMITS:
        write_commit(spark, paths[side], rows)
    job_file = tmp_path / "cluster_eq.yaml"
    job_file.write_text(JOB)

    ran = subprocess.run(
        [
            str(CLI),
            "--master",
            cluster["url"],
            "--root",
            str(tmp_path),
            "replay",
            str(job_file),
            "--start",
            START,
            "--end",
            END,
            "--versions",
            ",".join(f"{name}={v}" for name, v in PINNED.items()),
            "--log-level",  # Spark's INFO lines back (test_cli.py: off unless asked for)
            "INFO",
        ],
        cwd=tmp_path,
        env=ONE_SMALL_REPLAY,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "cluster_eq replay/exact" in ran.stdout and "adds up: yes" in ran.stdout, ran.stdout
    assert " INFO DAGScheduler: " in ran.stderr, ran.stderr[-2000:]

    # It ran on the cluster: the master filed a finished application, and the worker ran its executor.
    apps = finished_apps(cluster, named="streamjoin")
    assert [(a["name"], a["state"]) for a in apps] == [("streamjoin", "FINISHED")], apps
    executor_logs = list((cluster["state"] / "work" / apps[0]["id"]).glob("*/stderr"))
    assert executor_logs, f"no executor of {apps[0]['id']} in the worker's work folder"

    spec = load_job(job_file, root=tmp_path)
    local = with_output(spec, str(tmp_path / "out_local"))
    metrics = replay(
        spark, local, parse_instant(START), parse_instant(END), RunOptions(mode="exact", versions=PINNED)
    )
    assert metrics.balanced(), metrics.summary()

    remote_out, local_out = str(tmp_path / "out_cluster"), local.output.location
    rows = read_output(spark, remote_out)
    assert rows == read_output(spark, local_out), rows
    pairs = {(lid, rid) for lid, rid, _ in rows}
    assert {("l1", "r1"), ("l4", "r3")} <= pairs  # joined
    assert ("l7", "r5") not in pairs  # l7 is after the pinned version
    late, rejected = (read_side(spark, f"{remote_out}_{side}") for side in ("late", "rejected"))
    assert [json.loads(row)["id"] for _, _, row in late] == ["l5"]
    assert [json.loads(row)["id"] for _, _, row in rejected] == ["l3"]
    assert late == read_side(spark, f"{local_out}_late") and rejected == read_side(
        spark, f"{local_out}_rejected"
    )

    counted = (
        "rows_in",
        "rejected",
        "late",
        "joined",
        "unmatched_emitted",
        "unmatched_dropped",
        "open",
        "unsettled",
        "rows_out",
        "versions",
        "by_source",
    )
    remote_metrics = spark.read.format("delta").load(f"{remote_out}_metrics").collect()
    local_metrics = spark.read.format("delta").load(f"{local_out}_metrics").collect()
    assert len(remote_metrics) == len(local_metrics) == 1
    assert {c: remote_metrics[0][c] for c in counted} == {c: local_metrics[0][c] for c in counted}
    assert json.loads(remote_metrics[0]["versions"]) == PINNED
    assert remote_metrics[0]["rows_out"] == sum(rows.values())


def test_an_unreachable_master_fails_fast_with_what_to_do(tmp_path):
    (port,) = free_ports(1)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB)
    began = time.monotonic()
    ran = subprocess.run(
        [
            str(CLI),
            "--master",
            f"spark://127.0.0.1:{port}",
            "--root",
            str(tmp_path),
            "replay",
            str(job_file),
            "--start",
            START,
            "--end",
            END,
        ],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.monotonic() - began < 30
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert f"Spark master spark://127.0.0.1:{port} does not answer" in ran.stderr
    assert "infra/spark-cluster.sh start" in ran.stderr and "--master" in ran.stderr
    assert "Traceback" not in ran.stderr
