"""Backfills: [start, end) cut into slices, each one replay over input versions pinned once.

A backfill chooses its input versions once (given, or each source's latest), records them, and runs
one replay per slice. Slices are independent and idempotent (a replay replaces its slice), so they
can run in any order, be re-run alone (`only_failed`), and together equal one replay of [start,
end). Every slice's output is validated (streamjoin.validation) and every attempt is recorded in
`<output>_backfill`, which `only_failed` and the hand-off read back.
"""

from __future__ import annotations

import json
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pendulum
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType, TimestampType

from streamjoin import definition, delta_io, index, kernel
from streamjoin.arrival import Slice
from streamjoin.errors import HistoryNotRetainedError, JobError, StorageError
from streamjoin.frames import local_frame
from streamjoin.metrics import RunMetrics
from streamjoin.plan import Plan, bind
from streamjoin.reach import Reach, reaches, refuse_before
from streamjoin.reach import describe as describe_reach
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import DEFAULTS, RunOptions
from streamjoin.runners.replay import (
    check_inputs,
    check_live_writer,
    one_driver,
    pin_versions,
    replay,
    replay_slices,
)
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import END_OF_INPUT, format_duration, from_spark, parse_duration, to_micros

if TYPE_CHECKING:  # imported where it runs: validation needs Great Expectations
    from streamjoin.validation import ValidationResult

DAY = timedelta(days=1)
SUCCEEDED, FAILED, INVALID = "succeeded", "failed", "invalid"


