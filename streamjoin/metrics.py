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

import bisect
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamjoin.errors import JobError, UnbalancedRunError
from streamjoin.frames import local_frame
from streamjoin.spec import JoinSpec, Source
from streamjoin.timeutil import END_OF_INPUT, format_duration, from_micros, from_spark, to_micros

if TYPE_CHECKING:
    from streamjoin.arrival import Slice
    from streamjoin.family import Total
    from streamjoin.plan import Plan

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


def waiting_at_links(links: Sequence[LinkCounts | dict]) -> int:
    """The rows waiting at a chain's links after the first (`open`), stored (`by_link`) or not:
    rows an earlier link emitted, which no source counts. The first link's waiting rows are its
    sources' own, counted `open` there."""
    return sum(link.get("open", 0) if isinstance(link, dict) else link.open for link in links[1:])


def links_balanced(links: list[LinkCounts]) -> bool:
    """Every link adds up, and each takes what the one before passed on (with the rows waiting at
    it: reached + open = before's passed + carried_in)."""
    handed_on = all(
        b.reached + b.open == a.passed + b.carried_in for a, b in zip(links, links[1:], strict=False)
    )
    return handed_on and all(link.balanced() for link in links)


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
    totals: dict[str, int] = field(default_factory=dict)  # a family's named counts (`family.Total`)
    # When many rows were late: the commit whose row set the clock behind the watermark most of
    # them missed (`explain_late`), as the summary names it. Not a column of the metrics table.
    late_cause: str | None = None

    def total(self, bucket: str) -> int:
        return sum(getattr(c, bucket) for c in self.sources.values())

    def held(self) -> int:
        """Every row not yet written: the sources' rows still open or unsettled, and the rows a
        chain's link emitted that a later link still holds (`waiting_at_links`)."""
        return self.total("open") + self.total("unsettled") + waiting_at_links(self.links)

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
            + "".join(
                f", {total.said} {self.totals[name]}"
                for name, total in named_totals().items()
                if self.totals.get(name)
            )
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
            + (f" ({link.open} waiting)" if link.open else "")
            for link in self.links
        )

    def _late_note(self) -> str:
        """A high share of late rows, said with its cause: the row that lifted the watermark most of
        them missed, when known (`explain_late`), else the usual one (docs/semantics.md, "Time")."""
        late, came = self.total("late"), self.total("rows_in") - self.total("rejected")
        if came <= 0 or late / came < LATE_SHARE_NOTED:
            return ""
        if self.late_cause:
            return f" | {late / came:.0%} of the rows arrived late: {self.late_cause}"
        return (
            f" | {late / came:.0%} of the rows arrived late: is grace shorter than the time between the sources' "
            "commits? `streamjoin validate-job JOB` compares them"
        )

    def row(self) -> dict:
        values = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("versions", "sources", "links", "phases", "late_cause", "totals")
        }
        values.update({name: self.totals.get(name, 0) for name in named_totals()})
        values["versions"] = json.dumps(self.versions, sort_keys=True)
        values["by_source"] = json.dumps({k: asdict(v) for k, v in self.sources.items()}, sort_keys=True)
        values["by_link"] = json.dumps([asdict(link) for link in self.links])
        values["by_phase"] = json.dumps(self.phases)
        values["superseded_by"] = None  # told at read time (`told_superseded`)
        values["recorded_at"] = datetime.now(UTC)
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
        totals={
            name: sum(r.totals.get(name, 0) for r in runs) for name in {n for r in runs for n in r.totals}
        },
        late_cause=next((r.late_cause for r in reversed(runs) if r.late_cause), None),
        links=links,
        phases=phases,
    )


def explain_late(spark: SparkSession, index: str, runs: list[RunMetrics], late: DataFrame | str) -> None:
    """Give each run whose late rows make the summary's note (`LATE_SHARE_NOTED`) its `late_cause`:
    the commit whose row set the event-time clock behind the watermark most of its late rows
    (`late`: the rows in the side table's form, or that table's location, read only when a run needs
    it; a replay's runs take those of their own slice) missed, from the arrival index at `index`.
    One row far ahead of the others (inside `max_future`) makes every later row late until time
    catches up; naming it tells that from a grace set too short."""
    for run in runs:
        late_count, came = run.total("late"), run.total("rows_in") - run.total("rejected")
        if came <= 0 or late_count / came < LATE_SHARE_NOTED:
            continue
        if isinstance(late, str):
            from streamjoin import delta_io

            late = delta_io.read_snapshot(spark, late)
        own = late
        if run.slice_start is not None and run.slice_end is not None:
            inside = (F.col("slice_time") >= F.lit(spark_value(run.slice_start))) & (
                F.col("slice_time") < F.lit(spark_value(run.slice_end))
            )
            own = late.where(inside)
        run.late_cause = _late_cause(spark, index, own)


