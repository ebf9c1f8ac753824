"""How far a source's commits trail their rows' event times: what a join's grace has to cover.

A row is late when its event time is more than grace behind the newest event time any source has
committed before it. A source whose rows are never ahead of their commit keeps every row on time
with a grace at least as long as its commits' lag: how far each commit's oldest row trails the
commit's own time. How often the source commits does not matter: a table committing once a day
with rows three minutes old needs three minutes, not a day. `plan.grace_warnings` compares.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from streamjoin import delta_io
from streamjoin.errors import StreamJoinError
from streamjoin.timeutil import from_spark, to_micros

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamjoin.plan import BoundSource

RECENT_COMMITS = 20  # the newest row-adding commits of a source that its lag is measured on
# Operations that add rows to a table.
WRITES = ("WRITE", "STREAMING UPDATE", "MERGE", "UPDATE", "CREATE TABLE AS SELECT", "REPLACE TABLE AS SELECT")


@dataclass(frozen=True)
class CommitLags:
    """Per recent row-adding commit of a source, how far its oldest row trails the commit (zero
    when none is older than the commit), oldest commit first."""

    lags: tuple[timedelta, ...]
    unknown: str | None = None  # why the lags cannot be told (then `lags` is empty)

    @property
    def largest(self) -> timedelta:
        return max(self.lags)

    @property
    def median(self) -> timedelta:
        return sorted(self.lags)[len(self.lags) // 2]

    def beyond(self, grace: timedelta) -> int:
        """How many of the commits hold a row more than `grace` older than the commit."""
        return sum(lag > grace for lag in self.lags)


def commit_lags(spark: SparkSession, source: BoundSource) -> CommitLags | None:
    """The lags of the source's newest row-adding commits (up to RECENT_COMMITS), read from its rows
    (the snapshot with row tracking, else the change data feed); None when it has no such commit,
    or its time is the commit's; no lags and why (`unknown`) when those rows are no longer readable."""
    if not source.spec.time or source.commit_time:
        return None
    location = source.spec.location
    newest = delta_io.latest_version(spark, location)
    history = delta_io.history(spark, location, since=max(newest - 2 * RECENT_COMMITS, 0), upto=newest)
    commits = [c for c in history if c.operation.upper() in WRITES][-RECENT_COMMITS:]
    if not commits:
        return None
    try:
        with delta_io.translated_errors(location, "the files of its recent commits"):
            oldest = _oldest_event_times(spark, source, commits[0].version, newest)
    except StreamJoinError:  # its change files are gone: the lag cannot be told
        return CommitLags((), unknown="its recent commits' change files are gone and it has no row tracking")
    lags = [
        timedelta(microseconds=max(to_micros(from_spark(c.timestamp)) - oldest[c.version], 0))
        for c in commits
        if oldest.get(c.version) is not None
    ]
    return (
        CommitLags(tuple(timedelta(seconds=-(-lag // timedelta(seconds=1))) for lag in lags))
        if lags
        else None
    )


def _oldest_event_times(spark: SparkSession, source: BoundSource, first: int, newest: int) -> dict[int, int]:
    """Per commit version from `first` on, the oldest event time (UTC micros) of the rows it wrote."""
    location = source.spec.location
    if delta_io.row_tracking(spark, location):
        rows = delta_io.read_rows(spark, location).where(F.col(delta_io.COMMIT_VERSION) >= first)
    else:
        rows = delta_io.read_changes(spark, location, newest, first).where(
            F.col(delta_io.CHANGE_TYPE) != "delete"
        )
    grouped = rows.groupBy(delta_io.COMMIT_VERSION).agg(F.min(source.event_time()).alias("oldest"))
    return {row[delta_io.COMMIT_VERSION]: row["oldest"] for row in grouped.collect()}
