"""The replay runner: a deterministic batch over Delta snapshots pinned at versions, one slice at a time.

Control flow: pin input versions, check their history is retained, read each source's arrivals
up to its pinned version, settle them at the frontier, hand the settled rows inside the slice's
margins to the kernel in one step, and replace the slice's rows in the output and side tables.
Re-running a slice replaces it; slices [a, b) and [b, c) together equal [a, c).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import reduce
from typing import Callable

import pendulum
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin import arrival, changelog, delta_io, kernel
from streamjoin.arrival import T, TS
from streamjoin.changelog import TableInput
from streamjoin.errors import JobError
from streamjoin.joins.table_table import count_ops
from streamjoin.metrics import RunMetrics, SourceCounts, to_frame
from streamjoin.plan import Plan, bind
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import from_micros, to_micros


@dataclass(frozen=True)
class Inputs:
    """Each stream source's arrivals up to its pinned version, and the commits they came in; each
    table source's changes up to its pinned version, and its commits."""

    versions: dict[str, int]
    rows: dict[str, DataFrame]
    commits: list[arrival.CommitStats]
    frontier: arrival.Position | None
    changes: dict[str, DataFrame]
    table_commits: dict[str, list[arrival.CommitStats]]

    @property
    def stream_clock(self) -> int | None:
        """The newest commit timestamp among the stream sources."""
        return max((c.position[0] for c in self.commits), default=None)


def pin_versions(spark: SparkSession, plan: Plan, versions: dict[str, int] | None = None) -> dict[str, int]:
    """The versions a replay reads: those given, else each source's latest."""
    pinned = dict(versions or {})
    for source in plan.sources:
        pinned.setdefault(source.name, delta_io.latest_version(spark, source.spec.location))
    return pinned


def read_inputs(spark: SparkSession, plan: Plan, versions: dict[str, int], window: tuple[int, int] | None = None) -> Inputs:
    """Check retention, then read and tag every source's arrivals and their commit stats (with the
    rows a slice `window` owns). The stream sources' rows are persisted, so that the change feed is
    read once for the stats, the join and the side tables; so are the table sources' changes.
    Unpersist both when done."""
    for source in plan.sources:
        delta_io.require_change_feed(spark, source.spec.location)
        delta_io.check_retained(spark, source.spec.location, versions[source.name])
    rows = {
        s.name: arrival.prepare(
            delta_io.read_inserts(spark, s.spec.location, versions[s.name]),
            s.index, s.raw_time(), s.event_time(), s.keys,
        ).persist()
        for s in plan.streams
    }
    commits = arrival.commit_stats(reduce(DataFrame.unionByName, [_timing(r) for r in rows.values()]), window) if rows else []
    frontier = arrival.frontier(arrival.newest_positions(commits), len(plan.streams))
    changes = {s.name: changelog.read(spark, s, versions[s.name]).persist() for s in plan.tables}
    table_commits = {name: arrival.commit_stats(c, window) for name, c in changes.items()}
    return Inputs(versions, rows, commits, frontier, changes, table_commits)


def _timing(rows: DataFrame) -> DataFrame:
    return rows.select(T, TS, arrival.SRC, arrival.V, arrival.REJECT)


