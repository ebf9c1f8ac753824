"""Consistency on real runs: does the live output hold, slice by slice, what the exact replay writes?

The replay is exact by construction, so any difference is a bug or a fault (an edit by hand, a
second writer, a lost commit). `verify` takes the live run's last batch and the input versions it
had read, replays the slices over those versions into a scratch table beside the output (nothing a
user reads is touched), compares each slice with the live output row by row, and appends one row
per slice to <output>_consistency. The cost is one replay of the slices plus one comparison.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pendulum
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamjoin import arrival, atomic, delta_io, lease
from streamjoin.arrival import Slice
from streamjoin.backfill import cut, written_table
from streamjoin.errors import HistoryNotRetainedError, JobError
from streamjoin.frames import local_frame
from streamjoin.metrics import last_live_batch
from streamjoin.plan import bind
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay_slices
from streamjoin.spec import JoinSpec, Output
from streamjoin.timeutil import Instant, from_spark, parse_instant

SCRATCH = "verify"  # the replay's rows go to <output>_verify (and its own side tables)
EXAMPLES = 5  # example differences kept per slice

SCHEMA = StructType(
    [
        StructField("job", StringType()),
        StructField("verify_id", StringType()),
        StructField("verified_at", TimestampType()),
        StructField("slice_start", TimestampType()),
        StructField("slice_end", TimestampType()),
        StructField("live_run", StringType()),
        StructField("live_batch", LongType()),
        StructField("live_running", BooleanType()),
        StructField("versions", StringType()),  # JSON: source -> the version both sides read
        StructField("output_version", LongType()),  # the live output's version compared (NULL: none yet)
        StructField("rows_replayed", LongType()),
        StructField("rows_live", LongType()),
        StructField("missing", LongType()),
        StructField("extra", LongType()),
        StructField("differing", LongType()),
        StructField("equal", BooleanType()),
        StructField("examples", StringType()),  # JSON list, at most EXAMPLES
        StructField("duration_s", DoubleType()),
    ]
)


@dataclass(frozen=True)
class LivePoint:
    """The state of the live run that is compared: its last batch, the input versions that batch
    had read, and the version of the live output that holds what it wrote."""

    run_id: str
    batch: int
    versions: dict[str, int]
    output_version: int | None  # None: the live run has written no row yet
    running: bool  # the live runner held its checkpoint: the output is taken as of the batch's end
    ended_at: datetime


@dataclass
class SliceCheck:
    """One slice compared: rows on each side and how they differ."""

    start: datetime
    end: datetime
    rows_replayed: int = 0
    rows_live: int = 0
    missing: int = 0  # in the replay, not in the live output
    extra: int = 0  # in the live output, not in the replay (a duplicate counts once per copy too many)
    differing: int = 0  # same output key on both sides, other values
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.differing)

    def describe(self, timezone: str = "UTC") -> str:
        where = Slice(self.start, self.end).label(timezone)
        if self.equal:
            return f"{where}: equal, {self.rows_live} rows"
        return (
            f"{where}: DIFFERS: {self.missing} missing, {self.extra} extra, {self.differing} differing "
            f"({self.rows_live} live rows, {self.rows_replayed} replayed)"
        )


@dataclass
class Verification:
    """A verify run: the live state compared, every slice's check, where the replay's rows are."""

    job: str
    id: str
    point: LivePoint
    slices: list[SliceCheck]
    scratch: str
    duration_s: float

    @property
    def equal(self) -> bool:
        return all(s.equal for s in self.slices)

    def describe(self, timezone: str = "UTC") -> str:
        differing = sum(not s.equal for s in self.slices)
        head = (
            f"verify {self.id} of job {self.job}: live batch {self.point.batch} (run {self.point.run_id}), "
            f"versions {json.dumps(self.point.versions, sort_keys=True)}"
        )
        if self.point.running:
            head += f"; live was running, so its output is compared as of that batch's end ({self.point.ended_at})"
        lines = [head, *(f"  {s.describe(timezone)}" for s in self.slices)]
        verdict = (
            f"all {len(self.slices)} slice(s) equal"
            if self.equal
            else f"{differing} of {len(self.slices)} slice(s) differ; examples in the consistency table and on "
            f"the data-quality page; the replay's rows are in {self.scratch}"
        )
        return "\n".join([*lines, verdict])

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "verify_id": self.id,
            "equal": self.equal,
            "live": {**dataclasses.asdict(self.point), "ended_at": self.point.ended_at.isoformat()},
            "scratch": self.scratch,
            "duration_s": self.duration_s,
            "slices": [
                {
                    **{k: v for k, v in dataclasses.asdict(s).items() if k not in ("start", "end")},
                    "start": s.start.isoformat(),
                    "end": s.end.isoformat(),
                    "equal": s.equal,
                }
                for s in self.slices
            ],
        }


def verify(
    spark: SparkSession,
    spec: JoinSpec,
    start: Instant,
    end: Instant,
    every: str | None = None,
    checkpoint: str | None = None,
) -> Verification:
    """Compare the live output of [start, end) with the exact replay, slice by slice (cut every
    `every`, default the job's schedule), record each slice in <output>_consistency and return the
    outcome. `checkpoint`: the live run's (default <output>_checkpoint); while its runner holds
    it, the output is compared as it stood when the last batch ended."""
    began = time.monotonic()
    pieces = cut(
        parse_instant(start, "start"),
        parse_instant(end, "end"),
        every or spec.meta.schedule.every,
        spec.meta.schedule.timezone,
    )
    return _verify(spark, spec, written_table(bind(spark, spec)), pieces, checkpoint, began)


def verify_written(
    spark: SparkSession, spec: JoinSpec, since_version: int | None, checkpoint: str | None = None
) -> Verification | None:
    """Verify the slices (of the job's schedule) that live output commits after `since_version`
    wrote rows into (None: every commit); None when they wrote none. What the Airflow live DAG
    runs after each live run."""
    table = written_table(bind(spark, spec))
    if not delta_io.exists(spark, table):
        return None
    newest = delta_io.latest_version(spark, table)
    first = 0 if since_version is None else since_version + 1
    if first > newest:
        return None
    time_column = F.col(f"`{spec.output.time}`")
    span = (
        delta_io.read_changes(spark, table, newest, first)
        .where(F.col("_change_type").isin("insert", "update_postimage"))
        .agg(F.min(time_column).alias("low"), F.max(time_column).alias("high"))
        .first()
    )
    if span is None or span["low"] is None:
        return None
    low, high = from_spark(span["low"]), from_spark(span["high"])
    zone = pendulum.timezone(spec.meta.schedule.timezone)
    midnight = pendulum.instance(low).in_timezone(zone).start_of("day")
    after = pendulum.instance(high).in_timezone(zone).start_of("day").add(days=1)
    every = cut(midnight, after, spec.meta.schedule.every, spec.meta.schedule.timezone)
    pieces = [s for s in every if s.start <= high and s.end > low]  # the slices [low, high] meets
    return _verify(spark, spec, table, pieces, checkpoint, time.monotonic())


def written_version(spark: SparkSession, spec: JoinSpec) -> int | None:
    """The newest version of the live table verify compares (None: not written yet); a scheduled
    live run notes it first, and `verify_written` then checks what the run added after it."""
    table = written_table(bind(spark, spec))
    return delta_io.latest_version(spark, table) if delta_io.exists(spark, table) else None


def scratch_output(spec: JoinSpec) -> Output:
    """Where verify's replay writes: <output>_verify, beside the output, never read by a user's job."""
    out = spec.output
    if out.path:
        return dataclasses.replace(out, path=out.side(SCRATCH), table=None)
    return dataclasses.replace(out, table=out.side(SCRATCH), path=None)


def live_point(spark: SparkSession, spec: JoinSpec, table: str, checkpoint: str | None = None) -> LivePoint:
    """The live run's last batch and the live output version holding its rows. The checkpoint's
    lease is held while these are read, so no batch lands in between; when a live runner holds it,
    the output is taken as of that runner's last completed batch (edits made since are judged by
    the next verify). `table`: the live table compared (`backfill.written_table`)."""
    home = atomic.under(atomic.resolve(checkpoint or f"{spec.output.location}_checkpoint"), "streamjoin")
    token, running = None, False
    if atomic.exists(home):
        try:
            token = lease.acquire(atomic.under(home, "lease.json"), lambda: True)
        except lease.CheckpointInUseError:
            running = True
    try:
        last = _last_live_batch(spark, spec)
        ended = from_spark(last["started_at"]) + timedelta(seconds=last["duration_s"] or 0.0)
        output_version: int | None = None
        if delta_io.exists(spark, table):
            if not running:
                output_version = delta_io.latest_version(spark, table)
            else:
                try:
                    output_version = delta_io.version_at(spark, table, ended)
                except HistoryNotRetainedError:
                    output_version = None  # no live output commit before the batch ended
    finally:
        if token is not None:
            lease.release(atomic.under(home, "lease.json"), token)
    versions = json.loads(last["versions"])
    unread = sorted(name for name, version in versions.items() if version < 0)
    if unread:
        raise JobError(
            f"job {spec.name}: the live run has not read source(s) {', '.join(unread)} yet, so there is no "
            "state of it to compare; run verify once the live run has read every source"
        )
    return LivePoint(last["run_id"], int(last["batch"]), versions, output_version, running, ended)


def _last_live_batch(spark: SparkSession, spec: JoinSpec):
    last = last_live_batch(spark, spec)
    if last is None:
        raise JobError(
            f"job {spec.name} has no live run recorded in {spec.output.side('metrics')}; verify compares what a "
            f"live run wrote with the replay: run `streamjoin stream {spec.name}` first"
        )
    return last


def _verify(
    spark: SparkSession,
    spec: JoinSpec,
    table: str,
    pieces: list[Slice],
    checkpoint: str | None,
    began: float,
) -> Verification:
    """`table`: the live table compared (`backfill.written_table`), found once by the caller."""
    point = live_point(spark, spec, table, checkpoint)
    scratch = scratch_output(spec)
    replay_slices(spark, spec, pieces, RunOptions(versions=point.versions, into=scratch))
    replayed = delta_io.read_snapshot(spark, _same_side(scratch, spec, table))
    if point.output_version is None:
        live = replayed.limit(0)
    else:
        live = delta_io.read_snapshot(spark, table, point.output_version)
    checks = compare(live, replayed, spec.output.time, spec.output.key, pieces)
    verification = Verification(
        spec.name, str(uuid.uuid4()), point, checks, scratch.location, round(time.monotonic() - began, 3)
    )
    _record(spark, spec, verification)
    return verification


def _same_side(scratch: Output, spec: JoinSpec, table: str) -> str:
    """The scratch table that mirrors `table` (the output or its changes)."""
    return scratch.location if table == spec.output.location else scratch.side("changes")


def compare(
    live: DataFrame, replayed: DataFrame, time_column: str, key: tuple[str, ...], pieces: list[Slice]
) -> list[SliceCheck]:
    """Each slice's rows on both sides as multisets: a row the replay has more often is missing,
    one the live output has more often is extra; with an output `key`, a missing and an extra row
    of one key pair up as one differing row. Both sides are compared on the replay's columns."""
    absent = [c for c in replayed.columns if c not in live.columns]
    if absent:
        raise JobError(
            f"the live output lacks column(s) {', '.join(absent)} that the replay writes; was the job's "
            "select changed after the live run started? Re-run the live job from a new checkpoint"
        )
    per_row = _copies(live, replayed, time_column, key, pieces).persist()
    try:
        checks = [SliceCheck(s.start, s.end) for s in pieces]
        for r in (
            per_row.groupBy("slice")
            .agg(F.sum("live").alias("live"), F.sum("replayed").alias("replayed"))
            .collect()
        ):
            checks[r["slice"]].rows_live, checks[r["slice"]].rows_replayed = r["live"], r["replayed"]
        _differences(per_row, checks)
    finally:
        per_row.unpersist()
    return checks


def _copies(
    live: DataFrame, replayed: DataFrame, time_column: str, key: tuple[str, ...], pieces: list[Slice]
) -> DataFrame:
    """Per slice, key and row (as JSON, in the replay's columns): how many copies each side holds."""
    columns = replayed.columns
    slices = arrival.Slices.of(pieces)
    number = slices.number(F.unix_micros(F.col(f"`{time_column}`")))
    row = F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns]), {"ignoreNullFields": "false"})
    row_key = (
        F.to_json(F.struct(*[F.col(f"`{c}`") for c in key]), {"ignoreNullFields": "false"}) if key else row
    )

    def side(frame: DataFrame, is_live: int) -> DataFrame:
        return frame.select(
            number.alias("slice"),
            row_key.alias("key"),
            row.alias("row"),
            F.lit(is_live).alias("live"),
            F.lit(1 - is_live).alias("replayed"),
        ).where(F.col("slice").isNotNull())

    return (
        side(live, 1)
        .unionByName(side(replayed, 0))
        .groupBy("slice", "key", "row")
        .agg(F.sum("live").alias("live"), F.sum("replayed").alias("replayed"))
    )


