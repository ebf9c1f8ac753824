"""A Spark standalone cluster on loopback for the tests that run on one (infra/spark-cluster.sh):
one master and one worker on free ports, started once per test process (conftest's `cluster`)
and stopped at its end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from conftest import SHORT_LIVED_JVM

SCRIPT = Path(__file__).resolve().parent.parent / "infra" / "spark-cluster.sh"

# Delta rebuilds a table's state with 50 tasks by default (get_spark lowers it for local masters
# only); on a small test worker that is much of the run. The executor lives for one small replay,
# too briefly for C2's code to repay its compilation, so it compiles with C1 alone, as the tests'
# short-lived drivers do (conftest.SHORT_LIVED_JVM): the test took 132 CPU-seconds instead of 150.
ONE_SMALL_REPLAY = {
    **os.environ,
    "PYSPARK_SUBMIT_ARGS": "--conf spark.databricks.delta.snapshotPartitions=2 "
    f"--conf spark.executor.defaultJavaOptions={SHORT_LIVED_JVM} pyspark-shell",
}


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports nobody listens on (held open together so they differ)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def cluster_script(command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), command], env=env, check=False, capture_output=True, text=True, timeout=180
    )


@contextmanager
def running_cluster(state: Path) -> Iterator[dict]:
    """One master and one worker on free loopback ports, their files under `state`, stopped even if
    a test fails (conftest's `cluster` fixture holds one for a test module)."""
    master, master_ui, worker, worker_ui = free_ports(4)
    env = {
        **os.environ,
        "STREAMJOIN_MASTER_PORT": str(master),
        "STREAMJOIN_MASTER_WEBUI_PORT": str(master_ui),
        "STREAMJOIN_WORKER_PORT": str(worker),
        "STREAMJOIN_WORKER_WEBUI_PORT": str(worker_ui),
        "STREAMJOIN_WORKER_CORES": "2",
        "STREAMJOIN_WORKER_MEMORY": "1g",
        "STREAMJOIN_CLUSTER_DIR": str(state),
        # The master and worker live for a test file and do little: C1 alone, as the executor.
        "SPARK_DAEMON_JAVA_OPTS": SHORT_LIVED_JVM,
    }
    try:
        started = cluster_script("start", env)
        assert started.returncode == 0, started.stdout + started.stderr
        url = started.stdout.strip().splitlines()[-1]
        assert url == f"spark://127.0.0.1:{master}"
        yield {"url": url, "status": f"http://127.0.0.1:{master_ui}/json/", "state": state, "env": env}
    finally:
        stopped = cluster_script("stop", env)
        assert stopped.returncode == 0, stopped.stderr
        assert not list(state.glob("*.pid"))
        again = cluster_script("stop", env)  # nothing left to stop: still fine
        assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr


def master_view(cluster) -> dict:
    with urllib.request.urlopen(cluster["status"], timeout=5) as answer:
        return json.load(answer)


def finished_apps(cluster, named: str, wait_s: float = 30.0) -> list[dict]:
    """The master's completed applications `named` (the cluster is shared: conftest's fixture),
    waiting a little for a just-ended driver to be filed."""
    deadline = time.monotonic() + wait_s
    while True:
        apps = [app for app in master_view(cluster)["completedapps"] if app["name"] == named]
        if apps or time.monotonic() > deadline:
            return apps
        time.sleep(0.2)
