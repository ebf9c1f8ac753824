"""Small files written whole: a reader, a crash or a full disk never leaves one half-written.

Every small file streamjoin keeps beside a checkpoint or an output (a checkpoint's marker, its
progress records and write record, the lease, the data-quality page) is written here: the text
goes to a temporary file in the same folder, which is flushed to disk (fsync) and then renamed
(or, for a file that must not exist yet, linked) to its name, and the folder is flushed so the
new name survives a power loss. A write that fails (no space, read-only folder) leaves the old
file as it was and removes its temporary file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def replace_file(path: Path, text: str | bytes) -> None:
    """Write `text` (or bytes) to `path`, replacing what it held: readers see the old content or the new."""
    with _staged(path, text) as temporary:
        os.replace(temporary, path)
    _sync_folder(path.parent)


def create_file(path: Path, text: str, durable: bool = True) -> None:
    """Create `path` holding `text`, content and name at once; FileExistsError if it exists (two
    processes creating it together: exactly one succeeds, and the other never sees it empty).
    `durable` False skips the flushes to disk, for a file that means nothing after a crash of the
    machine (a lease: its holder is gone then) and is written often."""
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