def _differences(per_row: DataFrame, checks: list[SliceCheck]) -> None:
    """Count each slice's missing, extra and differing rows into `checks`, with a few examples."""
    per_key = (
        per_row.where(F.col("live") != F.col("replayed"))
        .groupBy("slice", "key")
        .agg(
            F.sum(F.greatest(F.col("live") - F.col("replayed"), F.lit(0))).alias("extra"),
            F.sum(F.greatest(F.col("replayed") - F.col("live"), F.lit(0))).alias("missing"),
            F.collect_list(F.struct("row", "live", "replayed")).alias("rows"),
        )
        .withColumn("differing", F.least("extra", "missing"))
        .persist()
    )
    try:
        for r in (
            per_key.groupBy("slice")
            .agg(
                F.sum(F.col("missing") - F.col("differing")).alias("missing"),
                F.sum(F.col("extra") - F.col("differing")).alias("extra"),
                F.sum("differing").alias("differing"),
            )
            .collect()
        ):
            check = checks[r["slice"]]
            check.missing, check.extra, check.differing = r["missing"], r["extra"], r["differing"]
        first = Window.partitionBy("slice").orderBy("key")
        examples = per_key.withColumn("n", F.row_number().over(first)).where(F.col("n") <= EXAMPLES)
        for r in examples.orderBy("slice", "key").collect():
            checks[r["slice"]].examples.append(_example(r))
    finally:
        per_key.unpersist()


