"""A lease on a live checkpoint: one process at a time runs it.

Two streaming queries on one checkpoint corrupt it (Spark refuses the second only once it has
rewritten state files the first then fails to read). So a live runner takes the checkpoint's
lease before it reads or writes anything there: a file that names the process holding it and
since when, created with its content at once (`atomic.create_file`), so that no one ever reads it
empty. The lease of a process that has died (killed, crashed) is taken over; a live one is
refused with a message naming it. Checkpoints are local folders, so "has died" is a question the
operating system answers. Taking a lease (over) and giving one back happen under a lock (`flock`
on `<lease>.lock`), so that two processes that both find a dead holder's lease cannot both take it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pendulum

from streamjoin import atomic
from streamjoin.errors import JobError

# Leases this process holds, by path: whether the runner holding each still runs (a runner that
# stopped without releasing, e.g. a query started with `start()` that has ended, has let it go).
_HELD: dict[str, Callable[[], bool]] = {}
# A lease file that names no holder (empty, not JSON) is being written by a process of an older
# release, or was damaged: it is only taken for stale once it is older than this.
_UNREADABLE_GRACE_S = 10.0


class CheckpointInUseError(JobError):
    """Another live runner holds the checkpoint's lease."""


def acquire(path: Path, running: Callable[[], bool]) -> str:
    """Take the lease at `path` for a runner of this process (`running()`: whether it still runs);
    returns the token that releases it. Refuses while another live runner holds it."""
    token = str(uuid.uuid4())
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": pendulum.now("UTC").isoformat(),
        "started": _process_start(os.getpid()),
        "token": token,
    }
    with _locked(path):
        for _ in range(3):  # a stale lease is removed and the creation tried again
            try:
                atomic.create_file(path, json.dumps(holder), durable=False)  # void after a crash
            except FileExistsError:
                _remove_stale(path)  # refuses while its holder lives
                continue
            _HELD[str(path)] = running
            return token
    raise CheckpointInUseError(f"could not take the lease {path}: other runners keep taking it; try again")


def release(path: Path, token: str) -> None:
    """Give the lease back, if `token` still holds it (nothing to give back once its checkpoint is
    gone: a run refused before it processed anything removes the checkpoint it made)."""
    if not path.parent.exists():
        _HELD.pop(str(path), None)
        return
    with _locked(path):
        holder = _read(path)
        if holder is not None and holder.get("token") == token:
            path.unlink(missing_ok=True)
    _HELD.pop(str(path), None)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the lease's lock (an exclusive `flock` on `<lease>.lock`, let go when the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path.with_name(f"{path.name}.lock"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # also lets the lock go


def _remove_stale(path: Path) -> None:
    """Remove the lease at `path` if its holder is gone; refuse while it holds (or may: see
    `_UNREADABLE_GRACE_S`)."""
    holder = _read(path)
    if holder is None:
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return  # given back since
        if age < _UNREADABLE_GRACE_S:
            raise CheckpointInUseError(
                f"checkpoint {path.parent.parent} has a lease {path} that names no holder yet (another runner "
                f"may be taking it); try again in {_UNREADABLE_GRACE_S:.0f} seconds. A lease file that stays so "
                "is taken for stale then"
            )
    elif _alive(path, holder):
        raise CheckpointInUseError(
            f"checkpoint {path.parent.parent} is in use by process {holder['pid']} on {holder.get('host')} "
            f"since {holder.get('since')}; wait for it to stop, or stop it (Ctrl-C, or kill {holder['pid']}): "
            "an output has one live writer. To run the job a second time at once, copy its job file and give "
            f"the copy another output. If that process is gone for good, delete {path}"
        )
    path.unlink(missing_ok=True)


def _read(path: Path) -> dict | None:
    """The holder a lease file names; None when it is gone or names none (empty, damaged)."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else None


def _alive(path: Path, holder: dict) -> bool:
    """Whether the process a lease names still holds it."""
    if holder.get("host") != socket.gethostname():
        return True  # another machine's process: nothing here can tell, so it holds
    pid = int(holder.get("pid", -1))
    if pid == os.getpid():
        running = _HELD.get(str(path))
        return running is not None and running()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    started = holder.get("started")
    return started is None or started == _process_start(pid)  # else the pid was reused


def _process_start(pid: int) -> str | None:
    """When the process started, in clock ticks since boot (Linux); tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]
