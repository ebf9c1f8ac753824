"""The replay runner: a deterministic batch over Delta snapshots pinned at versions, one slice at a time.

Control flow: pin input versions, check those snapshots are retained, bring the arrival index up
to them, read each stream source's rows in the slice's margins, settle them at the frontier, take
their watermarks from the index, hand them to the kernel in one step, and replace the slice's rows
in the output and side tables. Re-running a slice replaces it; slices [a, b) and [b, c) together
equal [a, c); the cost of a slice follows what it holds, not the length of the history.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce

import pendulum
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin import accounting, arrival, changelog, delta_io, drift, index, journal, kernel
from streamjoin.changelog import TableInput
from streamjoin.enums import Mode
from streamjoin.errors import HistoryNotRetainedError, JobError
from streamjoin.joins.base import JoinOperator, SliceCounts, StepResult, counted_pass
from streamjoin.metrics import (
    RunMetrics,
    SourceCounts,
    Stopwatch,
    explain_late,
    record_replays,
    refuse_over_live,
)
from streamjoin.plan import Plan, bind
from streamjoin.spec import JoinSpec, Output
from streamjoin.timeutil import EARLIEST, LATEST, Instant, from_micros, parse_instant, to_micros


def pin_versions(spark: SparkSession, plan: Plan, versions: dict[str, int] | None = None) -> dict[str, int]:
    """The versions a replay reads: those given, else each source's latest. A version given for a
    name that is not one of the job's sources is refused (a typo would otherwise go unnoticed);
    `check_inputs` refuses versions a source does not have. A source whose log up to the pinned
    version holds a damaged commit is refused (a StorageError naming it)."""
    pinned = dict(versions or {})
    unknown = sorted(set(pinned) - {s.name for s in plan.sources})
    if unknown:
        raise JobError(
            f"versions are given for {', '.join(map(repr, unknown))}, which job {plan.spec.name!r} has no source "
            f"of; its sources are {', '.join(s.name for s in plan.sources)}"
        )
    for source in plan.sources:
        pinned.setdefault(source.name, delta_io.latest_version(spark, source.spec.location))
        delta_io.check_log(source.spec.location, pinned[source.name])
    return pinned


def check_inputs(spark: SparkSession, plan: Plan, versions: dict[str, int]) -> None:
    """Before any data moves: no source changed a column the job uses over the versions the run
    reads (drift.py), and every source records its change feed and still holds the pinned
    snapshot (its log entry and files), unless it is a table the job's journal or its own rows
    serve. Nothing older is checked here: the index step refuses a table start that neither Delta
    nor the journal serves (journal.update)."""
    kernel.runnable(spark, plan)
    drift.check(spark, plan, index.start_of(spark, plan)[1], versions)
    for source in plan.sources:
        if source.spec.kind == "table" and journal.serves(spark, plan, source, versions[source.name]):
            continue  # its own rows or the job's journal serve it (docs/semantics.md)
        delta_io.check_retained(spark, source.spec.location, versions[source.name])


def check_live_writer(
    spark: SparkSession, plan: Plan, windows: list[tuple[datetime, datetime]], pinned: dict[str, int]
) -> None:
    """Refuse, before any data moves, to replay slices of the job's output that a live run may still
    write into over commits it has not read (`metrics.refuse_over_live`, with the join's margins)."""
    join = kernel.family(plan)
    refuse_over_live(spark, plan, windows, pinned, {s.name: join.margins(s.name) for s in plan.streams})


def replay(
    spark: SparkSession,
    spec: JoinSpec,
    start: Instant,
    end: Instant,
    mode: str = "exact",
    versions: dict[str, int] | None = None,
    after_write: Callable[[str], None] | None = None,
    checked: bool = False,
    closed: bool = False,
) -> RunMetrics:
    """Replay [start, end) of `spec` over pinned versions and replace that slice of its outputs.
    `start` and `end`: datetimes (naive: UTC) or ISO strings, as the CLI takes them.

    Reads only what the slice needs: each stream source's rows in the slice's margins (and the
    rows without event time it owns) from the pinned snapshot, lateness from the arrival index
    (extended first to the pinned versions), each table source from its start. `checked`: the
    caller (a backfill) has already run `check_inputs` on these versions. `after_write(location)`
    is called after each table is written (tests inject faults there). `closed`: the input ends at
    the pinned versions (a closed history), so every row is settled and every window closes, as if
    a last watermark at infinity had passed; live writes those last rows only if more data comes.
    """
    (metrics,) = replay_slices(
        spark, spec, [(start, end)], mode, versions, after_write=after_write, checked=checked, closed=closed
    )
    return metrics


def replay_slices(
    spark: SparkSession,
    spec: JoinSpec,
    slices: Sequence[tuple[Instant, Instant]],
    mode: str = "exact",
    versions: dict[str, int] | None = None,
    after_write: Callable[[str], None] | None = None,
    checked: bool = False,
    closed: bool = False,
    into: Output | None = None,
    known_from: dict[str, int] | None = None,
) -> list[RunMetrics]:
    """Replay consecutive slices [a, b), [b, c), ... as one run: one read of the inputs, one kernel
    step and one write of each table for all of them, yet a metrics row per slice, counted as a
    replay of that slice alone counts it (slice invariance makes the rows the same). A backfill's
    way of paying a replay's fixed costs once rather than per slice; the slices are written
    together, so either all of them are or none is. `into`: write the output, its side tables and
    the metrics there instead of the job's output (`verify`'s scratch); the arrival index stays the
    job's. `known_from`: per table source, the earliest time it can be told at, for a backfill run
    with --assume-earliest-known (`changelog.TableInput.known_from`)."""
    windows = _windows(slices)
    locations = [s.location for s in spec.sources]
    try:
        with (
            delta_io.translated_storage_faults([*locations, (into or spec.output).location]),
            delta_io.translated_errors(", ".join(locations), "the files this replay reads"),
            counted_pass(spark),
        ):
            return _replay(
                spark, spec, windows, mode, versions, after_write, checked, closed, into, known_from or {}
            )
    except HistoryNotRetainedError as error:
        if "VACUUM ran at" in str(error):
            raise
        raise HistoryNotRetainedError(f"{error}{delta_io.vacuum_note(spark, locations)}") from None


def _windows(slices: Sequence[tuple[Instant, Instant]]) -> list[tuple[datetime, datetime]]:
    """The slices in UTC (ISO strings as the CLI takes them: no zone means UTC), refused unless each
    is non-empty and each starts where the last ended."""
    utc: list[tuple[datetime, datetime]] = [
        (parse_instant(a, "start"), parse_instant(b, "end")) for a, b in slices
    ]
    if not utc:
        raise JobError("a replay needs at least one slice")
    for a, b in utc:
        if not a < b:
            raise JobError(f"the replay interval [{a}, {b}) is empty; start must be before end")
    for (_, b), (a, _) in zip(utc, utc[1:], strict=False):
        if a != b:
            raise JobError(
                f"slices replayed together must follow each other; one ends at {b}, the next starts at {a}"
            )
    return utc


@dataclass
class _Run:
    """One replay, prepared: the bound job and its operator, the slices, the pinned versions and
    the arrival index read up to them, and where it writes. What the later steps share."""

    plan: Plan
    operator: JoinOperator
    windows: list[tuple[datetime, datetime]]
    slices: arrival.Slices
    mode: str
    closed: bool
    pinned: dict[str, int]
    positions: index.Index
    frontier: arrival.Position | None
    out: Output
    known_from: dict[str, int]
    after_write: Callable[[str], None]
    watch: Stopwatch = field(default_factory=Stopwatch)
    began: float = field(default_factory=time.monotonic)
    started_at: datetime = field(default_factory=lambda: pendulum.now("UTC"))
    cached: list[DataFrame] = field(default_factory=list)

    @property
    def bounds(self) -> tuple[datetime, datetime]:
        return self.windows[0][0], self.windows[-1][1]

    def wrote(self, location: str) -> str:
        self.after_write(location)
        return location


@dataclass
class _Read:
    """What the replay read: each stream's settled rows and its counts per slice, each table's
    changelog, and the rejected rows of every source."""

    settled: dict[str, DataFrame] = field(default_factory=dict)
    streams: dict[str, SliceCounts] = field(default_factory=dict)
    tables: dict[str, TableInput] = field(default_factory=dict)
    table_counts: list[dict[str, SourceCounts]] = field(default_factory=list)
    rejected: list[DataFrame] = field(default_factory=list)
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)

    def any_rejected(self) -> bool:
        """Whether any source rejected a row the slices own."""
        streams = (
            counts["rejected"] for counted in self.streams.values() for counts in counted.get().values()
        )
        tables = (c.rejected for counts in self.table_counts for c in counts.values())
        return any(streams) or any(tables)


