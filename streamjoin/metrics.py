"""Run metrics: one row per replay slice or live micro-batch, and the accounting that must add up.

Every input row of a run ends in exactly one bucket:
    rows_in + carried_in = rejected + late + joined + unmatched_emitted + unmatched_dropped + open + unsettled + applied
`carried_in` is what a live micro-batch inherits from the one before (rows still open or not yet
settled); a replay starts from nothing. `open` rows are on time and unmatched with their window
still open (enrichment joins: not yet decided); `unsettled` rows arrived after the frontier;
`applied` counts a table source's changes that became versions (docs/semantics.md).

A chain of joins also counts per link: the rows that reached the link and whether they matched
there, were padded (an outer link) or dropped (an INNER link's, or late at a stream-stream link),
or were looked up in a table's earliest known state because the table could not be told at their
time (`assumed`: only in a backfill run with --assume-earliest-known; docs/backfills.md):
    reached = matched + padded + dropped + assumed, and reached + open = the link before's passed + carried_in
(`links_balanced`; `LinkCounts.passed`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamjoin.errors import UnbalancedRunError
from streamjoin.frames import local_frame
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import from_micros, to_micros

BUCKETS = (
    "rejected",
    "late",
    "joined",
    "unmatched_emitted",
    "unmatched_dropped",
    "open",
    "unsettled",
    "applied",
)


LINK_BUCKETS = ("reached", "matched", "padded", "dropped", "assumed")  # LinkCounts' counts

LATE_SHARE_NOTED = 0.2  # a run whose late rows are this share of its accepted rows says so


@dataclass
class SourceCounts:
    """One source's rows in one run, by bucket."""

    rows_in: int = 0
    carried_in: int = 0
    rejected: int = 0
    late: int = 0
    joined: int = 0
    unmatched_emitted: int = 0
    unmatched_dropped: int = 0
    open: int = 0
    unsettled: int = 0
    applied: int = 0

    def balanced(self) -> bool:
        return self.rows_in + self.carried_in == sum(getattr(self, b) for b in BUCKETS)


@dataclass
class LinkCounts:
    """One link of a join chain in one run: the decided rows that reached it (not dropped by an
    earlier INNER link) and what became of them there. At an enrichment link a row with several
    matching versions counts once; a chain's first stream-stream link counts the rows it emitted."""

    link: str  # how explain names it: "2. LEFT JOIN customers"
    reached: int = 0
    matched: int = 0
    padded: int = 0
    dropped: int = 0
    # After a stream-stream first link, the joined rows waiting at this link for a table to be
    # final: those an earlier run left (carried_in) and those this run leaves (open).
    carried_in: int = 0
    open: int = 0
    # A stream-stream link after another link: the rows it passed on (one per pair and padded
    # row), when that is not matched + padded (a row joined with two partners is two rows).
    emitted: int | None = None
    # Rows looked up before the earliest time the table can be told (docs/backfills.md), joined
    # with its earliest known state instead: neither matched nor padded nor dropped.
    assumed: int = 0

    def balanced(self) -> bool:
        return self.reached == self.matched + self.padded + self.dropped + self.assumed

    @property
    def passed(self) -> int:
        """The rows this link hands the next one."""
        return self.matched + self.padded + self.assumed if self.emitted is None else self.emitted


def links_balanced(links: list[LinkCounts]) -> bool:
    """Every link adds up, and each takes what the one before passed on (with the rows waiting at
    it: reached + open = before's passed + carried_in)."""
    chained = all(
        b.reached + b.open == a.passed + b.carried_in for a, b in zip(links, links[1:], strict=False)
    )
    return chained and all(link.balanced() for link in links)


