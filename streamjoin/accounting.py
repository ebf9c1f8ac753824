"""One run's metrics from its step's result, for a replay's slices and a live micro-batch alike.

A runner knows what it read and wrote (rows in, rejected and carried in per source; rows written
per slice; a live batch's rows left in its state); the step knows what became of the rows it
decided and what its operator counted beside them (`Counters`). `account` puts the two together,
one `RunMetrics` per slice (a live micro-batch is one slice), without knowing the join family.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from streamjoin.arrival import Slice
from streamjoin.joins.base import StepResult
from streamjoin.metrics import RunMetrics, SourceCounts, named_totals
from streamjoin.timeutil import from_micros

# The buckets a step decides; the runner counts rows_in, carried_in, rejected (and unsettled).
DECIDED = ("late", "joined", "unmatched_emitted", "unmatched_dropped", "open", "applied")


@dataclass(frozen=True)
class Run:
    """What a runner knows of one run beside its step's result, the same for each of its slices.
    `run_id` None: a fresh id per slice (a replay's metrics rows are one per slice run)."""

    job: str
    runner: str
    mode: str
    run_id: str | None
    started_at: datetime
    versions: dict[str, int]
    frontier: str | None
    duration_s: float  # per slice
    phases: dict[str, float]  # per slice
    batch: int | None = None


@dataclass(frozen=True)
class Part:
    """One slice of a run (a live micro-batch: its only one), as its runner read and wrote it.

    `read`: per source, the rows it counted (rows_in, rejected, carried_in; a replay's unsettled).
    `written`: rows written to the output (`rows`), and of a keyed result's changes `upserts` and
    `deletes`. `left`: per stream source, (open, unsettled) rows the live runner kept in its state,
    which replace the step's `open`. `window`: a replay slice's [start, end)."""

    read: dict[str, SourceCounts]
    written: dict[str, int]
    window: Slice | None = None
    left: dict[str, tuple[int, int]] | None = None


def account(run: Run, result: StepResult, parts: Sequence[Part]) -> list[RunMetrics]:
    """A `RunMetrics` per part: the runner's counts with the step's decisions and counters of that
    slice."""
    watermark = None if result.watermark is None else from_micros(result.watermark)
    runs = []
    for k, part in enumerate(parts):
        counted = result.counted(k)
        metrics = RunMetrics(
            job=run.job,
            runner=run.runner,
            mode=run.mode,
            run_id=run.run_id or str(uuid.uuid4()),
            started_at=run.started_at,
            batch=run.batch,
            slice_start=None if part.window is None else part.window.start,
            slice_end=None if part.window is None else part.window.end,
            versions=run.versions,
            frontier=run.frontier,
            watermark=watermark,
            sources=decided(part, result.by_slice[k]),
            rows_out=part.written.get("rows", 0),
            upserts=part.written.get("upserts", 0),
            deletes=part.written.get("deletes", 0),
            duration_s=run.duration_s,
            links=list(counted.links),
            phases=run.phases,
        )
        runs.append(with_totals(metrics, counted.totals))
    return runs


def decided(part: Part, decisions: dict[str, SourceCounts]) -> dict[str, SourceCounts]:
    """Per source: the rows the runner counted, with the buckets the step decided (and, live, the
    rows left open or unsettled in the state the runner kept)."""
    sources = {}
    for name in {**part.read, **decisions}:
        counts = replace(part.read.get(name, SourceCounts()))
        if name in decisions:
            counts = replace(counts, **{b: getattr(decisions[name], b) for b in DECIDED})
        if part.left is not None and name in part.left:
            counts.open, counts.unsettled = part.left[name]
        sources[name] = counts
    return sources


def with_totals(metrics: RunMetrics, totals: dict[str, int]) -> RunMetrics:
    """The run with an operator's named totals (`Counters.totals`); a name no family declares
    (`family.Total`) is a fault of the operator's."""
    unknown = sorted(set(totals) - set(named_totals()))
    if unknown:
        raise ValueError(f"an operator counted {unknown}, which no join family declares as a total")
    metrics.totals.update(totals)
    return metrics
