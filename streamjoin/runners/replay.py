"""The replay runner: a deterministic batch over Delta snapshots pinned at versions, one slice at a time.

Control flow: pin input versions, check those snapshots are retained, bring the arrival index up
to them, read each stream source's rows in the slice's margins, settle them at the frontier, take
their watermarks from the index, hand them to the kernel in one step, and replace the slice's rows
in the output and side tables. Re-running a slice replaces it; slices [a, b) and [b, c) together
equal [a, c); the cost of a slice follows what it holds, not the length of the history.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime
from functools import reduce

import pendulum
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin import arrival, changelog, delta_io, index, kernel
from streamjoin.arrival import TS, T
from streamjoin.changelog import TableInput
from streamjoin.errors import HistoryNotRetainedError, JobError
from streamjoin.joins.table_table import TableTableJoin, count_ops
from streamjoin.metrics import RunMetrics, SourceCounts, to_frame
from streamjoin.plan import Plan, bind
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import from_micros, to_micros


def pin_versions(spark: SparkSession, plan: Plan, versions: dict[str, int] | None = None) -> dict[str, int]:
    """The versions a replay reads: those given, else each source's latest. A version given for a
    name that is not one of the job's sources is refused (a typo would otherwise go unnoticed);
    `check_inputs` refuses versions a source does not have."""
    pinned = dict(versions or {})
    unknown = sorted(set(pinned) - {s.name for s in plan.sources})
    if unknown:
        raise JobError(
            f"versions are given for {', '.join(map(repr, unknown))}, which job {plan.spec.name!r} has no source "
            f"of; its sources are {', '.join(s.name for s in plan.sources)}"
        )
    for source in plan.sources:
        pinned.setdefault(source.name, delta_io.latest_version(spark, source.spec.location))
    return pinned


def check_inputs(spark: SparkSession, plan: Plan, versions: dict[str, int]) -> None:
    """Before any data moves: every source records its change feed and still holds the pinned
    snapshot (its log entry and files). Nothing older is checked: a replay reads nothing older."""
    for source in plan.sources:
        delta_io.require_change_feed(spark, source.spec.location)
        delta_io.check_retained(spark, source.spec.location, versions[source.name])


def replay(
    spark: SparkSession,
    spec: JoinSpec,
    start: datetime,
    end: datetime,
    mode: str = "exact",
    versions: dict[str, int] | None = None,
    after_write: Callable[[str], None] | None = None,
    checked: bool = False,
    closed: bool = False,
) -> RunMetrics:
    """Replay [start, end) of `spec` over pinned versions and replace that slice of its outputs.

    Reads only what the slice needs: each stream source's rows in the slice's margins (and the
    rows without event time it owns) from the pinned snapshot, lateness from the arrival index
    (extended first to the pinned versions), each table source from its start. `checked`: the
    caller (a backfill) has already run `check_inputs` on these versions. `after_write(location)`
    is called after each table is written (tests inject faults there). `closed`: the input ends at
    the pinned versions (a closed history), so every row is settled and every window closes, as if
    a last watermark at infinity had passed; live writes those last rows only if more data comes.
    """
    locations = [s.location for s in spec.sources]
    try:
        with delta_io.translated_errors(", ".join(locations), "the files this replay reads"):
            return _replay(spark, spec, start, end, mode, versions, after_write, checked, closed)
    except HistoryNotRetainedError as error:
        if "VACUUM ran at" in str(error):
            raise
        raise HistoryNotRetainedError(f"{error}{delta_io.vacuum_note(spark, locations)}") from None


def _replay(
    spark: SparkSession,
    spec: JoinSpec,
    start: datetime,
    end: datetime,
    mode: str,
    versions: dict[str, int] | None,
    after_write: Callable[[str], None] | None,
    checked: bool,
    closed: bool,
) -> RunMetrics:
    after_write = after_write or (lambda location: None)
    if mode not in kernel.MODES:
        raise JobError(
            f"mode {mode!r} is unknown; use 'exact' (as live ran) or 'complete' (every row on time)"
        )
    start, end = pendulum.instance(start).in_timezone("UTC"), pendulum.instance(end).in_timezone("UTC")
    if not start < end:
        raise JobError(f"the replay interval [{start}, {end}) is empty; start must be before end")
    began = time.monotonic()
    started_at = pendulum.now("UTC")
    plan = bind(spark, spec)
    join = kernel.family(plan)
    pinned = pin_versions(spark, plan, versions)
    if not checked:
        check_inputs(spark, plan, pinned)
    positions = index.update(spark, plan, pinned)
    lo, hi = to_micros(start), to_micros(end)
    newest = positions.newest()
    frontier = arrival.frontier(newest, len(plan.streams))
    if closed:  # every commit is settled: nothing more will come
        frontier = max(newest.values(), default=None)
    stream_clock = max((p[0] for p in newest.values()), default=None)
    settled = arrival.at_or_before(frontier) if frontier else F.lit(False)
    owned = arrival.owned_by((lo, hi))
    settled_rows, rejected_parts, cached = {}, [], []
    counts: dict[str, SourceCounts] = {}
    for source in plan.streams:
        assert not isinstance(join, TableTableJoin)  # a table-table join has no stream sources
        before, after = join.margins(source.name)
        rows = positions.read_rows(source, (lo - before, hi + after), (lo, hi)).persist()
        cached.append(rows)
        accepted, rejected = kernel.split_rejected(rows)
        rejected_parts.append(kernel.rejected_side_rows(source.name, rejected.where(owned)))
        settled_rows[source.name] = accepted.where(settled)
    commits: set[arrival.Position] = set()
    if plan.streams:
        counts, commits = _tally(cached, plan, (lo, hi), frontier)
    timeline = positions.timeline(commits, frontier)

    tables = {}
    for source in plan.tables:
        first = positions.starts[source.name]
        changes = changelog.read(
            spark, source, pinned[source.name], first.version, from_micros(first.commit_ts)
        ).persist()
        cached.append(changes)
        commits_of_table = arrival.commit_stats(changes, (lo, hi))
        rejected_parts.append(
            kernel.rejected_side_rows(source.name, changes.where(owned & F.col(arrival.REJECT).isNotNull()))
        )
        tables[source.name] = TableInput(changes, commits_of_table, pinned[source.name], owned, stream_clock)
        counts[source.name] = SourceCounts(
            rows_in=sum(c.window_rows for c in commits_of_table),
            rejected=sum(c.window_rejected for c in commits_of_table),
        )

    result = kernel.step(
        spark, plan, settled_rows, timeline, mode, window=(lo, hi), tables=tables, final=closed
    )
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
        delta_io.write_slice(
            reduce(DataFrame.unionByName, rejected_parts), out.side("rejected"), "slice_time", start, end
        )
        after_write(out.side("rejected"))
    for frame in cached:
        frame.unpersist()

    for name, decided in result.counts.items():
        c = counts[name]
        c.late, c.joined, c.open = decided.late, decided.joined, decided.open
        c.unmatched_emitted, c.unmatched_dropped = decided.unmatched_emitted, decided.unmatched_dropped
        c.applied = decided.applied
    metrics = RunMetrics(
        job=spec.name,
        runner="replay",
        mode=mode,
        run_id=str(uuid.uuid4()),
        started_at=started_at,
        slice_start=start,
        slice_end=end,
        versions=pinned,
        frontier=f"input closed at {_describe_position(frontier)}"
        if closed
        else _describe_position(frontier),
        watermark=None if result.watermark is None else from_micros(result.watermark),
        sources=counts,
        rows_out=rows_out,
        duration_s=round(time.monotonic() - began, 3),
        upserts=upserts,
        deletes=deletes,
    )
    delta_io.append(to_frame(spark, metrics), out.side("metrics"))
    return metrics


def _tally(
    rows: list[DataFrame], plan: Plan, window: tuple[int, int], frontier: arrival.Position | None
) -> tuple[dict[str, SourceCounts], set[arrival.Position]]:
    """The stream sources' counts (rows the slice owns: in, rejected, not settled) and the
    positions of the settled commits with accepted rows, from one aggregate per commit over every
    source's rows (all rows of a commit share its position, so whether they are settled is
    decided here, from the frontier)."""
    columns = (TS, arrival.SRC, arrival.V, T, arrival.REJECT)
    per_commit = arrival.commit_stats(
        reduce(DataFrame.unionByName, [r.select(*columns) for r in rows]), window
    )
    counts = {s.name: SourceCounts() for s in plan.streams}
    names = {s.index: s.name for s in plan.streams}
    commits: set[arrival.Position] = set()
    for c in per_commit:
        counted = counts[names[c.position[1]]]
        counted.rows_in += c.window_rows
        counted.rejected += c.window_rejected
        if frontier is None or c.position > frontier:
            counted.unsettled += c.window_rows - c.window_rejected
        elif c.max_event is not None:  # it has accepted rows
            commits.add(c.position)
    return counts, commits


def _describe_position(position: arrival.Position | None) -> str | None:
    if position is None:
        return None
    ts, src, version = position
    return f"{from_micros(ts).isoformat()} source {src} version {version}"