@dataclass
class RunMetrics:
    """What one run (a replay slice or a live micro-batch) read, decided and wrote."""

    job: str
    runner: str
    mode: str
    run_id: str
    started_at: datetime
    batch: int | None = None
    slice_start: datetime | None = None
    slice_end: datetime | None = None
    versions: dict[str, int] = field(default_factory=dict)
    frontier: str | None = None
    watermark: datetime | None = None
    sources: dict[str, SourceCounts] = field(default_factory=dict)
    rows_out: int = 0
    duration_s: float = 0.0
    upserts: int = 0  # table-table joins: result rows inserted or changed
    deletes: int = 0  # table-table joins: result rows removed (output tombstones)
    links: list[LinkCounts] = field(default_factory=list)  # per link of a chain (enrichment joins)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase (Stopwatch)
    lookups: int = 0  # lookup joins: answers fetched from the database in this run, not the journal

    def total(self, bucket: str) -> int:
        return sum(getattr(c, bucket) for c in self.sources.values())

    def balanced(self) -> bool:
        """The accounting adds up, per source and so in total, and per link."""
        return not self.imbalance()

    def imbalance(self) -> list[str]:
        """What does not add up, per source and per link (empty when the run balances)."""
        gaps = []
        for name, counts in self.sources.items():
            came = counts.rows_in + counts.carried_in
            gap = came - sum(getattr(counts, b) for b in BUCKETS)
            if gap:
                gaps.append(
                    f"source {name}: {gap} of its {came} rows in no bucket"
                    if gap > 0
                    else f"source {name}: {-gap} rows more in its buckets than the {came} it read"
                )
        for before, link in zip([None, *self.links], self.links, strict=False):
            gap = link.reached - link.matched - link.padded - link.dropped - link.assumed
            if gap:
                gaps.append(
                    f"link {link.link}: {gap} of the {link.reached} rows that reached it in no bucket"
                )
            handed = None if before is None else before.passed + link.carried_in - link.open
            if handed is not None and handed != link.reached:
                gaps.append(f"link {link.link}: reached by {link.reached} rows, handed {handed}")
        return gaps

    def unbalanced(self) -> UnbalancedRunError | None:
        """The error a run whose accounting does not add up fails with: which rows are missing."""
        gaps = self.imbalance()
        if not gaps:
            return None
        run = (
            f"batch {self.batch}"
            if self.batch is not None
            else f"slice {self.slice_start} .. {self.slice_end}"
        )
        return UnbalancedRunError(
            f"job {self.job}: the {self.runner} run of {run} does not add up: {'; '.join(gaps)} "
            f"(versions {self.versions}). Its rows were written and its metrics recorded, but the output may "
            "lack rows: this is a fault of streamjoin's or of the input's history; run it again once the "
            "cause is known, and report it if it persists"
        )

    def summary(self) -> str:
        """One line: what came in and what became of it."""
        total = self.total
        return (
            f"{self.job} {self.runner}/{self.mode}: in {total('rows_in')}, out {self.rows_out} | joined {total('joined')}, "
            f"unmatched emitted {total('unmatched_emitted')}, unmatched dropped {total('unmatched_dropped')}, "
            f"late {total('late')}, rejected {total('rejected')}, open {total('open')}, unsettled {total('unsettled')}"
            + (f", table changes applied {total('applied')}" if total("applied") else "")
            + (
                f", result upserts {self.upserts}, deletes {self.deletes}"
                if self.upserts or self.deletes
                else ""
            )
            + self._link_note()
            + (f", looked up in the database (not yet in the journal) {self.lookups}" if self.lookups else "")
            + " "
            f"| adds up: {'yes' if self.balanced() else 'NO'}" + self._late_note() + self._time_note()
        )

    def _time_note(self) -> str:
        """Where the run's time went, phase by phase."""
        if not self.phases:
            return ""
        return " | time: " + ", ".join(f"{phase} {seconds:.1f}s" for phase, seconds in self.phases.items())

    def as_json(self) -> dict:
        """The run as `--json` prints it: every field, times in ISO 8601, counts per source and link."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("sources", "links")}
        values = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in values.items()}
        values["sources"] = {name: asdict(counts) for name, counts in self.sources.items()}
        values["links"] = [asdict(link) for link in self.links]
        values["balanced"] = self.balanced()
        return values

    def _link_note(self) -> str:
        """A chain's links, each with how many of the rows that reached it matched."""
        if len(self.links) < 2:
            return ""
        return " | per link: " + ", ".join(
            f"{link.link} {link.matched}/{link.reached} matched"
            + (f" ({link.padded} padded)" if link.padded else "")
            + (f" ({link.dropped} dropped)" if link.dropped else "")
            for link in self.links
        )

    def _late_note(self) -> str:
        """A high share of late rows, said with its usual cause (docs/semantics.md, "Time")."""
        late, came = self.total("late"), self.total("rows_in") - self.total("rejected")
        if came <= 0 or late / came < LATE_SHARE_NOTED:
            return ""
        return (
            f" | {late / came:.0%} of the rows arrived late: is grace shorter than the time between the sources' "
            "commits? `streamjoin validate-job JOB` compares them"
        )

    def row(self) -> dict:
        values = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("versions", "sources", "links", "phases")
        }
        values["versions"] = json.dumps(self.versions, sort_keys=True)
        values["by_source"] = json.dumps({k: asdict(v) for k, v in self.sources.items()}, sort_keys=True)
        values["by_link"] = json.dumps([asdict(link) for link in self.links])
        values["by_phase"] = json.dumps(self.phases)
        values["rows_in"] = self.total("rows_in")
        values["carried_in"] = self.total("carried_in")
        for bucket in BUCKETS:
            values[bucket] = self.total(bucket)
        return values


