"""A lease on a live checkpoint: one process at a time runs it.

Two streaming queries on one checkpoint corrupt it (Spark refuses the second only once it has
rewritten state files the first then fails to read). So a live runner takes the checkpoint's
lease before it reads or writes anything there: a file created atomically (O_EXCL) that names
the process holding it and since when. The lease of a process that has died (killed, crashed) is
taken over; a live one is refused with a message naming it. Checkpoints are local folders, so
"has died" is a question the operating system answers.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import pendulum

from streamjoin.errors import JobError

# Leases this process holds, by path: whether the runner holding each still runs (a runner that
# stopped without releasing, e.g. a query started with `start()` that has ended, has let it go).
_HELD: dict[str, Callable[[], bool]] = {}


class CheckpointInUseError(JobError):
    """Another live runner holds the checkpoint's lease."""


def acquire(path: Path, running: Callable[[], bool]) -> str:
    """Take the lease at `path` for a runner of this process (`running()`: whether it still runs);
    returns the token that releases it. Refuses while another live runner holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # a stale lease is removed and the creation tried again
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if holder is not None and _alive(path, holder):
                raise CheckpointInUseError(
                    f"checkpoint {path.parent.parent} is in use by process {holder['pid']} on {holder['host']} "
                    f"since {holder['since']}; wait for it to stop (or stop it), or give this run another "
                    f"--checkpoint. If that process is gone for good, delete {path}"
                ) from None
            path.unlink(missing_ok=True)
            continue
        token = str(uuid.uuid4())
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": pendulum.now("UTC").isoformat(),
            "started": _process_start(os.getpid()),
            "token": token,
        }
        with os.fdopen(descriptor, "w") as file:
            json.dump(holder, file)
        _HELD[str(path)] = running
        return token
    raise CheckpointInUseError(f"could not take the lease {path}: other runners keep taking it; try again")


def release(path: Path, token: str) -> None:
    """Give the lease back, if `token` still holds it."""
    holder = _read(path)
    if holder is not None and holder.get("token") == token:
        path.unlink(missing_ok=True)
    _HELD.pop(str(path), None)


def _read(path: Path) -> dict | None:
    """The holder a lease file names; None when it is gone or unreadable (caught mid-write)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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