def _replay(
    spark: SparkSession,
    spec: JoinSpec,
    windows: list[tuple[datetime, datetime]],
    mode: str,
    versions: dict[str, int] | None,
    after_write: Callable[[str], None] | None,
    checked: bool,
    closed: bool,
    into: Output | None,
    known_from: dict[str, int],
) -> list[RunMetrics]:
    """Prepare, read, step, write, account: one replay of consecutive slices."""
    mode = Mode.parse(mode)
    plan = bind(spark, spec)
    operator = kernel.family(plan)
    pinned = pin_versions(spark, plan, versions)
    if not checked:
        check_inputs(spark, plan, pinned)
    positions = index.update(spark, plan, pinned)
    if into is None:  # the job's own output, which a live run may write too
        check_live_writer(spark, plan, windows, pinned)
    newest = positions.newest()
    frontier = arrival.frontier(newest, len(plan.streams), positions.history_end)
    if closed:  # every commit is settled: nothing more will come
        frontier = max(newest.values(), default=None)
    slices = arrival.Slices.of((to_micros(a), to_micros(b)) for a, b in windows)
    run = _Run(
        plan,
        operator,
        windows,
        slices,
        mode,
        closed,
        pinned,
        positions,
        frontier,
        into or spec.output,
        known_from,
        after_write or (lambda location: None),
    )
    run.watch.lap("prepare")
    read = _read_streams(run)
    stream_clock = max((p.time for p in newest.values()), default=None)
    _read_tables(spark, run, read, stream_clock)
    run.watch.lap("read")
    timeline = positions.timeline(positions.settled_commits(read.ranges, frontier), frontier)
    step = kernel.StepInput(read.settled, timeline, mode, slices=slices, tables=read.tables, final=closed)
    result = kernel.step(spark, plan, step)
    run.watch.lap("join")
    run.cached += result.cached
    written = _write(spark, run, read, result)
    return _account(spark, run, read, result, written)