def combine(runs: list[RunMetrics]) -> RunMetrics:
    """Consecutive live micro-batches as one run: inflows add up, what is left is the last batch's."""
    first, last = runs[0], runs[-1]
    sources = {}
    for name in first.sources:
        merged = SourceCounts(carried_in=first.sources[name].carried_in)
        for run in runs:
            counts = run.sources[name]
            merged.rows_in += counts.rows_in
            for bucket in ("rejected", "late", "joined", "unmatched_emitted", "unmatched_dropped", "applied"):
                setattr(merged, bucket, getattr(merged, bucket) + getattr(counts, bucket))
        merged.open, merged.unsettled = last.sources[name].open, last.sources[name].unsettled
        sources[name] = merged
    links = [
        LinkCounts(
            link.link,
            carried_in=link.carried_in,
            open=end.open,
            emitted=None if link.emitted is None else sum(run.links[n].emitted or 0 for run in runs),
        )
        for n, (link, end) in enumerate(zip(first.links, last.links, strict=True))
    ]
    phases: dict[str, float] = {}
    for run in runs:
        for phase, seconds in run.phases.items():
            phases[phase] = round(phases.get(phase, 0.0) + seconds, 3)
    for run in runs:
        for total, link in zip(links, run.links, strict=True):
            for bucket in LINK_BUCKETS:
                setattr(total, bucket, getattr(total, bucket) + getattr(link, bucket))
    return RunMetrics(
        job=first.job,
        runner=first.runner,
        mode=first.mode,
        run_id=first.run_id,
        started_at=first.started_at,
        batch=last.batch,
        versions=last.versions,
        frontier=last.frontier,
        watermark=last.watermark,
        sources=sources,
        rows_out=sum(r.rows_out for r in runs),
        duration_s=sum(r.duration_s for r in runs),
        upserts=sum(r.upserts for r in runs),
        deletes=sum(r.deletes for r in runs),
        lookups=sum(r.lookups for r in runs),
        links=links,
        phases=phases,
    )


SCHEMA = StructType(
    [
        StructField("job", StringType()),
        StructField("runner", StringType()),
        StructField("mode", StringType()),
        StructField("run_id", StringType()),
        StructField("started_at", TimestampType()),
        StructField("batch", LongType()),
        StructField("slice_start", TimestampType()),
        StructField("slice_end", TimestampType()),
        StructField("versions", StringType()),
        StructField("frontier", StringType()),
        StructField("watermark", TimestampType()),
        StructField("rows_in", LongType()),
        StructField("carried_in", LongType()),
        *[StructField(b, LongType()) for b in BUCKETS],
        StructField("rows_out", LongType()),
        StructField("by_source", StringType()),
        StructField("duration_s", DoubleType()),
        StructField("upserts", LongType()),
        StructField("deletes", LongType()),
        StructField("by_link", StringType()),  # JSON list of LinkCounts; added after the first release
        StructField("by_phase", StringType()),  # JSON {phase: seconds}; added later still
        StructField("lookups", LongType()),  # lookup joins (RunMetrics.lookups); added with them
    ]
)


