"""How far back each source of a job can be served, and so the earliest slice the whole job can.

A replay needs, per source, the rows or versions its slices look at. What Delta and the project
still hold decides how far back that goes (docs/backfills.md, "Which slices a job can serve"):

- a stream source with row tracking: every row, however old (its newest snapshot holds them,
  each with the commit that wrote it); without it, the change files Delta keeps
  (`delta.deletedFileRetentionDuration`, 7 days by default);
- an append-only changelog table with row tracking: its whole history, the same way;
- a table updated in place (or a changelog without row tracking): its versions from the job's
  start on, from the job's journal (`<output>_journal`, kept by the index step) or from Delta
  while it still keeps them. A link that looks it up at an event time (`as_of: event_time` or a
  column) cannot be told the table before the start: nothing before it was kept.

`reaches` says it per source with the reason; `refuse_before` stops a range that starts earlier,
naming every source at once, before any data moves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from streamjoin import delta_io, index, journal
from streamjoin.errors import JobError
from streamjoin.plan import BoundSource, Plan
from streamjoin.timeutil import format_duration, from_micros, to_micros


@dataclass(frozen=True)
class Reach:
    """From when one source can be served (UTC micros; None: any time), why, and what would serve earlier."""

    source: str
    since: int | None
    why: str
    fix: str = ""
    table: bool = False  # a table source (what --assume-earliest-known can stand in for)


def reaches(spark: SparkSession, plan: Plan, start_at: dict[str, index.StartAt] | None = None) -> list[Reach]:
    """Each source's reach, for the job's start as its index pinned it (or would pin it now)."""
    _, versions, times = index.start_of(spark, plan, start_at)  # a stream's time: the job's start
    held = journal.coverage(spark, journal.location(plan))
    return [
        replace(
            _reach(spark, plan, s, times[s.name], versions[s.name], held.get(s.name)),
            table=s.spec.kind == "table",
        )
        for s in plan.sources
    ]


def _reach(
    spark: SparkSession,
    plan: Plan,
    source: BoundSource,
    started: int,
    start: int,
    held: journal.Coverage | None,
) -> Reach:
    """One source's reach; `start` its start version, `started` when its history is stamped (a
    stream's: the job's start; a table's: its own start commit)."""
    where = source.spec.location
    retention = delta_io.file_retention(spark, where)
    kept = f"Delta keeps change files {format_duration(retention)} (delta.deletedFileRetentionDuration)"
    if source.spec.kind == "stream":
        if delta_io.row_tracking(spark, where):
            return Reach(
                source.name, None, "row tracking: its newest snapshot holds every row with its commit"
            )
        return _stream_without_row_tracking(
            spark, plan, source, started, to_micros(datetime.now(UTC) - retention), kept
        )
    if journal.served_by_rows(spark, source, start):
        return Reach(
            source.name,
            None,
            "an append-only changelog with row tracking: its newest snapshot holds every version",
        )
    at_event_time = start > 0 and any(j.source == source.name and j.at_event_time for j in plan.spec.joins)
    since = started if at_event_time else None
    before = f"; its versions before its start (version {start}) were never kept" if at_event_time else ""
    if held is not None and held.first <= start:
        return Reach(
            source.name,
            since,
            f"the job's journal holds its changes since its start{before}",
            _restart(plan),
        )
    if journal.retained_since(spark, where, start):
        return Reach(
            source.name,
            since,
            f"Delta still keeps its start version {start} ({kept}){before}",
            "run `streamjoin index JOB` more often than the file retention, so that its journal keeps every version",
        )
    return Reach(
        source.name,
        NEVER,
        f"Delta no longer keeps its start version {start} ({kept}) and the job's journal does not hold it",
        "start the job later (start_at): a new job's index step then keeps its versions in the journal",
    )


def _stream_without_row_tracking(
    spark: SparkSession, plan: Plan, source: BoundSource, started: int, cutoff: int, kept: str
) -> Reach:
    """Without row tracking a stream's rows come from its change files (its history from a time
    travel to its start): the slices are servable from past the event times of every commit whose
    files Delta no longer serves, as the arrival index records them."""
    fix = "turn on row tracking (ALTER TABLE ... SET TBLPROPERTIES (delta.enableRowTracking = true))"
    gone = index.event_times_committed_before(spark, plan, source.name, cutoff, started)
    if gone is None:
        return Reach(source.name, None, f"{kept}, and it holds every commit since the job's start")
    return Reach(source.name, gone + 1, f"{kept}: commits older than that hold rows up to this time", fix)


NEVER = index.MAX_TIME  # a source that no slice can be told


def _restart(plan: Plan) -> str:
    return f"an earlier start for the job: {index.reset_command(plan)}, with start_at earlier"


def earliest(found: list[Reach]) -> int | None:
    """The earliest instant from which every source can be served (None: any)."""
    bounds = [r.since for r in found if r.since is not None]
    return max(bounds) if bounds else None


def describe(found: list[Reach]) -> str:
    """The table `validate-job`, `explain`, `index` and `backfill --dry-run` print."""
    lines = ["what each source can serve (docs/backfills.md):"]
    width = max(len(r.source) for r in found)
    for r in found:
        lines.append(f"  {r.source:<{width}}  from {_when(r.since)}: {r.why}")
    lines.append(f"  the job can serve slices from {_when(earliest(found))}")
    return "\n".join(lines)


def as_json(found: list[Reach]) -> dict:
    """The table as JSON: per source its instant (ISO, None: any time) and why; the job's earliest."""
    return {
        "sources": {r.source: {"from": _when(r.since), "why": r.why, "fix": r.fix or None} for r in found},
        "job_from": _when(earliest(found)),
    }


def _when(since: int | None) -> str:
    if since is None:
        return "any time"
    if since >= NEVER:
        return "no time"
    return from_micros(since).isoformat()


def refuse_before(found: list[Reach], start: datetime, plan: Plan, tables_assumed: bool = False) -> None:
    """Refuse a range starting before what every source can serve, naming each source that cannot;
    `tables_assumed` (--assume-earliest-known): only stream sources."""
    first = to_micros(start)
    short = [r for r in found if r.since is not None and r.since > first and not (tables_assumed and r.table)]
    if not short:
        return
    named = "; ".join(
        f"{r.source} from {_when(r.since)} ({r.why}){': ' + r.fix if r.fix else ''}" for r in short
    )
    raise JobError(
        f"job {plan.spec.name!r}: a range starting {start.isoformat()} reaches before what its sources can serve: "
        f"{named}. Start the range at {_when(earliest(found))} or later"
        + (
            ""
            if tables_assumed or not any(r.table for r in short)
            else ", or run it with --assume-earliest-known (rows looked up before what a table can serve are "
            "looked up in its earliest known state, counted as assumed, and fail validation unless the job "
            "allows them)"
        )
        + "\n"
        + describe(found)
    )