def _read_streams(run: _Run) -> _Read:
    """Each stream source's rows in the slices' margins from the pinned snapshot, split into
    rejected and accepted, the accepted kept where settled; counted per slice."""
    read = _Read()
    settled = arrival.at_or_before(run.frontier) if run.frontier else F.lit(False)
    (lo, hi), owned = map(to_micros, run.bounds), run.slices.owner().isNotNull()
    once = run.operator.reads_rows_once()
    for source in run.plan.streams:
        before, after = run.operator.margins(source.name)
        read.ranges[source.name] = (max(lo - before, EARLIEST), min(hi + after, LATEST))  # ROWS: all of it
        rows = run.positions.read_rows(source, read.ranges[source.name], (lo, hi))
        # The output's pass reads each row once and counts it as it goes; the late and rejected
        # rows' writes read the snapshot again, which costs less than caching every row (bench/
        # README.md). Where the output's pass itself reads them more than once, or the source is
        # small enough that a second read's fixed cost outweighs keeping its rows, they are cached.
        if not once or _small(source.spec.location, run.pinned[source.name]):
            rows = rows.persist()
            run.cached.append(rows)
        read.streams[source.name] = _stream_counts(rows, run.slices, settled, once)
        accepted, rejected = kernel.split_rejected(read.streams[source.name].rows)
        read.rejected.append(kernel.rejected_side_rows(source.name, rejected.where(owned)))
        read.settled[source.name] = accepted.where(settled)
    return read


def _read_tables(spark: SparkSession, run: _Run, read: _Read, stream_clock: int | None) -> None:
    """Each table source's changelog from its start up to the pinned version (`changelog.read`),
    its commits counted per slice."""
    owned = run.slices.owner().isNotNull()
    read.table_counts = [{} for _ in run.windows]
    for source in run.plan.tables:
        first = run.positions.starts[source.name]
        changes = changelog.read(
            spark,
            source,
            run.pinned[source.name],
            first.version,
            from_micros(first.commit_ts),
            journal.location(run.plan),
        ).persist()
        run.cached.append(changes)
        commits = arrival.commit_stats(changes, run.slices)
        rejected = changes.where(owned & F.col(arrival.REJECT).isNotNull())
        read.rejected.append(kernel.rejected_side_rows(source.name, rejected))
        read.tables[source.name] = TableInput(
            changes,
            commits,
            run.pinned[source.name],
            run.slices.owner(),
            stream_clock,
            run.known_from.get(source.name),
        )
        for k, counts in enumerate(read.table_counts):
            counts[source.name] = SourceCounts(
                rows_in=sum(c.owned_rows(k) for c in commits),
                rejected=sum(c.owned_rejected(k) for c in commits),
            )


