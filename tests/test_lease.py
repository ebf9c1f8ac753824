"""The checkpoint lease (streamjoin/lease.py), without Spark: who holds it, and when it is free."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streamjoin.lease import CheckpointInUseError, acquire, release


def holder(path) -> dict:
    return json.loads(path.read_text())


def test_a_live_holder_is_refused_by_name_and_a_released_lease_is_free(tmp_path):
    path = tmp_path / "ck" / "streamjoin" / "lease.json"
    token = acquire(path, lambda: True)
    assert holder(path)["pid"] == os.getpid() and holder(path)["token"] == token
    with pytest.raises(
        CheckpointInUseError, match=rf"checkpoint {tmp_path / 'ck'} is in use by process {os.getpid()}"
    ):
        acquire(path, lambda: True)
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


def test_the_lease_of_a_dead_process_is_taken_over(tmp_path):
    path = tmp_path / "lease.json"
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(child.stdout)
    path.write_text(json.dumps({"pid": dead, "host": os.uname().nodename, "since": "then", "token": "t"}))
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
