"""Small files written whole: a reader, a crash or a full disk never leaves one half-written.

Every small file streamjoin keeps beside a checkpoint or an output (a checkpoint's marker, its
progress records and write record, the lease, the data-quality page) is written here: the text
goes to a temporary file in the same folder, which is flushed to disk (fsync) and then renamed
(or, for a file that must not exist yet, linked) to its name, and the folder is flushed so the
new name survives a power loss. A write that fails (no space, read-only folder) leaves the old
file as it was and removes its temporary file.

A checkpoint on another Hadoop file system (a URL: `s3a://`, `abfss://`, `gs://`, `hdfs://`) keeps
the same files through that file system's own primitives (`hadoop_files`); each function here
takes either, so the callers have one path for both.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streamjoin import hadoop_files
from streamjoin.hadoop_files import is_remote

Location = Path | str  # a local path, or a URL of another Hadoop file system


def resolve(location: str) -> Location:
    """A folder named by a user: a local path (or `file:` URI) made absolute, a URL as it is."""
    if is_remote(location):
        return location.rstrip("/")
    return Path(location.removeprefix("file:")).resolve()


def under(folder: Location, *names: str) -> Location:
    """`names` under `folder`: a Path for a local folder, a URL joined with `/` for a remote one."""
    if is_remote(folder):
        return "/".join([str(folder).rstrip("/"), *names])
    return Path(folder, *names)


def read_text(path: Location) -> str:
    """The file's text; FileNotFoundError when there is none."""
    return hadoop_files.read_text(str(path)) if is_remote(path) else Path(path).read_text()


def exists(path: Location) -> bool:
    return hadoop_files.exists(str(path)) if is_remote(path) else Path(path).exists()


def names(folder: Location) -> list[str]:
    """The names of the entries in `folder`; none when it does not exist."""
    if is_remote(folder):
        return hadoop_files.names(str(folder))
    return os.listdir(folder) if Path(folder).is_dir() else []


def remove(path: Location, recursive: bool = False) -> None:
    """Delete a file (or, `recursive`, a folder and all below it); nothing if it is gone."""
    if is_remote(path):
        hadoop_files.remove(str(path), recursive)
    elif recursive:
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)


def replace_file(path: Location, text: str | bytes) -> None:
    """Write `text` (or bytes) to `path`, replacing what it held: readers see the old content or the new."""
    if is_remote(path):
        hadoop_files.replace(str(path), text if isinstance(text, bytes) else text.encode("utf-8"))
        return
    path = Path(path)
    with _staged(path, text) as temporary:
        os.replace(temporary, path)
    _sync_folder(path.parent)


def create_file(path: Location, text: str, durable: bool = True) -> None:
    """Create `path` holding `text`, content and name at once; FileExistsError if it exists (two
    processes creating it together: exactly one succeeds, and the other never sees it empty).
    `durable` False skips the flushes to disk, for a file that means nothing after a crash of the
    machine (a lease: its holder is gone then) and is written often."""
    if is_remote(path):
        hadoop_files.create(str(path), text.encode("utf-8"))
        return
    path = Path(path)
    with _staged(path, text, durable) as temporary:
        os.link(temporary, path)
    if durable:
        _sync_folder(path.parent)


@contextmanager
def _staged(path: Path, text: str | bytes, durable: bool = True) -> Iterator[str]:
    """A temporary file beside `path` holding `text` (on disk, if `durable`); removed when the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            if durable:
                os.fsync(file.fileno())
        yield temporary
    finally:
        Path(temporary).unlink(missing_ok=True)  # renamed away, or linked: the name is no longer needed


def _sync_folder(folder: Path) -> None:
    """Flush a folder's entries to disk, so that a rename or link in it survives a crash."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
