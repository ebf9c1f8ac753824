"""A real PostgreSQL server on loopback for the lookup joins' tests, started and stopped by them.

Debian's PostgreSQL (infra/setup.sh installs it when missing) in a fresh data folder, on a free
port of 127.0.0.1, trusting local connections; run as the `postgres` user when the tests run as
root (PostgreSQL refuses root). `Server.sql` runs statements through psql.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

USER = "streamjoin"


def _program(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is missing: run `bash infra/setup.sh` (installs postgresql)")
    return found[-1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Server:
    port: int
    folder: Path

    @property
    def url(self) -> str:
        """The JDBC URL of its `postgres` database, as a job names it."""
        return f"jdbc:postgresql://127.0.0.1:{self.port}/postgres?user={USER}"

    def sql(self, statements: str) -> str:
        """Run SQL statements (psql, stopping at the first error); their output."""
        done = subprocess.run(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
             "-d", "postgres", "-At", "-c", statements],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout


@contextmanager
def server() -> Iterator[Server]:
    """A PostgreSQL server for the duration of the block, its data removed after."""
    folder = Path(tempfile.mkdtemp(prefix="streamjoin-pg-"))
    data = folder / "data"
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    if as_postgres:
        shutil.chown(folder, "postgres")
    port = _free_port()
    try:
        subprocess.run(
            [*as_postgres, _program("initdb"), "-D", str(data), "-A", "trust", "-U", USER, "--no-sync"],
            check=True, capture_output=True,
        )  # fmt: skip
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            [*as_postgres, _program("pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-o", options, "-w",
             "start"],
            check=True, capture_output=True,
        )  # fmt: skip
        yield Server(port, folder)
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*as_postgres, _program("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
            )
        shutil.rmtree(folder, ignore_errors=True)