def _late_cause(spark: SparkSession, index: str, late: DataFrame) -> str | None:
    """The watermark most `late` rows missed, and the commit before the first of them whose row
    holds the largest event time: the clock that watermark is grace behind."""
    from streamjoin import delta_io
    from streamjoin.index import SCHEMA as INDEX

    missed = (
        late.where(F.col("watermark").isNotNull())
        .groupBy("watermark")
        .agg(F.count(F.lit(1)).alias("rows"), F.min("commit_timestamp").alias("first"))
        .orderBy(F.col("rows").desc(), F.col("watermark").desc())
        .first()
    )
    entries = delta_io.read_own(spark, index, INDEX)
    if missed is None or entries is None:
        return None
    lifter = (
        entries.where(F.col("max_event").isNotNull())
        .dropDuplicates(["source", "version"])
        .where(F.col("commit_ts") < F.lit(to_micros(from_spark(missed["first"]))))
        .orderBy(F.col("max_event").desc(), "commit_ts", "source", "version")
        .first()
    )
    if lifter is None:
        return None
    event, committed = from_micros(lifter["max_event"]), from_micros(lifter["commit_ts"])
    lead = event - committed
    if lead <= timedelta(0):  # the clock followed the commits: a grace shorter than their spacing
        return None
    return (
        f"{missed['rows']} of them missed the watermark {from_spark(missed['watermark']).isoformat()}, grace "
        f"behind the row of source {lifter['source']!r} at event time {event.isoformat()} (its commit version "
        f"{lifter['version']}, committed at {committed.isoformat()}, {format_duration(lead)} ahead of its "
        "commit), which lifted the watermark: every later row behind it is late until the sources catch up with "
        "it. If that event time is wrong, correct the row or lower the source's max_future (rows further "
        'ahead of their commit are rejected); if it is right, the rows behind it are really late (docs/semantics.md, "Time")'
    )


def named_totals() -> dict[str, Total]:
    """The families' named totals, each a column of the metrics table (`family.totals`)."""
    from streamjoin import family

    return family.totals()


def schema() -> StructType:
    """The metrics table's columns: the runs' counts, then a column per family total, then whether
    a later replay superseded the row and when the row was recorded."""
    totals = (StructField(name, LongType()) for name in named_totals())
    return StructType([*_COLUMNS, *totals, _SUPERSEDED, _RECORDED])


_COLUMNS = (
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
)
# A replay row: the run_id of the first replay in the same mode recorded after it whose slice
# overlaps this one's (its rows replaced this slice's output); NULL while the row is current. Told
# at read time (`told_superseded`); rows recorded before that hold it stored. Added later.
_SUPERSEDED = StructField("superseded_by", StringType())
# When the row was recorded, after its run wrote its output: the order in which replays replaced a
# slice (NULL in rows recorded before the column: their started_at). Added later still.
_RECORDED = StructField("recorded_at", TimestampType())


def record_replays(spark: SparkSession, runs: list[RunMetrics], location: str) -> None:
    """Append a replay's metrics rows (consecutive slices in one mode) in one commit, a blind append
    that conflicts with no other writer. A row whose slice a later replay of the same mode replaced
    (even in part) is superseded by it; readers tell which at read time (`told_superseded`), so a
    re-run rewrites none of the earlier rows (docs/backfills.md)."""
    from streamjoin import delta_io

    delta_io.append(to_frame(spark, runs), location, merge_schema=True)


def told_superseded(rows: list[dict]) -> list[dict]:
    """The metrics table's rows (as dicts), each replay row's `superseded_by` told: the stored mark
    (rows recorded when a re-run marked them), else the run_id of the first replay row of the same
    mode recorded after it whose slice overlaps its own, else NULL (current). The current rows of a
    mode then never overlap: each slice once, by its latest run. Live rows are never superseded."""
    told = [dict(row) for row in rows]
    by_mode: dict[str, list[dict]] = {}
    for row in told:
        row.setdefault("superseded_by", None)
        if row["runner"] == "replay":
            by_mode.setdefault(row["mode"], []).append(row)
    for replays in by_mode.values():
        _mark_latest_first(replays)
    return told


