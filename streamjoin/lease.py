"""A lease on a live checkpoint: one process at a time runs it.

Two streaming queries on one checkpoint corrupt it (Spark refuses the second only once it has
rewritten state files the first then fails to read). So a live runner takes the checkpoint's
lease before it reads or writes anything there: a file that names the process holding it and
since when, created with its content at once (`atomic.create_file`), so that no one ever reads it
empty. The lease of a process that has died (killed, crashed) is taken over; a live one is
refused with a message naming it: "has died" is a question the operating system answers for a
process of this machine; one of another machine holds until it gives the lease back. In a local
folder, taking a lease (over) and giving one back happen under a lock (`flock` on `<lease>.lock`),
so that two processes that both find a dead holder's lease cannot both take it. On another Hadoop
file system (a checkpoint on object storage) there is no such lock: the lease is created only if
absent, and a dead holder's lease is replaced only while it is still the one read (S3's entity
tag; `hadoop_files.create`), so there too exactly one of two such processes takes it.

The same lease keeps one Spark driver at a time writing a job's tables where Delta's log store
allows no more (S3 with Delta's default log store: `delta_io.single_driver_store`): every run that
writes them (a replay, a backfill, the index step, a live runner) holds `<output>_driver.json`
while it writes (`one_driver`). Within one process, nested and concurrent holders share it: one
process is one driver, whose commits Delta's log store orders itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pendulum

from streamjoin import atomic, hadoop_files
from streamjoin.atomic import Location
from streamjoin.errors import JobError
from streamjoin.hadoop_files import is_remote

# Leases this process holds, by path: whether the runner holding each still runs (a runner that
# stopped without releasing, e.g. a query started with `start()` that has ended, has let it go).
_HELD: dict[str, Callable[[], bool]] = {}
# A lease file that names no holder (empty, not JSON) is being written by a process of an older
# release, or was damaged: it is only taken for stale once it is older than this.
_UNREADABLE_GRACE_S = 10.0


class CheckpointInUseError(JobError):
    """Another live runner holds the checkpoint's lease."""


class OutputInUseError(JobError):
    """Another process's Spark driver writes the job's tables on a store that allows one at a time."""


DRIVER_LEASE_SUFFIX = "_driver.json"  # <output>_driver.json: the driver lease of a job's tables
# Driver leases this process holds: lease path -> (token, how many holders inside this process),
# changed under a lock (runs of one process may take them from several threads).
_DRIVERS: dict[str, tuple[str, int]] = {}
_DRIVERS_LOCK = threading.Lock()


def driver_lease(output: str) -> str:
    """Where the driver lease of the job writing `output` lives: beside its tables."""
    return f"{output.rstrip('/')}{DRIVER_LEASE_SUFFIX}"


def hold_driver(output: str) -> None:
    """Take the driver lease of `output`'s job for this process, or join this process's holders;
    refuses (OutputInUseError) while another process's driver holds it. `let_go_driver` ends it."""
    path = driver_lease(output)
    with _DRIVERS_LOCK:
        held = _DRIVERS.get(path)
        if held is not None:
            _DRIVERS[path] = (held[0], held[1] + 1)
            return
        token = acquire(path, lambda: path in _DRIVERS)
        _DRIVERS[path] = (token, 1)


def let_go_driver(output: str) -> None:
    """One holder of this process lets `output`'s driver lease go; the last one gives it back."""
    path = driver_lease(output)
    with _DRIVERS_LOCK:
        token, holders = _DRIVERS[path]
        if holders > 1:
            _DRIVERS[path] = (token, holders - 1)
            return
        del _DRIVERS[path]
        release(path, token)


@contextmanager
def one_driver(output: str, single_driver: bool) -> Iterator[None]:
    """Hold `output`'s driver lease while inside when its store lets one driver write at a time
    (`single_driver`); elsewhere Delta's own commits keep concurrent writers safe, and nothing is held."""
    if not single_driver:
        yield
        return
    hold_driver(output)
    try:
        yield
    finally:
        let_go_driver(output)