def cut(start: datetime, end: datetime, every: str, timezone: str = "UTC") -> list[Slice]:
    """Slices of [start, end) whose boundaries fall on local multiples of `every` in `timezone`.

    Whole days step by calendar days (a daylight-saving day lasts 23 or 25 hours); shorter
    durations must divide a day and step in absolute time from each local midnight (so an hourly
    backfill has 23 or 25 slices on such a day). A start or end between boundaries gives a
    shorter first or last slice.
    """
    step = parse_duration(every, "every")
    if step <= timedelta(0):
        raise JobError(f"every {every!r} must be positive, e.g. 1h or 1d")
    if step < DAY and DAY % step:
        raise JobError(f"every {every!r} must divide a day (e.g. 15m, 1h, 6h) or be whole days (1d, 7d)")
    if step >= DAY and step % DAY:
        raise JobError(f"every {every!r} is longer than a day but not whole days; write e.g. 1d or 2d")
    try:
        zone = pendulum.timezone(timezone)
    except Exception:
        raise JobError(
            f"time zone {timezone!r} is unknown; write an IANA name such as UTC or Europe/Berlin"
        ) from None
    start, end = pendulum.instance(start).in_timezone(zone), pendulum.instance(end).in_timezone(zone)
    if not start < end:
        raise JobError(f"the backfill interval [{start}, {end}) is empty; start must be before end")
    boundaries, day = [], start.start_of("day")
    while day < end:
        next_day = day.add(days=step // DAY) if step >= DAY else day.add(days=1)
        point = day
        while point < next_day:
            if start < point < end:
                boundaries.append(point)
            point = next_day if step >= DAY else point + step
        day = next_day
    points = [start, *boundaries, end]
    return [
        Slice(a.in_timezone("UTC"), b.in_timezone("UTC")) for a, b in zip(points, points[1:], strict=False)
    ]


@dataclass(frozen=True)
class Backfill:
    """A backfill's whole plan: its slices and the input versions every slice reads."""

    job: JoinSpec
    id: str
    start: datetime
    end: datetime
    every: str
    timezone: str
    mode: str
    versions: dict[str, int]
    slices: tuple[Slice, ...]
    margins: dict[str, tuple[timedelta, timedelta] | None] = field(default_factory=dict)  # None: read whole
    reach: tuple[Reach, ...] = ()  # what each source can serve (streamjoin.reach)
    assume_earliest_known: bool = False  # tables are looked up in their earliest known state before it

    def options(self, given: RunOptions = DEFAULTS) -> RunOptions:
        """How each slice runs: `given`'s validation and Data Docs site, over this backfill's mode,
        its pinned versions (checked once, by `prepare`) and the tables' earliest known times."""
        return replace(
            given, mode=self.mode, versions=self.versions, checked=True, known_from=self.known_from()
        )

    def known_from(self) -> dict[str, int] | None:
        """With --assume-earliest-known, each table source's earliest time it can be told at."""
        if not self.assume_earliest_known:
            return None
        return {r.source: r.since for r in self.reach if r.since is not None and r.table}

    def describe(self) -> str:
        """What a dry run prints: range, versions, margins and slices, without running anything."""
        lines = [
            f"backfill {self.id} of job {self.job.name}: [{self.start.isoformat()}, {self.end.isoformat()}) "
            f"every {self.every} in {self.timezone}, mode {self.mode}, {len(self.slices)} slice(s)",
            "pinned versions (every slice reads these):",
        ]
        lines += [f"  {name}: version {version}" for name, version in sorted(self.versions.items())]
        lines.append("margins (rows each slice reads beyond its own interval, by event time):")
        for name, margin in self.margins.items():
            text = (
                "all its rows (or changes) up to its pinned version"
                if margin is None
                else f"{format_duration(margin[0])} before, {format_duration(margin[1])} after"
            )
            lines.append(f"  {name}: {text}")
        if self.reach:
            lines.append(describe_reach(list(self.reach)))
        if self.known_from():
            lines.append(
                "--assume-earliest-known: a row looked up before what its table can serve is looked up in the "
                "table's earliest known state and counted as assumed"
            )
        lines.append("slices:")
        lines += [f"  {i + 1:>4}. {s.label(self.timezone)}" for i, s in enumerate(self.slices)]
        return "\n".join(lines)


def plan_backfill(
    spark: SparkSession,
    spec: JoinSpec,
    span: Slice,
    every: str | None = None,
    timezone: str | None = None,
    options: RunOptions = DEFAULTS,
    assume_earliest_known: bool = False,
) -> Backfill:
    """Cut `span` (by the job's schedule unless `every`/`timezone` are given) and pin versions
    once (`options.versions`, else the latest), for `options.mode`. A range that starts before
    what every source can serve is refused (`reach`), unless `assume_earliest_known` and only
    tables fall short: their rows are then looked up in the tables' earliest known state and
    counted as assumed."""
    every = every or spec.meta.schedule.every
    timezone = timezone or spec.meta.schedule.timezone
    slices = cut(span.start, span.end, every, timezone)
    plan = bind(spark, spec)
    definition.check(spark, spec)
    join = kernel.family(plan)
    margins: dict[str, tuple[timedelta, timedelta] | None] = {}
    for s in plan.streams:
        before, after = join.margins(s.name)
        whole = max(before, after) >= END_OF_INPUT  # ROWS windows: every slice reads the whole stream
        margins[s.name] = None if whole else (timedelta(microseconds=before), timedelta(microseconds=after))
    margins.update({s.name: None for s in plan.tables})
    found = reaches(spark, plan)
    refuse_before(found, slices[0].start, plan, tables_assumed=assume_earliest_known)
    return Backfill(
        job=spec,
        id=str(uuid.uuid4()),
        start=slices[0].start,
        end=slices[-1].end,
        every=every,
        timezone=timezone,
        mode=options.mode,
        versions=pin_versions(spark, plan, dict(options.versions or {})),
        slices=tuple(slices),
        margins=margins,
        reach=tuple(found),
        assume_earliest_known=assume_earliest_known,
    )


def prepare(spark: SparkSession, backfill: Backfill) -> None:
    """What every slice needs, done once: the pinned snapshots are checked, the arrival index is
    brought up to them, and slices a live run may still write into are refused before any is
    written (docs/backfills.md). The slices then skip the first (the index step is cheap to repeat)."""
    plan = bind(spark, backfill.job)
    check_inputs(spark, plan, backfill.versions)
    index.update(spark, plan, backfill.versions)
    check_live_writer(spark, plan, backfill.slices, backfill.versions)


@dataclass(frozen=True)
class SliceOutcome:
    """What became of one slice: status, the replay's metrics, the validation, the error if any."""

    slice: Slice
    status: str
    metrics: RunMetrics | None = None
    validation: ValidationResult | None = None
    error: str | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == SUCCEEDED


def run_slice(
    spark: SparkSession,
    spec: JoinSpec,
    start: datetime,
    end: datetime,
    options: RunOptions = DEFAULTS,
    backfill_id: str | None = None,
) -> SliceOutcome:
    """Replay one slice, validate its output and record the attempt; never raises for a slice's failure.

    A job that cannot run at all (a JobError before any data moves) still raises: every slice would
    fail the same way, and the message says what to change.
    """
    piece = Slice(pendulum.instance(start).in_timezone("UTC"), pendulum.instance(end).in_timezone("UTC"))
    (outcome,) = run_slices(spark, spec, [piece], options, backfill_id)
    return outcome


def run_slices(
    spark: SparkSession,
    spec: JoinSpec,
    pieces: list[Slice],
    options: RunOptions = DEFAULTS,
    backfill_id: str | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> list[SliceOutcome]:
    """Replay consecutive slices together (`replay_slices`: one read, one write of each table, a
    metrics row per slice), validate each slice's output (`options.validate`), and record every
    attempt in one append.

    Never raises for the slices' failure: if the replay fails, every slice of it failed (none was
    written: the writes are Delta commits of all of them at once, and a re-run replaces them); a
    slice whose validation fails or cannot run is `invalid` or `failed` alone. A JobError (the job
    cannot run at all) or a HistoryNotRetainedError (the pinned versions' log or files are gone,
    so no slice over them can run) still raises, and nothing is recorded. `on_stage` is told what
    starts: the replay, each slice's validation, the record."""
    stage = on_stage or (lambda text: None)
    span = Slice(pieces[0].start, pieces[-1].end)
    with one_driver(spark, spec, options.into):
        stage(f"replaying {len(pieces)} slice(s) {span.short_label()} UTC")
        runs, outcomes = _replayed(spark, spec, pieces, options)
        if runs:
            stage(
                f"validating {len(pieces)} slice(s) {span.short_label()} UTC"
                if options.validate
                else "counting"
            )
            outcomes = _outcomes(spark, spec, pieces, runs, options)
        pinned = runs[0].versions if runs else dict(options.versions or {})
        stage(f"recording {len(outcomes)} attempt(s)")
        _record(spark, spec, outcomes, backfill_id or str(uuid.uuid4()), options.mode, pinned)
    return outcomes


def _replayed(
    spark: SparkSession, spec: JoinSpec, pieces: list[Slice], options: RunOptions
) -> tuple[list[RunMetrics], list[SliceOutcome]]:
    """The slices replayed together: their metrics, or (a Spark or I/O failure) each one failed."""
    began = time.monotonic()
    try:
        return replay_slices(spark, spec, pieces, options), []
    except (JobError, HistoryNotRetainedError, StorageError):  # no slice can run: stop, with the message
        raise
    except Exception as exc:  # a Spark or I/O failure: these slices failed, the backfill goes on
        error = _short_error(exc)
        share = round((time.monotonic() - began) / len(pieces), 3)
        return [], [SliceOutcome(p, FAILED, error=error, duration_s=share) for p in pieces]


def _outcomes(
    spark: SparkSession, spec: JoinSpec, pieces: list[Slice], runs: list[RunMetrics], options: RunOptions
) -> list[SliceOutcome]:
    """The replayed slices' outcomes: a slice whose rows do not add up failed, whatever validation
    would say; the others are as their validation says (all of them validated together, in one
    pass over their rows: `validation.validate_slices`), or failed when it cannot run."""
    checking = time.monotonic()
    problems = [metrics.unbalanced() for metrics in runs]
    results: list[ValidationResult | None] = [None] * len(pieces)
    error: str | None = None
    if options.validate and any(problem is None for problem in problems):
        try:
            from streamjoin.validation import validate_slices

            rows = slice_output(spark, spec, Slice(pieces[0].start, pieces[-1].end))
            results = list(validate_slices(spark, spec, rows, pieces, options.site))
        except JobError:
            raise
        except Exception as exc:
            error = _short_error(exc)
    share = (time.monotonic() - checking) / len(pieces)
    outcomes = []
    for piece, metrics, problem, result in zip(pieces, runs, problems, results, strict=True):
        status, text = SUCCEEDED if result is None or result.success else INVALID, None
        if problem is not None:  # its rows do not add up: failed, whatever validation says
            status, text, result = FAILED, str(problem), None
        elif options.validate and result is None:
            status, text = FAILED, error
        outcomes.append(
            SliceOutcome(piece, status, metrics, result, text, round(metrics.duration_s + share, 3))
        )
    return outcomes


def batches(pieces: list[Slice], size: int) -> list[list[Slice]]:
    """Consecutive runs of slices (each starting where the one before ended), at most `size` long:
    the groups a backfill replays together."""
    if size < 1:
        raise JobError(f"a batch of {size} slices is empty; give 1 (one replay per slice) or more")
    groups: list[list[Slice]] = []
    for piece in pieces:
        last = groups[-1] if groups else None
        if last and len(last) < size and last[-1].end == piece.start:
            last.append(piece)
        else:
            groups.append([piece])
    return groups


# How many consecutive slices a backfill replays together by default: a day of hourly slices, or
# about a month of daily ones. Together they pay the fixed cost of a replay (reading the index, the
# Delta log, the commits) once; the batch's inputs and outputs are held in memory until written.
BATCH = 24


def run_backfill(
    spark: SparkSession,
    backfill: Backfill,
    slices: list[Slice] | None = None,
    options: RunOptions = DEFAULTS,
    on_slice: Callable[[SliceOutcome], None] | None = None,
    batch: int = BATCH,
    on_stage: Callable[[str], None] | None = None,
) -> list[SliceOutcome]:
    """Run the backfill's slices (or the given subset) in order, each over the pinned versions
    (checked and indexed once, before the first slice), up to `batch` consecutive slices per replay;
    validated as `options` says (the backfill's plan gives mode and versions: `Backfill.options`).
    `on_slice` is told of each slice's outcome, `on_stage` of each stage as it starts."""
    groups = batches(list(slices if slices is not None else backfill.slices), batch)
    if on_stage:
        on_stage("checking the pinned versions, extending the arrival index")
    outcomes = []
    with one_driver(spark, backfill.job):  # refused at once while another driver writes its tables
        prepare(spark, backfill)
        for group in groups:
            for outcome in run_slices(
                spark, backfill.job, group, backfill.options(options), backfill.id, on_stage
            ):
                outcomes.append(outcome)
                if on_slice:
                    on_slice(outcome)
    return outcomes


def written_table(plan: Plan) -> str:
    """The table that holds a slice's rows: the output, or for a keyed result (table-table joins)
    its changes, <output>_changes (the result table is those changes applied)."""
    out = plan.spec.output
    return out.side("changes") if kernel.family(plan).keyed_output(plan) else out.location


def slice_output(spark: SparkSession, spec: JoinSpec, piece: Slice) -> DataFrame:
    """The rows a slice wrote: the output (table-table joins: the result's changes) in [start, end)."""
    time_column = F.col(spec.output.time)
    return delta_io.read_snapshot(spark, written_table(bind(spark, spec))).where(
        (time_column >= F.lit(piece.start)) & (time_column < F.lit(piece.end))
    )


# ---------------------------------------------------------------- the record of attempts

RECORD_SCHEMA = StructType(
    [
        StructField("job", StringType()),
        StructField("backfill_id", StringType()),
        StructField("slice_start", TimestampType()),
        StructField("slice_end", TimestampType()),
        StructField("mode", StringType()),
        StructField("versions", StringType()),
        StructField("status", StringType()),
        StructField("error", StringType()),
        StructField("rows_in", LongType()),
        StructField("rows_out", LongType()),
        StructField("validation_failed", StringType()),
        StructField("docs", StringType()),
        StructField("finished_at", TimestampType()),
        StructField("duration_s", DoubleType()),
        # JSON list of {"passed", "check"}: every expectation evaluated (added after the first release)
        StructField("validation_checks", StringType()),
    ]
)


def _record(
    spark: SparkSession,
    spec: JoinSpec,
    outcomes: list[SliceOutcome],
    backfill_id: str,
    mode: str,
    versions: dict[str, int] | None,
) -> None:
    """One row per slice attempt, appended together."""
    finished = pendulum.now("UTC")
    rows = []
    for outcome in outcomes:
        metrics, validation = outcome.metrics, outcome.validation
        rows.append(
            (
                spec.name,
                backfill_id,
                outcome.slice.start,
                outcome.slice.end,
                mode,
                json.dumps(versions or {}, sort_keys=True),
                outcome.status,
                outcome.error,
                metrics.total("rows_in") if metrics else None,
                metrics.rows_out if metrics else None,
                json.dumps(list(validation.failed)) if validation else None,
                validation.docs if validation else None,
                finished,
                outcome.duration_s,
                json.dumps([{"passed": ok, "check": line} for ok, line in validation.checks])
                if validation
                else None,
            )
        )
    delta_io.append(local_frame(spark, rows, RECORD_SCHEMA), spec.output.side("backfill"), merge_schema=True)


def attempts(spark: SparkSession, spec: JoinSpec) -> DataFrame | None:
    """Every recorded slice attempt of the job, or None before its first backfill."""
    location = spec.output.side("backfill")
    return delta_io.read_snapshot(spark, location) if delta_io.exists(spark, location) else None


def unfinished(spark: SparkSession, backfill: Backfill) -> tuple[list[Slice], dict[str, int] | None]:
    """The backfill's slices whose latest attempt did not succeed (or never ran), and the versions
    the latest attempt among them pinned (so a re-run reads what the first run read)."""
    recorded = attempts(spark, backfill.job)
    if recorded is None:
        return list(backfill.slices), None
    latest: dict[tuple[int, int], Row] = {}
    for row in recorded.where(F.col("mode") == backfill.mode).collect():
        key = (to_micros(from_spark(row.slice_start)), to_micros(from_spark(row.slice_end)))
        if key not in latest or row.finished_at > latest[key].finished_at:
            latest[key] = row
    todo, pinned = [], None
    for piece in backfill.slices:
        attempt = latest.get((to_micros(piece.start), to_micros(piece.end)))
        if attempt is None or attempt.status != SUCCEEDED:
            todo.append(piece)
        if attempt is not None and (pinned is None or attempt.finished_at > pinned[0]):
            pinned = (attempt.finished_at, json.loads(attempt.versions))
    return todo, (pinned[1] if pinned else None)


# ---------------------------------------------------------------- hand-off to live

FAR_FUTURE = datetime(2200, 1, 1, tzinfo=UTC)  # "no end": the slice a hand-off replays is [at, FAR_FUTURE)


def hand_off(
    spark: SparkSession,
    spec: JoinSpec,
    at: datetime,
    checkpoint: str,
    versions: dict[str, int] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> RunMetrics:
    """Make a new live checkpoint continue exactly where a backfill ending at `at` stopped.

    The backfill wrote [start, at) over versions V (read from its record unless given). This replays
    [at, FAR_FUTURE) over the same V, which writes every row decided by V that the backfill did not,
    and seeds `checkpoint` with the state a live runner would hold after V; live then reads from V+1
    on. Backfill, this replay and live together write what one replay of everything writes: no gap,
    no overlap (docs/backfills.md). `on_stage` is told of the replay and the seeding as they start.
    """
    stage = on_stage or (lambda text: None)
    at = pendulum.instance(at).in_timezone("UTC")
    runner = LiveRunner(spark, spec, checkpoint)
    with runner.leased():  # taken before the replay writes: no live runner writes beside it
        if runner.started():
            raise JobError(
                f"checkpoint {checkpoint!r} has already run; a hand-off starts a new checkpoint (give another --checkpoint)"
            )
        versions = versions or _versions_of_backfill_ending_at(spark, spec, at)
        stage(
            f"replaying from {at.isoformat()} over the backfill's versions {json.dumps(versions, sort_keys=True)}"
        )
        metrics = replay(spark, spec, at, FAR_FUTURE, RunOptions(versions=versions))
        stage(f"seeding the live state of checkpoint {checkpoint} at those versions")
        runner.seed(versions)
    return metrics


def _versions_of_backfill_ending_at(spark: SparkSession, spec: JoinSpec, at: datetime) -> dict[str, int]:
    """The versions the latest exact backfill whose last slice ends at `at` pinned; all its slices must have succeeded."""
    recorded = attempts(spark, spec)
    ending = (
        []
        if recorded is None
        else [r for r in recorded.where(F.col("mode") == "exact").collect() if from_spark(r.slice_end) == at]
    )
    if not ending:
        raise JobError(
            f"no exact backfill of job {spec.name} ending at {at.isoformat()} is recorded in {spec.output.side('backfill')}; "
            f"run `streamjoin backfill ... --end {at.isoformat()}` first, or give the versions it used"
        )
    assert recorded is not None  # `ending` holds rows only when there is a record
    backfill_id = max(ending, key=lambda r: r.finished_at).backfill_id
    latest = {}
    for r in sorted(
        recorded.where(F.col("backfill_id") == backfill_id).collect(), key=lambda r: r.finished_at
    ):
        latest[r.slice_start] = r
    failed = [
        f"{from_spark(r.slice_start).isoformat()} ({r.status})"
        for r in latest.values()
        if r.status != SUCCEEDED
    ]
    if failed:
        raise JobError(
            f"backfill {backfill_id} ending at {at.isoformat()} has slices that did not succeed: {', '.join(failed)}; "
            "re-run them with `streamjoin backfill ... --only-failed` before handing off to live"
        )
    return json.loads(next(iter(latest.values())).versions)


def _short_error(exc: BaseException) -> str:
    """The first line of an exception (Spark's are pages long), its type, and where it came from."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    origin = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {origin.filename.rsplit('/', 1)[-1]}:{origin.lineno})" if origin else ""
    return f"{type(exc).__name__}: {text[:500]}{where}"


# What a job writes besides its output, and so what `reset` deletes: every table computed from
# the job's start. `<output>_lookups` is kept: it holds an external database's answers, which
# cannot be asked again, and stays valid for the commits it names.
COMPUTED_SIDES = ("changes", "late", "rejected", "metrics", "index", "journal", "backfill", "consistency")


def reset(spark: SparkSession, spec: JoinSpec) -> list[str]:
    """Delete a job's output, its side tables and its arrival index (everything computed from its
    start), so that it can begin again from another start; the tables deleted."""
    out = spec.output
    locations = [out.location, *(out.side(name) for name in COMPUTED_SIDES)]
    with one_driver(spark, spec):  # not from under a run that writes them
        return [where for where in locations if delta_io.delete_table(spark, where)]