def replay(
    spark: SparkSession,
    spec: JoinSpec,
    start: datetime,
    end: datetime,
    mode: str = "exact",
    versions: dict[str, int] | None = None,
    after_write: Callable[[str], None] | None = None,
) -> RunMetrics:
    """Replay [start, end) of `spec` over pinned versions and replace that slice of its outputs.

    `after_write(location)` is called after each table is written (tests inject faults there).
    """
    after_write = after_write or (lambda location: None)
    if mode not in kernel.MODES:
        raise JobError(f"mode {mode!r} is unknown; use 'exact' (as live ran) or 'complete' (every row on time)")
    start, end = pendulum.instance(start).in_timezone("UTC"), pendulum.instance(end).in_timezone("UTC")
    if not start < end:
        raise JobError(f"the replay interval [{start}, {end}) is empty; start must be before end")
    began = time.monotonic()
    started_at = pendulum.now("UTC")
    plan = bind(spark, spec)
    join = kernel.family(plan)
    pinned = pin_versions(spark, plan, versions)
    lo, hi = to_micros(start), to_micros(end)
    inputs = read_inputs(spark, plan, pinned, (lo, hi))
    settled_commits = [c for c in inputs.commits if inputs.frontier and c.position <= inputs.frontier]
    settled = arrival.at_or_before(inputs.frontier) if inputs.frontier else F.lit(False)

    def within(time_col, a: int, b: int):
        return (time_col >= F.lit(a)) & (time_col < F.lit(b))

    settled_rows, counts, rejected_parts, cached = {}, {}, [], [*inputs.rows.values(), *inputs.changes.values()]
    for source in plan.streams:
        rows = inputs.rows[source.name]
        accepted, rejected = kernel.split_rejected(rows)
        rejected_parts.append(kernel.rejected_side_rows(source.name, rejected.where(within(F.coalesce(F.col(T), F.col(TS)), lo, hi))))
        before, after = join.margins(source.name)
        settled_rows[source.name] = accepted.where(settled & within(F.col(T), lo - before, hi + after))
        own = [c for c in inputs.commits if c.position[1] == source.index]
        counts[source.name] = SourceCounts(
            rows_in=sum(c.window_rows for c in own),
            rejected=sum(c.window_rejected for c in own),
            unsettled=sum(c.window_rows - c.window_rejected for c in own if c.position > (inputs.frontier or (-1, -1, -1))),
        )

    tables = {}
    for source in plan.tables:
        changes = inputs.changes[source.name]
        owned = within(F.coalesce(F.col(T), F.col(TS)), lo, hi)
        rejected_parts.append(kernel.rejected_side_rows(source.name, changes.where(owned & F.col(arrival.REJECT).isNotNull())))
        tables[source.name] = TableInput(changes, inputs.table_commits[source.name], pinned[source.name], owned, inputs.stream_clock)
        own = inputs.table_commits[source.name]
        counts[source.name] = SourceCounts(rows_in=sum(c.window_rows for c in own), rejected=sum(c.window_rejected for c in own))

    result = kernel.step(spark, plan, settled_rows, settled_commits, None, mode, window=(lo, hi), tables=tables)
    cached += result.cached
    out = spec.output
    output = result.output.persist()
    cached.append(output)
    upserts = deletes = 0
    if result.result is None:
        delta_io.write_slice(output, out.location, out.time, start, end, out.partition_by)
        after_write(out.location)
    else:  # table-table: the slice's result changes, and the result table as of the pinned versions
        delta_io.write_slice(output, out.side("changes"), out.time, start, end)
        after_write(out.side("changes"))
        delta_io.overwrite(result.result, out.location, out.partition_by)
        after_write(out.location)
        ops = count_ops(output)
        upserts, deletes = ops["upsert"], ops["delete"]
    rows_out = output.count()
    if any(c.late for c in result.counts.values()) or delta_io.exists(spark, out.side("late")):
        delta_io.write_slice(result.late, out.side("late"), "slice_time", start, end)
        after_write(out.side("late"))
    if any(c.rejected for c in counts.values()) or delta_io.exists(spark, out.side("rejected")):
        delta_io.write_slice(reduce(DataFrame.unionByName, rejected_parts), out.side("rejected"), "slice_time", start, end)
        after_write(out.side("rejected"))
    for frame in cached:
        frame.unpersist()

    for name, decided in result.counts.items():
        c = counts[name]
        c.late, c.joined, c.open = decided.late, decided.joined, decided.open
        c.unmatched_emitted, c.unmatched_dropped = decided.unmatched_emitted, decided.unmatched_dropped
        c.applied = decided.applied
    metrics = RunMetrics(
        job=spec.name, runner="replay", mode=mode, run_id=str(uuid.uuid4()), started_at=started_at,
        slice_start=start, slice_end=end, versions=pinned,
        frontier=_describe_position(inputs.frontier),
        watermark=None if result.watermark is None else from_micros(result.watermark),
        sources=counts, rows_out=rows_out, duration_s=round(time.monotonic() - began, 3),
        upserts=upserts, deletes=deletes,
    )
    delta_io.append(to_frame(spark, metrics), out.side("metrics"))
    return metrics


def _describe_position(position: arrival.Position | None) -> str | None:
    if position is None:
        return None
    ts, src, version = position
    return f"{from_micros(ts).isoformat()} source {src} version {version}"
