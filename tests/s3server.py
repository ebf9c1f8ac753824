"""A real S3-compatible server on loopback for the object storage tests, started and stopped by them.

S3Proxy (the jar infra/setup.sh fetches into .s3proxy/) on a free port of 127.0.0.1, keeping its
buckets in a fresh folder (its file system backend: a bucket is a folder, so the tests make one
by making the folder), with one access key. `Server.hadoop_conf` is what Spark's `s3a` connector
needs to reach it; `Server.storage_options` the same for delta-rs.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from postgres import _free_port

from streamjoin.session import PROJECT_ROOT

BUCKET = "streamjoin"
ACCESS_KEY, SECRET_KEY = "streamjoin-tests", "streamjoin-tests-secret"


def _jar() -> Path:
    found = sorted((PROJECT_ROOT / ".s3proxy").glob("s3proxy-*-jar-with-dependencies.jar"))
    if not found:
        raise RuntimeError("S3Proxy's jar is missing from .s3proxy/: run `bash infra/setup.sh` (fetches it)")
    return found[-1]


@dataclass(frozen=True)
class Server:
    port: int
    folder: Path  # the buckets, one folder each

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hadoop_conf(self) -> dict[str, str]:
        """Hadoop's settings (without the `spark.hadoop.` prefix) for `s3a://` paths on this server."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": "us-east-1",
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.access.key": ACCESS_KEY,
            "fs.s3a.secret.key": SECRET_KEY,
            "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            # Uploads are buffered in memory: on disk, S3A asks Hadoop for the checksummed local file
            # system, which the tests' session replaces with the raw one (tests/conftest.py).
            "fs.s3a.fast.upload.buffer": "bytebuffer",
            "fs.s3a.attempts.maximum": "2",
            "fs.s3a.retry.limit": "2",
        }


@contextmanager
def server() -> Iterator[Server]:
    """An S3 server for the duration of the block, with the bucket `BUCKET`; its data removed after."""
    folder = Path(tempfile.mkdtemp(prefix="streamjoin-s3-"))
    (folder / "buckets" / BUCKET).mkdir(parents=True)
    port = _free_port()
    settings = {
        "s3proxy.endpoint": f"http://127.0.0.1:{port}",
        "s3proxy.authorization": "aws-v2-or-v4",
        "s3proxy.identity": ACCESS_KEY,
        "s3proxy.credential": SECRET_KEY,
        "jclouds.provider": "filesystem-nio2",
        "jclouds.filesystem.basedir": str(folder / "buckets"),
        "jclouds.identity": "unused",
        "jclouds.credential": "unused",
    }
    (folder / "s3proxy.conf").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    log = (folder / "log").open("w")
    command = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-jar", str(_jar())]
    process = subprocess.Popen(
        [*command, "--properties", str(folder / "s3proxy.conf")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        _wait_for(port, process, folder / "log")
        yield Server(port, folder / "buckets")
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for(port: int, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    """Until the server accepts connections; fails with its log if it stops or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"S3Proxy stopped (exit {process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(
        f"S3Proxy did not answer on port {port} within {timeout:.0f} s:\n{log.read_text()[-3000:]}"
    )