def _example(difference) -> dict[str, Any]:
    """One key's difference as a person reads it: the rows each side holds for it and how often."""
    live = [{"row": json.loads(r["row"]), "copies": r["live"]} for r in difference["rows"] if r["live"]]
    replayed = [
        {"row": json.loads(r["row"]), "copies": r["replayed"]} for r in difference["rows"] if r["replayed"]
    ]
    kind = "differing" if difference["differing"] else ("extra" if difference["extra"] else "missing")
    return {"kind": kind, "key": json.loads(difference["key"]), "live": live, "replay": replayed}


def _record(spark: SparkSession, spec: JoinSpec, verification: Verification) -> None:
    point, now = verification.point, pendulum.now("UTC")
    rows = [
        (
            spec.name,
            verification.id,
            now,
            s.start,
            s.end,
            point.run_id,
            point.batch,
            point.running,
            json.dumps(point.versions, sort_keys=True),
            point.output_version,
            s.rows_replayed,
            s.rows_live,
            s.missing,
            s.extra,
            s.differing,
            s.equal,
            json.dumps(s.examples, default=str),
            verification.duration_s,
        )
        for s in verification.slices
    ]
    frame = local_frame(spark, rows, SCHEMA)
    delta_io.append(frame, spec.output.side("consistency"), merge_schema=True)


def consistency(spark: SparkSession, spec: JoinSpec) -> list[dict]:
    """Every slice's latest check, oldest slice first (the data-quality page shows these)."""
    location = spec.output.side("consistency")
    if not delta_io.exists(spark, location):
        return []
    latest = Window.partitionBy("slice_start", "slice_end").orderBy(F.col("verified_at").desc())
    rows = (
        delta_io.read_snapshot(spark, location)
        .withColumn("n", F.row_number().over(latest))
        .where(F.col("n") == 1)
        .drop("n")
        .orderBy("slice_start")
        .collect()
    )
    return [r.asDict() for r in rows]