def _recorded(row: dict) -> tuple[datetime, str]:
    """The order in which replay rows were recorded (`_RECORDED`; the run_id breaks ties)."""
    return from_spark(row.get("recorded_at") or row["started_at"]), row["run_id"]


def _mark_latest_first(replays: list[dict]) -> None:
    """Mark each unmarked row of one mode with the first row recorded after it whose slice overlaps
    its own. Rows are taken latest first, each painting its slice over the time line (`painted`:
    disjoint [start, end) pieces, each with the row that last painted it, in time order): a piece
    a row's slice meets holds the earliest later row that covers that time."""
    starts: list[datetime] = []
    painted: list[tuple[datetime, datetime, dict]] = []
    for row in sorted(replays, key=_recorded, reverse=True):
        low, high = from_spark(row["slice_start"]), from_spark(row["slice_end"])
        first = bisect.bisect_right(starts, low) - 1
        if first < 0 or painted[first][1] <= low:
            first += 1
        last = bisect.bisect_left(starts, high)
        met = painted[first:last]
        if met and not row["superseded_by"]:
            row["superseded_by"] = min((piece[2] for piece in met), key=_recorded)["run_id"]
        pieces = [(low, high, row)]
        if met and met[0][0] < low:
            pieces.insert(0, (met[0][0], low, met[0][2]))
        if met and met[-1][1] > high:
            pieces.append((high, met[-1][1], met[-1][2]))
        painted[first:last] = pieces
        starts[first:last] = [piece[0] for piece in pieces]


class Stopwatch:
    """Seconds spent per phase of a run, on the monotonic clock: each `lap` charges the time since
    the previous one to its phase. Spark runs lazily, so a phase holds the Spark jobs its actions
    ran (a join's work shows where its result is first counted or written)."""

    def __init__(self, since: float | None = None) -> None:
        self._last = time.monotonic() if since is None else since  # `since`: a time.monotonic() earlier
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
    columns = schema()
    return local_frame(spark, [tuple(row[f.name] for f in columns.fields) for row in rows], columns)


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
    return [
        _untimed_line(spec.source(r["source"]), r, start, end, spec.output.side("rejected")) for r in rows
    ]


def _untimed_line(source: Source, r: Row, start: datetime, end: datetime, rejected: str) -> str:
    """What `untimed_elsewhere` says of one source's rows without a usable event time (`r`: their
    counts and commit times outside the run's range)."""
    why = f"NULL, or not parseable with time_format {source.time_format!r}" if source.time_format else "NULL"
    first = from_micros(r["first"]).replace(microsecond=0)
    after_last = from_micros(r["last"]).replace(microsecond=0) + timedelta(seconds=1)
    return (
        f"source {source.name!r}: {r['outside']} row(s) without a usable event time ({why}) were committed "
        f"outside [{start.isoformat()}, {end.isoformat()})"
        + (" (history rows among them, at the job's start)" if r["history"] else "")
        + "; a row without an event time belongs to the slice holding its commit time, so this run neither "
        f"wrote nor counted it. Replay --start {first.isoformat()} --end {after_last.isoformat()} to write "
        f"them to {rejected}"
        + (
            f". None of the {r['rows']} rows of {source.name!r} so far has a usable event time: check "
            "time_format with `streamjoin validate-job JOB`, which samples the column"
            if r["untimed"] == r["rows"]
            else ""
        )
    )


def last_live_batch(spark: SparkSession, spec: JoinSpec) -> Row | None:
    """The newest live micro-batch the job's metrics record (None: no live run wrote its output)."""
    from streamjoin import delta_io

    location = spec.output.side("metrics")
    if not delta_io.exists(spark, location) or delta_io.only_nulls(location, "batch"):  # replays' rows only
        return None
    return (
        delta_io.read_snapshot(spark, location)
        .where(F.col("runner") == "live")
        .orderBy(F.col("started_at").desc(), F.col("batch").desc())
        .first()
    )


