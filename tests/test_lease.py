"""The checkpoint lease (streamjoin/lease.py), without Spark: who holds it, and when it is free."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamjoin.lease import CheckpointInUseError, acquire, driver_lease, one_driver, release

TRIALS = 300


def holder(path) -> dict:
    return json.loads(path.read_text())


def test_a_live_holder_is_refused_by_name_and_a_released_lease_is_free(tmp_path):
    path = tmp_path / "ck" / "streamjoin" / "lease.json"
    token = acquire(path, lambda: True)
    assert holder(path)["pid"] == os.getpid() and holder(path)["token"] == token
    with pytest.raises(
        CheckpointInUseError, match=rf"checkpoint {tmp_path / 'ck'} is in use by process {os.getpid()}"
    ) as refused:
        acquire(path, lambda: True)
    # What it advises works: another checkpoint on the same output would be refused (its rows).
    assert "give the copy another output" in str(refused.value) and "--checkpoint" not in str(refused.value)
    release(path, "someone else's token")
    assert path.exists()  # only the holder's token releases it
    release(path, token)
    assert not path.exists()
    assert acquire(path, lambda: True) != token


def test_a_runner_of_this_process_that_stopped_has_let_the_lease_go(tmp_path):
    path = tmp_path / "lease.json"
    first = acquire(path, lambda: False)  # e.g. a query started with start() that has ended
    second = acquire(path, lambda: True)
    assert holder(path)["token"] == second != first


def dead_holder() -> dict:
    """A lease naming a process of this machine that has ended."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return {"pid": int(child.stdout), "host": os.uname().nodename, "since": "then", "token": "t"}


def test_the_lease_of_a_dead_process_is_taken_over(tmp_path):
    path = tmp_path / "lease.json"
    path.write_text(json.dumps(dead_holder()))
    token = acquire(path, lambda: True)
    assert holder(path)["token"] == token and holder(path)["pid"] == os.getpid()


def test_a_living_process_of_another_start_time_is_a_reused_pid(tmp_path):
    """The pid is alive but started at another time than the holder did: the holder is gone."""
    path = tmp_path / "lease.json"
    parent = os.getppid()
    lease = {"pid": parent, "host": os.uname().nodename, "since": "then", "token": "t"}
    path.write_text(json.dumps({**lease, "started": "0"}))
    assert holder(path)["pid"] == parent
    acquire(path, lambda: True)
    assert holder(path)["pid"] == os.getpid()
    path.write_text(json.dumps(lease))  # no start time recorded: a living pid holds
    with pytest.raises(CheckpointInUseError, match=f"process {parent} "):
        acquire(path, lambda: True)


def contend(root: str, trials: int, barrier, results) -> None:
    """One of two processes: per trial, wait for the other at the barrier, then try the trial's lease
    at once; report which trials it holds. Both live on, so every lease taken is still held."""
    held = []
    for trial in range(trials):
        barrier.wait()
        try:
            acquire(Path(root, str(trial), "lease.json"), lambda: True)
        except CheckpointInUseError:
            continue
        held.append(trial)
    results.put(held)
    barrier.wait()  # the holders stay alive until both have reported


def holders_per_trial(root, trials: int) -> list[int]:
    """How many of two processes, trying each trial's lease at the same moment, came to hold it."""
    context = multiprocessing.get_context("spawn")  # the test process may run a JVM: no fork
    barrier, results = context.Barrier(2), context.Queue()
    processes = [
        context.Process(target=contend, args=(str(root), trials, barrier, results)) for _ in range(2)
    ]
    for process in processes:
        process.start()
    held = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    return [sum(trial in h for h in held) for trial in range(trials)]


@pytest.mark.parametrize("before", ["none", "dead holder"])
def test_two_processes_taking_one_lease_at_the_same_moment_never_both_hold_it(tmp_path, before):
    """Hundreds of races between two processes, on a free lease and on a dead holder's lease that
    both find stale: exactly one holds it each time."""
    if before == "dead holder":
        stale = json.dumps(dead_holder())
        for trial in range(TRIALS):
            (tmp_path / str(trial)).mkdir()
            (tmp_path / str(trial) / "lease.json").write_text(stale)
    counts = holders_per_trial(tmp_path, TRIALS)
    doubled = [trial for trial, n in enumerate(counts) if n > 1]
    assert not doubled, f"{len(doubled)} of {TRIALS} leases held twice"
    assert counts == [1] * TRIALS


def test_a_lease_file_naming_no_holder_is_stale_only_once_it_is_old(tmp_path):
    """An empty or damaged lease file may be one being written (by a release that wrote the file
    after creating it): refused while it is young, taken over once it is old."""
    path = tmp_path / "ck" / "streamjoin" / "lease.json"
    path.parent.mkdir(parents=True)
    for content in ("", '{"pid": 12', "[]"):
        path.write_text(content)
        with pytest.raises(CheckpointInUseError, match="names no holder yet"):
            acquire(path, lambda: True)
        assert path.read_text() == content
        old = time.time() - 60
        os.utime(path, (old, old))
        token = acquire(path, lambda: True)
        assert holder(path)["token"] == token
        release(path, token)


def test_a_driver_lease_is_shared_within_a_process_and_refused_to_another(tmp_path):
    """An output's driver lease (`one_driver`, on stores that let one Spark driver write a table):
    the holders of one process share it (one process is one driver), another process is refused
    with what to do, and the last holder's going gives it back."""
    output = str(tmp_path / "out")
    other = [
        sys.executable,
        "-c",
        f"from streamjoin import lease; lease.hold_driver({output!r}); print('held')",
    ]
    with one_driver(output, single_driver=True):
        with one_driver(output, single_driver=True):  # a backfill's replay inside its backfill
            assert holder(Path(driver_lease(output)))["pid"] == os.getpid()
        refused = subprocess.run(other, capture_output=True, text=True)
        assert refused.returncode != 0 and "OutputInUseError" in refused.stderr
        said = refused.stderr.strip().splitlines()[-1]
        assert f"output {output} is being written by process {os.getpid()}" in said
        assert "one Spark driver at a time" in said and "DynamoDB log store" in said
    assert not Path(driver_lease(output)).exists()
    taken = subprocess.run(other, capture_output=True, text=True)
    assert taken.returncode == 0 and taken.stdout.strip() == "held"
    left = holder(Path(driver_lease(output)))  # by a process that has ended without giving it back
    with one_driver(output, single_driver=False):  # a store whose commits are exclusive: nothing taken
        assert holder(Path(driver_lease(output))) == left
    with one_driver(output, single_driver=True):  # its holder is gone: taken over
        assert holder(Path(driver_lease(output)))["pid"] == os.getpid() != left["pid"]
    assert not Path(driver_lease(output)).exists()