def _write(spark: SparkSession, run: _Run, read: _Read, result: StepResult) -> SliceCounts:
    """Replace the slices' rows in the output (or, for a keyed result, its changes and the result
    table) and in the late and rejected side tables; the output's rows counted per slice."""
    out, (start, end) = run.out, run.bounds
    keyed = run.operator.keyed_output(run.plan)
    written = _output_counts(result.output, run.slices, out.time, None if keyed is None else keyed.op)
    if keyed is None:
        delta_io.write_slice(written.rows, out.location, out.time, start, end, out.partition_by)
        run.wrote(out.location)
    else:  # the slices' result changes, and the result table as of the pinned versions
        assert result.result is not None  # a keyed operator's step gives its result
        delta_io.write_slice(written.rows, out.side("changes"), out.time, start, end)
        run.wrote(out.side("changes"))
        delta_io.overwrite(result.result, out.location, out.partition_by)
        run.wrote(out.location)
    # A side table's slice is rewritten when the run has rows for it or the table may hold some
    # there already (to replace them); one that was and stays empty is left as it is.
    any_late = any(c.late for counts in result.by_slice for c in counts.values())
    if any_late or delta_io.holds_rows(spark, out.side("late"), "slice_time", start, end):
        delta_io.write_slice(result.late, out.side("late"), "slice_time", start, end)
        run.wrote(out.side("late"))
    if read.any_rejected() or delta_io.holds_rows(spark, out.side("rejected"), "slice_time", start, end):
        rejected = reduce(DataFrame.unionByName, read.rejected)
        delta_io.write_slice(rejected, out.side("rejected"), "slice_time", start, end)
        run.wrote(out.side("rejected"))
    for frame in run.cached:
        frame.unpersist()
    run.watch.lap("write")
    return written


def _account(
    spark: SparkSession, run: _Run, read: _Read, result: StepResult, written: SliceCounts
) -> list[RunMetrics]:
    """A metrics row per slice (what was read, decided and written there), appended to the
    metrics table."""
    frontier = _describe_position(run.frontier)
    ran = accounting.Run(
        job=run.plan.spec.name,
        runner="replay",
        mode=run.mode,
        run_id=None,  # one per slice
        started_at=run.started_at,
        versions=run.pinned,
        frontier=f"input closed at {frontier}" if run.closed else frontier,
        duration_s=round((time.monotonic() - run.began) / len(run.windows), 3),  # slices share the time
        phases=run.watch.shares(len(run.windows)),
    )
    parts = [
        accounting.Part(
            read={name: SourceCounts(**counted.get()[k]) for name, counted in read.streams.items()}
            | read.table_counts[k],
            written=written.get()[k],
            window=window,
        )
        for k, window in enumerate(run.windows)
    ]
    runs = accounting.account(ran, result, parts)
    explain_late(spark, run.plan.spec.output.side("index"), runs, run.out.side("late"))
    record_replays(spark, runs, run.out.side("metrics"))
    return runs


# A stream source whose files at the pinned version hold at most this many bytes has the rows a
# replay reads cached: reading them again for the late and rejected rows' writes costs a snapshot's
# state and a scan, a few tenths of a second whatever they hold, where caching a few megabytes costs
# less (a replay of the fixed example of tests/harness.py: 3.15 s against 3.39 s; bench/results/suite-history.md).
SMALL_SOURCE_BYTES = 8 << 20


def _small(location: str, version: int) -> bool:
    """The source's files at `version` hold at most `SMALL_SOURCE_BYTES` (unknown: not small)."""
    size = delta_io.size_at(location, version)
    return size is not None and size <= SMALL_SOURCE_BYTES


def _output_counts(
    output: DataFrame, slices: arrival.Slices, time_column: str, op_column: str | None
) -> SliceCounts:
    """Per slice: rows written, and (changes of a keyed result, `op_column`) how many are upserts
    and deletes, counted as the write passes (write `.rows`)."""
    op = F.col(op_column) if op_column else F.lit(None)
    number = slices.number(F.unix_micros(F.col(f"`{time_column}`")))
    return SliceCounts(
        output,
        len(slices),
        rows=(number, F.lit(True)),
        upserts=(number, op == "upsert"),
        deletes=(number, op == "delete"),
    )


def _stream_counts(rows: DataFrame, slices: arrival.Slices, settled: Column, observed: bool) -> SliceCounts:
    """A stream source's rows each slice owns: read, rejected, and accepted but not settled;
    counted as the output's pass reads them (go on with `.rows`) when it reads each row once
    (`observed`), else apart."""
    owner, accepted = slices.owner(), F.col(arrival.REJECT).isNull()
    return SliceCounts(
        rows,
        len(slices),
        observed=observed,
        rows_in=(owner, F.lit(True)),
        rejected=(owner, ~accepted),
        unsettled=(owner, accepted & ~settled),
    )


def _describe_position(position: arrival.Position | None) -> str | None:
    if position is None:
        return None
    return f"{from_micros(position.time).isoformat()} source {position.source} version {position.version}"
