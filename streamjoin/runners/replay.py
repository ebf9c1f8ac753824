"""The replay runner: a deterministic batch over Delta snapshots pinned at versions, one slice at a time.

A replay is planned first and executed after. The plan (`plan_replay`, a `ReplayPlan`) binds the
job, pins each source's version and says, before any data moves, each stream source's margins, what
is read and what is written; `streamjoin explain --start --end` prints it. Executing it checks those
snapshots are retained, brings the arrival index up to them, reads each stream source's rows in the
slice's margins, settles them at the frontier, takes their watermarks from the index, hands them to
the kernel in one step, and replaces the slice's rows in the output and side tables. Re-running a
slice replaces it; slices [a, b) and [b, c) together equal [a, c); the cost of a slice follows what
it holds, not the length of the history.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce
from typing import Any

import pendulum
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streamjoin import (
    accounting,
    arrival,
    changelog,
    definition,
    delta_io,
    drift,
    index,
    journal,
    kernel,
    lease,
)
from streamjoin.arrival import Slice
from streamjoin.changelog import TableInput
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
from streamjoin.runners import hooks
from streamjoin.runners.options import DEFAULTS, RunOptions
from streamjoin.spec import JoinSpec, Output
from streamjoin.timeutil import EARLIEST, LATEST, Instant, from_micros


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
    spark: SparkSession, plan: Plan, slices: Sequence[Slice], pinned: dict[str, int]
) -> None:
    """Refuse, before any data moves, to replay slices of the job's output that a live run may still
    write into over commits it has not read (`metrics.refuse_over_live`, with the join's margins)."""
    join = kernel.family(plan)
    refuse_over_live(spark, plan, list(slices), pinned, {s.name: join.margins(s.name) for s in plan.streams})


def replay(
    spark: SparkSession, spec: JoinSpec, start: Instant, end: Instant, options: RunOptions = DEFAULTS
) -> RunMetrics:
    """Replay [start, end) of `spec` over pinned versions and replace that slice of its outputs.
    `start` and `end`: datetimes (naive: UTC) or ISO strings, as the CLI takes them.

    Reads only what the slice needs: each stream source's rows in the slice's margins (and the
    rows without event time it owns) from the pinned snapshot, lateness from the arrival index
    (extended first to the pinned versions), each table source from its start. With
    `options.closed` the input ends at the pinned versions (a closed history), so every row is
    settled and every window closes, as if a last watermark at infinity had passed; live writes
    those last rows only if more data comes."""
    (metrics,) = replay_slices(spark, spec, [Slice.of(start, end)], options)
    return metrics


def replay_slices(
    spark: SparkSession, spec: JoinSpec, slices: Sequence[Slice], options: RunOptions = DEFAULTS
) -> list[RunMetrics]:
    """Replay consecutive slices [a, b), [b, c), ... as one run: one read of the inputs, one kernel
    step and one write of each table for all of them, yet a metrics row per slice, counted as a
    replay of that slice alone counts it (slice invariance makes the rows the same). A backfill's
    way of paying a replay's fixed costs once rather than per slice; the slices are written
    together, so either all of them are or none is."""
    return plan_replay(spark, spec, slices, options).execute(spark)


def plan_replay(
    spark: SparkSession, spec: JoinSpec, slices: Sequence[Slice], options: RunOptions = DEFAULTS
) -> ReplayPlan:
    """A replay of `slices` decided before any data moves: the job bound, its operator, the
    versions pinned (`pin_versions`; the sources' logs are all it reads)."""
    pieces = _checked(slices)
    began, started_at = time.monotonic(), pendulum.now("UTC")
    with _translated(spark, spec, options.into or spec.output):
        plan = bind(spark, spec)
        operator = kernel.family(plan)
        pinned = pin_versions(spark, plan, dict(options.versions or {}))
    return ReplayPlan(plan, operator, pieces, options, pinned, began, started_at)


def _checked(slices: Sequence[Slice]) -> tuple[Slice, ...]:
    """The slices, refused unless each is non-empty and each starts where the last ended."""
    if not slices:
        raise JobError("a replay needs at least one slice")
    for piece in slices:
        if not piece.start < piece.end:
            raise JobError(
                f"the replay interval [{piece.start}, {piece.end}) is empty; start must be before end"
            )
    for before, after in zip(slices, slices[1:], strict=False):
        if after.start != before.end:
            raise JobError(
                f"slices replayed together must follow each other; one ends at {before.end}, "
                f"the next starts at {after.start}"
            )
    return tuple(slices)


@contextlib.contextmanager
def _translated(spark: SparkSession, spec: JoinSpec, out: Output) -> Iterator[None]:
    """A replay's failures in streamjoin's words: storage faults naming the table, history Delta no
    longer keeps naming the sources (and when VACUUM ran)."""
    locations = [s.location for s in spec.sources]
    try:
        with (
            delta_io.translated_storage_faults([*locations, out.location]),
            delta_io.translated_errors(", ".join(locations), "the files this replay reads"),
            counted_pass(spark),
            index.heads_read_once(),
        ):
            yield
    except HistoryNotRetainedError as error:
        if "VACUUM ran at" in str(error):
            raise
        raise HistoryNotRetainedError(f"{error}{delta_io.vacuum_note(spark, locations)}") from None


@dataclass(frozen=True)
class ReplayPlan:
    """A replay decided before any data moves ("plan first, execute later"): the bound job and its
    operator, the slices, how it runs, and the version of each source every read is pinned to; from
    them, each stream source's margins and range, what is read and what is written. `describe`
    says it (`streamjoin explain --start --end`); `execute` carries it out."""

    plan: Plan
    operator: JoinOperator
    slices: tuple[Slice, ...]
    options: RunOptions
    versions: dict[str, int]
    planned_at: float = field(default_factory=time.monotonic, compare=False)  # the run's clock starts here
    started_at: datetime = field(default_factory=lambda: pendulum.now("UTC"), compare=False)

    @property
    def out(self) -> Output:
        """Where the replay writes: the job's output, or `options.into`."""
        return self.options.into or self.plan.spec.output

    @property
    def span(self) -> Slice:
        return Slice(self.slices[0].start, self.slices[-1].end)

    def margins(self) -> dict[str, tuple[int, int]]:
        """Per stream source, how far (micros) before the slices and after them its rows are read."""
        return {s.name: self.operator.margins(s.name) for s in self.plan.streams}

    def ranges(self) -> dict[str, tuple[int, int]]:
        """Per stream source, the event times (micros) read: the slices widened by its margins
        (ROWS windows: all of it)."""
        lo, hi = self.span.micros()
        return {
            name: (max(lo - before, EARLIEST), min(hi + after, LATEST))
            for name, (before, after) in self.margins().items()
        }

    def reads(self) -> dict[str, str]:
        """What is read of each source, in words."""
        said = {}
        for name, (lo, hi) in self.ranges().items():
            if lo <= EARLIEST and hi >= LATEST:
                said[name] = "all its rows"
            else:
                said[name] = (
                    f"its rows of event time in [{_instant(lo, 'the beginning')}, {_instant(hi, 'the end')}), "
                    "and its rows without event time committed in the slices"
                )
        for source in self.plan.tables:
            said[source.name] = "its changes from the job's start"
        return {name: f"{text}, at version {self.versions[name]}" for name, text in said.items()}

    def writes(self) -> list[tuple[str, str]]:
        """The tables the replay writes, each with what it does to it."""
        out, job = self.out, self.plan.spec.output
        if self.operator.keyed_output(self.plan) is None:
            rows = [(out.location, "its rows in the slices, replaced")]
        else:
            rows = [
                (out.side("changes"), "the result's changes in the slices, replaced"),
                (out.location, "the result table as of the pinned versions, overwritten"),
            ]
        return [
            (job.side("index"), "brought up to the pinned versions (the arrival index; tables' journal too)"),
            *rows,
            (
                out.side("late"),
                "its rows in the slices, replaced (left alone while it has none there, before or after)",
            ),
            (out.side("rejected"), "the same"),
            (out.side("metrics"), "a row per slice, appended"),
        ]

    def describe(self) -> str:
        """The plan as `streamjoin explain --start --end` prints it."""
        lines = [
            f"replay of job {self.plan.spec.name} over [{self.span.start.isoformat()}, "
            f"{self.span.end.isoformat()}) in {len(self.slices)} slice(s), mode {self.options.mode}"
            + (", input closed at the pinned versions" if self.options.closed else ""),
            "reads (every source at its pinned version):",
            *(f"  {name}: {text}" for name, text in self.reads().items()),
            "writes:",
            *(f"  {table}: {what}" for table, what in self.writes()),
        ]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """The plan as `streamjoin explain --start --end --json` prints it."""
        return {
            "slices": [[s.start.isoformat(), s.end.isoformat()] for s in self.slices],
            "mode": self.options.mode,
            "closed": self.options.closed,
            "versions": self.versions,
            "margins_s": {name: [b / 1e6, a / 1e6] for name, (b, a) in self.margins().items()},
            "reads": self.reads(),
            "writes": [{"table": table, "what": what} for table, what in self.writes()],
        }

    def execute(self, spark: SparkSession) -> list[RunMetrics]:
        """Carry the replay out: check, index, read, step, write, and a metrics row per slice."""
        with _translated(spark, self.plan.spec, self.out), one_driver(spark, self.plan.spec, self.out):
            run = _prepare(spark, self)
            read = _read_streams(run)
            _read_tables(spark, run, read)
            run.watch.lap("read")
            result = _step(spark, run, read)
            written = _write(spark, run, read, result)
            definition.stamp(spark, self.plan.spec, output=self.options.into is None)
            return _account(spark, run, read, result, written)


@contextlib.contextmanager
def one_driver(spark: SparkSession, spec: JoinSpec, into: Output | None = None) -> Iterator[None]:
    """Hold the driver lease of the job's tables (and of `into`, where a replay writes elsewhere)
    while inside, where their store lets one Spark driver at a time write (`lease.one_driver`)."""
    outputs = dict.fromkeys(o.location for o in (spec.output, into or spec.output))
    with contextlib.ExitStack() as held:
        for location in outputs:
            held.enter_context(lease.one_driver(location, delta_io.single_driver_store(spark, location)))
        yield


def _instant(micros: int, unbounded: str) -> str:
    return unbounded if micros <= EARLIEST or micros >= LATEST else from_micros(micros).isoformat()


@dataclass
class _Run:
    """A planned replay being carried out: the plan, its slices as the kernel reads them, the
    arrival index read up to the pinned versions and the frontier, the clock, the frames cached."""

    replay: ReplayPlan
    slices: arrival.Slices
    positions: index.Index
    frontier: arrival.Position | None
    stream_clock: int | None  # the newest commit time of the stream sources
    watch: Stopwatch
    cached: list[DataFrame] = field(default_factory=list)

    @property
    def plan(self) -> Plan:
        return self.replay.plan

    @property
    def operator(self) -> JoinOperator:
        return self.replay.operator

    @property
    def out(self) -> Output:
        return self.replay.out

    @property
    def pinned(self) -> dict[str, int]:
        return self.replay.versions


def _prepare(spark: SparkSession, replay: ReplayPlan) -> _Run:
    """Before any data moves: the pinned snapshots checked (unless the caller did), the arrival
    index brought up to them, a live writer's slices refused, the frontier found."""
    plan, pinned = replay.plan, replay.versions
    if not replay.options.checked:
        check_inputs(spark, plan, pinned)
    definition.check(spark, plan.spec, output=replay.options.into is None)
    positions = index.update(spark, plan, pinned)
    if replay.options.into is None:  # the job's own output, which a live run may write too
        check_live_writer(spark, plan, replay.slices, pinned)
    newest = positions.newest()
    frontier = settled_up_to(newest, len(plan.streams), positions.history_end, replay.options.closed)
    clock = max((p.time for p in newest.values()), default=None)
    watch = Stopwatch(since=replay.planned_at)
    run = _Run(replay, arrival.Slices.of(replay.slices), positions, frontier, clock, watch)
    run.watch.lap("prepare")
    return run


def settled_up_to(
    newest: dict[int, arrival.Position], streams: int, history_end: arrival.Position | None, closed: bool
) -> arrival.Position | None:
    """The replay's frontier: the oldest of the stream sources' newest commits (`arrival.frontier`),
    or with a closed input (`RunOptions.closed`: nothing more will come) the newest of them."""
    if closed:
        return max(newest.values(), default=None)
    return arrival.frontier(newest, streams, history_end)


@dataclass
class Read:
    """What a replay read of its slices (`slices`): each stream's settled rows and its counts per
    slice (`read_stream`), each table's changelog and its counts per slice (`read_table`), and the
    rejected rows of every source; `inputs` hands them to the kernel."""

    slices: arrival.Slices
    settled: dict[str, DataFrame] = field(default_factory=dict)
    streams: dict[str, SliceCounts] = field(default_factory=dict)
    tables: dict[str, TableInput] = field(default_factory=dict)
    table_counts: list[dict[str, SourceCounts]] = field(default_factory=list)
    rejected: list[DataFrame] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.table_counts = self.table_counts or [{} for _ in range(len(self.slices))]

    def read_stream(
        self, name: str, rows: DataFrame, frontier: arrival.Position | None, observed: bool
    ) -> None:
        """Stream source `name`'s rows as read (in its margins, `arrival.prepare`'s columns):
        counted per slice (as the output's pass reads them, when `observed`), split into the
        rejected rows the slices own and the accepted ones, kept where settled at `frontier`."""
        settled = arrival.at_or_before(frontier) if frontier else F.lit(False)
        self.streams[name] = _stream_counts(rows, self.slices, settled, observed)
        accepted, rejected = kernel.split_rejected(self.streams[name].rows)
        owned = self.slices.owner().isNotNull()
        self.rejected.append(kernel.rejected_side_rows(name, rejected.where(owned)))
        self.settled[name] = accepted.where(settled)

    def read_table(
        self, name: str, changes: DataFrame, version: int, stream_clock: int | None, known_from: int | None
    ) -> None:
        """Table source `name`'s changelog up to `version` (`changelog.read`'s form), its commits
        counted per slice, its rejected rows the slices own kept for the side table."""
        commits = arrival.commit_stats(changes, self.slices)
        rejected = changes.where(self.slices.owner().isNotNull() & F.col(arrival.REJECT).isNotNull())
        self.rejected.append(kernel.rejected_side_rows(name, rejected))
        owner = self.slices.owner()
        self.tables[name] = TableInput(changes, commits, version, owner, stream_clock, known_from)
        for k, counts in enumerate(self.table_counts):
            counts[name] = SourceCounts(
                rows_in=sum(c.owned_rows(k) for c in commits),
                rejected=sum(c.owned_rejected(k) for c in commits),
            )

    def inputs(self, timeline: arrival.Timeline, options: RunOptions) -> kernel.StepInput:
        """The kernel's input: every source's as read, the `timeline` of the settled commits."""
        sources: dict[str, DataFrame | TableInput] = {**self.settled, **self.tables}
        return kernel.StepInput(sources, timeline, options.mode, slices=self.slices, final=options.closed)

    def any_rejected(self) -> bool:
        """Whether any source rejected a row the slices own."""
        streams = (
            counts["rejected"] for counted in self.streams.values() for counts in counted.get().values()
        )
        tables = (c.rejected for counts in self.table_counts for c in counts.values())
        return any(streams) or any(tables)


def _step(spark: SparkSession, run: _Run, read: Read) -> StepResult:
    """The kernel's one step over what was read, with the watermarks of the commits it needs."""
    positions, frontier = run.positions, run.frontier
    timeline = positions.timeline(positions.settled_commits(run.replay.ranges(), frontier), frontier)
    result = kernel.step(spark, run.plan, read.inputs(timeline, run.replay.options))
    run.watch.lap("join")
    run.cached += result.cached
    return result


def _read_streams(run: _Run) -> Read:
    """Each stream source's rows in the slices' margins from the pinned snapshot (`Read.read_stream`)."""
    read = Read(run.slices)
    span, once, ranges = run.replay.span.micros(), run.operator.reads_rows_once(), run.replay.ranges()
    for source in run.plan.streams:
        rows = run.positions.read_rows(source, ranges[source.name], span)
        # The output's pass reads each row once and counts it as it goes; the late and rejected
        # rows' writes read the snapshot again, which costs less than caching every row (bench/
        # README.md). Where the output's pass itself reads them more than once, or the source is
        # small enough that a second read's fixed cost outweighs keeping its rows, they are cached.
        if not once or _small(source.spec.location, run.pinned[source.name]):
            rows = rows.persist()
            run.cached.append(rows)
        read.read_stream(source.name, rows, run.frontier, once)
    return read


def _read_tables(spark: SparkSession, run: _Run, read: Read) -> None:
    """Each table source's changelog from its start up to the pinned version (`changelog.read`),
    its commits counted per slice (`Read.read_table`)."""
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
        known_from = (run.replay.options.known_from or {}).get(source.name)
        read.read_table(source.name, changes, run.pinned[source.name], run.stream_clock, known_from)


def _write(spark: SparkSession, run: _Run, read: Read, result: StepResult) -> SliceCounts:
    """Append the tables the step asks for (first: a replay run again reads them back), replace
    the slices' rows in the output (for a keyed result, its changes, then the output updated as
    the step asks) and in the late and rejected side tables; the output's rows counted per slice."""
    out, (start, end) = run.out, (run.replay.span.start, run.replay.span.end)
    for location in kernel.append_writes(result):
        hooks.wrote(location)
    keyed = run.operator.keyed_output(run.plan)
    written = _output_counts(result.output, run.slices, out.time, None if keyed is None else keyed.op)
    if keyed is None:
        delta_io.write_slice(written.rows, out.location, out.time, start, end, out.partition_by)
        hooks.wrote(out.location)
    else:  # the slices' result changes; the result table is updated as the step asks, below
        delta_io.write_slice(written.rows, out.side("changes"), out.time, start, end)
        hooks.wrote(out.side("changes"))
    if kernel.update_output(result, out):
        hooks.wrote(out.location)
    # A side table's slice is rewritten when the run has rows for it or the table may hold some
    # there already (to replace them); one that was and stays empty is left as it is.
    any_late = any(c.late for counts in result.by_slice for c in counts.values())
    if any_late or delta_io.holds_rows(spark, out.side("late"), "slice_time", start, end):
        delta_io.write_slice(result.late, out.side("late"), "slice_time", start, end)
        hooks.wrote(out.side("late"))
    if read.any_rejected() or delta_io.holds_rows(spark, out.side("rejected"), "slice_time", start, end):
        rejected = reduce(DataFrame.unionByName, read.rejected)
        delta_io.write_slice(rejected, out.side("rejected"), "slice_time", start, end)
        hooks.wrote(out.side("rejected"))
    for frame in run.cached:
        frame.unpersist()
    run.watch.lap("write")
    return written


def _account(
    spark: SparkSession, run: _Run, read: Read, result: StepResult, written: SliceCounts
) -> list[RunMetrics]:
    """A metrics row per slice (what was read, decided and written there), appended to the
    metrics table."""
    replay, frontier = run.replay, _describe_position(run.frontier)
    ran = accounting.Run(
        job=run.plan.spec.name,
        runner="replay",
        mode=replay.options.mode,
        run_id=None,  # one per slice
        started_at=replay.started_at,
        versions=run.pinned,
        frontier=f"input closed at {frontier}" if replay.options.closed else frontier,
        duration_s=round(
            (time.monotonic() - replay.planned_at) / len(replay.slices), 3
        ),  # slices share the time
        phases=run.watch.shares(len(replay.slices)),
    )
    parts = [
        accounting.Part(
            read={name: SourceCounts(**counted.get()[k]) for name, counted in read.streams.items()}
            | read.table_counts[k],
            written=written.get()[k],
            window=piece,
        )
        for k, piece in enumerate(replay.slices)
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
