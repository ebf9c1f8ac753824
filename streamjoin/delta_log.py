"""What a local Delta table's log tells without asking Delta: the one place that reads `_delta_log`.

Delta answers every question here itself, but each answer costs a Spark job or a rebuild of the
table's state (history, properties, the file list of a version, whether a batch committed), and the
runners ask several times per replay and per micro-batch. For a table in a local folder, the log's
commit files and Delta's checksums (`<version>.crc`, which Delta writes after each commit of a table
of few files) hold the same answers as plain JSON. `LocalLog.of` gives a reader for such a table and
None for any other (a metastore name, object storage): the caller then asks Delta. Every reader
returns None where the files cannot answer (a checksum missing, a list not whole, deletion vectors,
column mapping), never a guess; tests/test_delta_log.py compares each answer with Delta's on tables
aged like production ones (backdated commits, MERGE, OPTIMIZE, VACUUM, checkpoints, log clean-up).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from urllib.parse import unquote, urlparse

COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(\.[^/]*)?\.(parquet|json)$")


def is_path(location: str) -> bool:
    """A Delta folder (a path or a URI) rather than a metastore table name."""
    return "/" in location or "\\" in location or "://" in location


@dataclass(frozen=True)
class LocalLog:
    """The `_delta_log` folder of a table in a local folder."""

    folder: str

    @classmethod
    def of(cls, location: str) -> LocalLog | None:
        """The log of a table in a local folder (a path or a file: URI); None for a metastore name
        or another file system, which only Delta (or Hadoop) can read."""
        parsed = urlparse(location)
        if not is_path(location) or parsed.scheme not in ("", "file"):
            return None
        return cls(os.path.join(parsed.path, "_delta_log"))

    @property
    def table(self) -> str:
        """The table's own folder."""
        return os.path.dirname(self.folder)

    def exists(self) -> bool:
        """The log folder exists (a table, or one whose commits are being written)."""
        return os.path.isdir(self.folder)

    def _path(self, version: int, suffix: str = "json") -> str:
        return os.path.join(self.folder, f"{version:020d}.{suffix}")

    def versions(self) -> list[int]:
        """The versions of the commit files, oldest first (none if the folder does not exist)."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        return sorted(int(m.group(1)) for m in map(COMMIT_FILE.match, names) if m)

    def newest(self) -> int:
        """The newest version, -1 before the table exists."""
        return max(self.versions(), default=-1)

    def commit_info(self, version: int) -> dict | None:
        """A commit's `commitInfo` action; None if the file is gone since it was listed, is being
        written, or holds none."""
        try:
            return self._commit_info(version)
        except (OSError, ValueError):
            return None

    def _commit_info(self, version: int) -> dict | None:
        """`commit_info`, raising when the file cannot be read or parsed. Delta writes the action
        first, so this reads one line of a commit of any size."""
        with open(self._path(version), encoding="utf-8") as file:
            for line in filter(str.strip, file):
                action = json.loads(line)
                info = action.get("commitInfo") if isinstance(action, dict) else None
                if isinstance(info, dict):
                    return info
        return None

    def schema_string(self, version: int) -> str | None:
        """The schema (Delta's JSON) a commit set with a `metaData` action; None if it set none.
        Raises OSError when the commit file cannot be read."""
        stat = os.stat(self._path(version))
        return _schema_string_of(self._path(version), stat.st_size, stat.st_mtime_ns)

    def damaged(self, upto: int | None = None) -> tuple[int, str] | None:
        """The first commit up to `upto` that Delta reads as JSON (those after its newest
        checkpoint) and that does not parse, with what is wrong with it; None when they all parse.
        A commit file is written whole (Delta renames it into place), so one that does not parse
        is damaged, not being written."""
        versions = self.versions()
        if not versions:
            return None
        upto = versions[-1] if upto is None else upto
        checkpoints = [int(m.group(1)) for m in map(_CHECKPOINT_FILE.match, os.listdir(self.folder)) if m]
        since = max((v for v in checkpoints if v <= upto), default=-1)
        for version in (v for v in versions if since < v <= upto):
            problem = _unparsable_line(self._path(version))
            if problem is not None:
                return version, problem
        return None

    def checksum(self, version: int | None = None) -> dict | None:
        """Delta's checksum of `version` (default: the newest); None without a readable one."""
        version = self.newest() if version is None else version
        try:
            with open(self._path(version, "crc"), encoding="utf-8") as file:
                checksum = json.load(file)
        except (OSError, ValueError):
            return None
        return checksum if isinstance(checksum, dict) else None

    def properties(self, version: int | None = None) -> dict[str, str] | None:
        """The table properties in a checksum's metadata; None without a checksum or metadata."""
        return _configuration(self.checksum(version))

    def size(self, version: int) -> int | None:
        """The bytes of the table's files at `version`, from its checksum."""
        size = (self.checksum(version) or {}).get("tableSizeBytes")
        return size if isinstance(size, int) else None

    def files(self, version: int | None = None) -> list[dict] | None:
        """The files of `version` (default: the newest) as its checksum lists them (`allFiles`);
        None where that list cannot stand for Delta's: no checksum, no list or not the whole one,
        deletion vectors, column mapping (statistics under physical names), paths outside the table."""
        checksum = self.checksum(version)
        if checksum is None:
            return None
        files = checksum.get("allFiles")
        if not isinstance(files, list) or len(files) != checksum.get("numFiles"):
            return None
        if (_configuration(checksum) or {}).get("delta.columnMapping.mode", "none") != "none":
            return None
        if any(f.get("deletionVector") or ":" in f.get("path", ":") for f in files):
            return None
        return files

    def paths(self, files: list[dict]) -> list[str]:
        """The local paths of `files` as `files` lists them (relative to the table, URL-encoded)."""
        return [os.path.join(self.table, unquote(f["path"])) for f in files]

    def time_ranges(self, column: str) -> list[tuple[datetime, datetime]] | None:
        """Per file of the newest version that holds rows, the range [min, max + 1 ms) of its rows'
        `column`, from the file's statistics (Delta cuts the timestamps it keeps there to the
        millisecond). None when they cannot tell: no file list, a file without statistics for
        `column` or with only NULLs there, a time without its zone."""
        files = self.files()
        if files is None:
            return None
        ranges = []
        for file in files:
            stats = _stats(file)
            if stats is None:
                return None
            if stats.get("numRecords") == 0:
                continue
            low, high = (
                _stats_time((stats.get(side) or {}).get(column)) for side in ("minValues", "maxValues")
            )
            if low is None or high is None:
                return None
            ranges.append((low, high + timedelta(milliseconds=1)))
        return ranges

    def only_nulls(self, column: str) -> bool:
        """Every row of the newest version holds NULL in `column`, by its files' null counts; False
        when they cannot tell."""
        files = self.files()
        if files is None:
            return False
        for file in files:
            stats = _stats(file)
            if stats is None or (stats.get("nullCount") or {}).get(column) != stats.get("numRecords"):
                return False
        return True

    def commits_after(self, after: int) -> list[dict | None] | None:
        """The `commitInfo` of each commit after version `after`, oldest first; None when some of
        them cannot be read: cleaned up after the log's retention (or while being read), so what
        they were is unknown."""
        versions = [v for v in self.versions() if v > after]
        if versions and versions[0] != after + 1:
            return None
        try:
            return [self._commit_info(version) for version in versions]
        except (OSError, ValueError):
            return None


@lru_cache(maxsize=4096)
def _schema_string_of(path: str, size: int, modified: int) -> str | None:
    """The schema a commit file sets, kept per file (by its size and time: a commit file never
    changes once written), so that each run's reads do not parse the same log again."""
    with open(path, encoding="utf-8") as file:
        return schema_string(file)


def schema_string(lines) -> str | None:
    """The schema (Delta's JSON) of a commit's `metaData` action, among the commit's lines."""
    for line in lines:
        if '"metaData"' in line:
            value = (json.loads(line).get("metaData") or {}).get("schemaString")
            if isinstance(value, str):
                return value
    return None


def _unparsable_line(path: str) -> str | None:
    """The first line of a JSON-lines file that does not parse, and why; None when all do (or the
    file has gone since it was listed: cleaned up, not damaged)."""
    try:
        with open(path, encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                try:
                    if line.strip():
                        json.loads(line)
                except ValueError as exc:
                    return f"line {number}: {exc}"
    except OSError:
        return None
    return None


def _configuration(checksum: dict | None) -> dict[str, str] | None:
    configuration = ((checksum or {}).get("metadata") or {}).get("configuration")
    return configuration if isinstance(configuration, dict) else None


def _stats(file: dict) -> dict | None:
    """A listed file's statistics; None when absent or unreadable."""
    try:
        stats = json.loads(file.get("stats") or "")
    except ValueError:
        return None
    return stats if isinstance(stats, dict) else None


def _stats_time(text: object) -> datetime | None:
    """A timestamp as Delta writes it in file statistics (ISO 8601 with its zone), aware; None if
    absent, not a time or without a zone."""
    if not isinstance(text, str):
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo is not None else None