def refuse_over_live(
    spark: SparkSession,
    plan: Plan,
    slices: list[Slice],
    pinned: dict[str, int],
    margins: dict[str, tuple[int, int]],
) -> None:
    """Refuse a replay into an output a live run writes when it reads commits the live run has not
    read yet and a slice may still get rows from the live run: both would write them (docs/backfills.md,
    "Who writes an output"). Over the versions the live run has read (or older) a replay writes
    what it wrote; further, only slices no unread commit reaches (`_reached`) and for which it holds
    no rows: it left none undecided, or the slice ends by the event time its output is final to."""
    last = last_live_batch(spark, plan.spec)
    if last is None:
        return
    read = json.loads(last["versions"])
    if all(version <= read.get(name, -1) for name, version in pinned.items()):
        return
    reached = _reached(spark, plan, slices, pinned, read, margins)
    if reached is None:
        return
    final = _final_until(plan, last, margins)
    holds = bool((last["open"] or 0) + (last["unsettled"] or 0))  # rows later batches decide
    unfinished = [s for s in slices if s in reached or (holds and (final is None or s.end > final))]
    if not unfinished:
        return
    ahead = {name: version for name, version in pinned.items() if version > read.get(name, -1)}
    listed = ", ".join(f"[{s.start.isoformat()}, {s.end.isoformat()})" for s in unfinished)
    if final is not None:
        position = f" Its output is final up to event time {final.isoformat()}, its watermark less the join's margins."
    elif plan.tables or len(plan.joins) != 1:
        position = (
            " A join with a table source, or a chain, tells no event time up to which its output is final."
        )
    else:
        position = ""
    raise JobError(
        f"job {plan.spec.name}: a live run writes output {plan.spec.output.location} (run {last['run_id']}, batch "
        f"{last['batch']} of {from_spark(last['started_at']).isoformat()}, which had read "
        f"{_pairs(read)}); this replay reads further ({_pairs(ahead)}), and the live run may still write rows "
        f"into {listed}: both would write them.{position} Wait until the live run "
        "has finished with those slices (it reads the newer commits and its watermark passes them), replay "
        "only slices it has finished with ("
        + (f"ending by {final.isoformat()}, " if final is not None else "")
        + f"reached by no row it has not read), or replay with --versions {_pairs(read)} (then this replay "
        "writes what the live run wrote). To retire that live run, backfill with its versions and continue "
        "with `streamjoin handoff`"
    )


def _pairs(versions: dict[str, int]) -> str:
    return ",".join(f"{name}={version}" for name, version in sorted(versions.items()))


def _final_until(plan: Plan, last: Row, margins: dict[str, tuple[int, int]]) -> datetime | None:
    """The event time up to which the live run's output is final: its watermark (every later row
    below it is late) less the longest margin after a slice, so every window of the rows before it
    has closed. None where no watermark closes what the live run holds: a table source (rows wait
    for it), a chain, or margins without end (ROWS windows)."""
    after = max((m[1] for m in margins.values()), default=0)
    if last["watermark"] is None or plan.tables or len(plan.joins) != 1 or after >= END_OF_INPUT:
        return None
    return from_spark(last["watermark"]) - timedelta(microseconds=after)


def _reached(
    spark: SparkSession,
    plan: Plan,
    slices: list[Slice],
    pinned: dict[str, int],
    read: dict[str, int],
    margins: dict[str, tuple[int, int]],
) -> list[Slice] | None:
    """The slices a commit the live run has not read reaches: a row of it timed within the slice's
    margins, or timed or committed within the slice (late and rejected rows land there too); all of
    them when a table source has such a version (rows waiting for it may lie anywhere). None when
    no such commit brings a row (an OPTIMIZE's brings none): the replay decides as the live run did."""
    from streamjoin import delta_io
    from streamjoin.index import SCHEMA as INDEX

    if any(pinned[t.name] > read.get(t.name, -1) for t in plan.tables):
        return slices
    entries = delta_io.read_own(spark, plan.spec.output.side("index"), INDEX)
    after_live = [
        (F.col("source") == s.name) & F.col("version").between(read.get(s.name, -1) + 1, pinned[s.name])
        for s in plan.streams
    ]
    if entries is None or not after_live:
        return None
    unread = (
        entries.where(reduce(lambda a, b: a | b, after_live))
        .where(F.col("rows") > 0)
        .select("source", "commit_ts", "min_time", "max_time")
        .collect()
    )
    if not unread:
        return None

    def reaches(entry: Row, lo: int, hi: int) -> bool:
        before, after = margins[entry["source"]]
        timed = (
            entry["min_time"] is not None
            and entry["min_time"] < hi + after
            and entry["max_time"] >= lo - before
        )
        return timed or lo <= entry["commit_ts"] < hi

    return [s for s in slices if any(reaches(e, *s.micros()) for e in unread)]


def spark_value(value):
    """Spark's Python-object conversions (createDataFrame, expression parameters) accept only the
    exact datetime type, not pendulum's subclass; Arrow (`frames.local_frame`) takes either."""
    if isinstance(value, datetime):
        return datetime.fromtimestamp(value.timestamp(), tz=UTC)
    return value