def acquire(path: Location, running: Callable[[], bool]) -> str:
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
        for _ in range(3):  # a stale lease is removed (or replaced) and the creation tried again
            try:
                atomic.create_file(path, json.dumps(holder), durable=False)  # void after a crash
            except FileExistsError:
                if not _take_stale(path, json.dumps(holder)):  # refuses while its holder lives
                    continue
            _HELD[str(path)] = running
            return token
    raise CheckpointInUseError(f"could not take the lease {path}: other runners keep taking it; try again")


def release(path: Location, token: str) -> None:
    """Give the lease back, if `token` still holds it (nothing to give back once its checkpoint is
    gone: a run refused before it processed anything removes the checkpoint it made)."""
    if not is_remote(path) and not Path(path).parent.exists():
        _HELD.pop(str(path), None)
        return
    with _locked(path):
        holder = _read(path)
        if holder is not None and holder.get("token") == token:
            atomic.remove(path)
    _HELD.pop(str(path), None)


@contextmanager
def _locked(path: Location) -> Iterator[None]:
    """Hold the lease's lock (an exclusive `flock` on `<lease>.lock`, let go when the process
    dies); none on another file system, where the lease's own conditional writes decide."""
    if is_remote(path):
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path.with_name(f"{path.name}.lock"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # also lets the lock go


def _take_stale(path: Location, holder: str) -> bool:
    """Take the lease at `path` over if its holder is gone: remove it (False: create it again), or
    on a store with entity tags replace it while it is still the one read (True: taken). Refuses
    while its holder holds (or may: see `_UNREADABLE_GRACE_S`)."""
    found = hadoop_files.stat(str(path)) if is_remote(path) else _local_stat(Path(path))
    if found is None:
        return False  # given back since
    written, entity_tag = found
    _refuse_if_held(path, time.time() - written)
    if entity_tag is None:
        atomic.remove(path)
        return False
    try:
        hadoop_files.create(str(path), holder.encode("utf-8"), replacing_tag=entity_tag)
    except FileExistsError:
        return False  # another process took it first: try again, and find it held
    return True


def _local_stat(path: Path) -> tuple[float, None] | None:
    try:
        return path.stat().st_mtime, None
    except FileNotFoundError:
        return None


def _refuse_if_held(path: Location, age: float) -> None:
    """Refuse while the lease's holder lives, or while a lease that names no holder is younger than
    `_UNREADABLE_GRACE_S` (it may be being written)."""
    holder = _read(path)
    driver = str(path).endswith(DRIVER_LEASE_SUFFIX)
    error: type[JobError] = OutputInUseError if driver else CheckpointInUseError
    held = (
        f"output {str(path).removesuffix(DRIVER_LEASE_SUFFIX)}"
        if driver
        else f"checkpoint {_checkpoint_of(path)}"
    )
    if holder is None:
        if age < _UNREADABLE_GRACE_S:
            raise error(
                f"{held} has a lease {path} that names no holder yet (another process may be taking it); "
                f"try again in {_UNREADABLE_GRACE_S:.0f} seconds. A lease file that stays so is taken for stale then"
            )
    elif _alive(path, holder):
        since = f"process {holder['pid']} on {holder.get('host')} since {holder.get('since')}"
        if driver:
            raise error(
                f"{held} is being written by {since}; its store lets one Spark driver at a time write a Delta "
                "table (Delta's default S3 log store), so this run would risk losing commits. Wait for that run "
                f"to end, or stop it (Ctrl-C, or kill {holder['pid']}); for several writers, configure Delta's "
                f"DynamoDB log store (docs/scale-out.md). If that process is gone for good, delete {path}"
            )
        raise error(
            f"{held} is in use by {since}; wait for it to stop, or stop it (Ctrl-C, or kill {holder['pid']}): "
            "an output has one live writer. To run the job a second time at once, copy its job file and give "
            f"the copy another output. If that process is gone for good, delete {path}"
        )


def _checkpoint_of(path: Location) -> str:
    """The checkpoint a lease file belongs to (<checkpoint>/streamjoin/lease.json)."""
    return str(path).rsplit("/", 2)[0]


def _read(path: Location) -> dict | None:
    """The holder a lease file names; None when it is gone or names none (empty, damaged)."""
    try:
        holder = json.loads(atomic.read_text(path))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else None


def _alive(path: Location, holder: dict) -> bool:
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