class Stopwatch:
    """Seconds spent per phase of a run, on the monotonic clock: each `lap` charges the time since
    the previous one to its phase. Spark runs lazily, so a phase holds the Spark jobs its actions
    ran (a join's work shows where its result is first counted or written)."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def shares(self, parts: int = 1) -> dict[str, float]:
        """The phases split over `parts` runs that shared them (slices replayed together)."""
        return {phase: round(seconds / parts, 3) for phase, seconds in self.phases.items()}


def to_frame(spark: SparkSession, metrics: RunMetrics | list[RunMetrics]):
    """The metrics (one run, or several) as a DataFrame of the metrics table's schema, a row each."""
    runs = metrics if isinstance(metrics, list) else [metrics]
    rows = [run.row() for run in runs]
    return local_frame(spark, [tuple(row[f.name] for f in SCHEMA.fields) for row in rows], SCHEMA)


def untimed_elsewhere(
    spark: SparkSession, spec: JoinSpec, start: datetime, end: datetime, versions: dict[str, int]
) -> list[str]:
    """A line per stream source holding rows without a usable event time (NULL, or not parseable
    with its `time_format`) committed up to `versions` but outside [start, end), from the arrival
    index. A slice owns such a row by its commit time (docs/semantics.md, "Time"): a replay or
    backfill of [start, end) neither wrote nor counted it, so the user is told which range to
    replay to see it in `<output>_rejected`. History rows take the start's commit time."""
    from streamjoin import delta_io
    from streamjoin.index import SCHEMA

    entries = delta_io.read_own(spark, spec.output.side("index"), SCHEMA)
    if entries is None:
        return []
    low, high = to_micros(start), to_micros(end)
    outside = (F.col("untimed") > 0) & ((F.col("commit_ts") < low) | (F.col("commit_ts") >= high))
    pinned = F.element_at(
        F.create_map(*[F.lit(x) for pair in versions.items() for x in pair]), F.col("source")
    )
    rows = (
        entries.where(F.col("source").isin(list(versions)))
        .dropDuplicates(["source", "version"])
        .where(F.col("version") <= pinned)
        .groupBy("source")
        .agg(
            F.sum("rows").alias("rows"),
            F.sum("untimed").alias("untimed"),
            F.sum(F.when(outside, F.col("untimed"))).alias("outside"),
            F.min(F.when(outside, F.col("commit_ts"))).alias("first"),
            F.max(F.when(outside, F.col("commit_ts"))).alias("last"),
            F.max(F.when(outside, F.col("start"))).alias("history"),
        )
        .where(F.col("outside") > 0)
        .orderBy("source")
        .collect()
    )
    lines = []
    for r in rows:
        source = spec.source(r["source"])
        why = (
            f"NULL, or not parseable with time_format {source.time_format!r}"
            if source.time_format
            else "NULL"
        )
        first = from_micros(r["first"]).replace(microsecond=0)
        after_last = from_micros(r["last"]).replace(microsecond=0) + timedelta(seconds=1)
        lines.append(
            f"source {source.name!r}: {r['outside']} row(s) without a usable event time ({why}) were committed "
            f"outside [{start.isoformat()}, {end.isoformat()})"
            + (" (history rows among them, at the job's start)" if r["history"] else "")
            + "; a row without an event time belongs to the slice holding its commit time, so this run neither "
            f"wrote nor counted it. Replay --start {first.isoformat()} --end {after_last.isoformat()} to write "
            f"them to {spec.output.side('rejected')}"
            + (
                f". None of the {r['rows']} rows of {source.name!r} so far has a usable event time: check "
                "time_format with `streamjoin validate-job JOB`, which samples the column"
                if r["untimed"] == r["rows"]
                else ""
            )
        )
    return lines


def spark_value(value):
    """Spark's Python-object conversions (createDataFrame, expression parameters) accept only the
    exact datetime type, not pendulum's subclass; Arrow (`frames.local_frame`) takes either."""
    if isinstance(value, datetime):
        return datetime.fromtimestamp(value.timestamp(), tz=UTC)
    return value
