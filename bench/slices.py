"""A backfill of N hourly slices against one replay of the same hours: `python -m bench.slices`.

Both run q20 (bench/jobs/q20.yaml) in exact mode over the same pinned Delta snapshots of the
Nexmark-like bids and auctions (bench/nexmark.py), each into its own output: the replay as one
slice [start, end), the backfill as `plan_backfill` + `run_backfill` of hourly slices with every
slice validated (Great Expectations, Data Docs) and recorded. Both write the same rows (checked).
Ratios are taken within a round; the report gives medians and the min-max over rounds, and the
Spark jobs and seconds of each stage of the backfill (jobs counted with Spark's status tracker).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench import nexmark
from bench.run import BENCH, JOBS, machine
from streamjoin import delta_io
from streamjoin.arrival import Slice
from streamjoin.backfill import BATCH, plan_backfill, run_backfill
from streamjoin.jobfile import load_job
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.session import get_spark
from streamjoin.spec import JoinSpec

TABLES = ("bids", "auctions")  # what q20 reads


def write_history(spark: SparkSession, root: Path, workload: nexmark.Workload, commit_hours: int) -> None:
    """The workload's bids and auctions, one commit per table per `commit_hours` hours of arrival."""
    shutil.rmtree(root, ignore_errors=True)
    frames = {name: nexmark.tables(spark, workload)[name].persist() for name in TABLES}
    last = max(frame.agg(F.max(nexmark.ARRIVAL)).first()[0] for frame in frames.values())
    for first in range(0, last + 1, commit_hours):
        for name, frame in frames.items():
            arrived = F.col(nexmark.ARRIVAL).between(first, first + commit_hours - 1)
            rows = frame.where(arrived).drop(nexmark.ARRIVAL)
            rows.coalesce(1).write.format("delta").mode("append").save(str(root / name))
    for frame in frames.values():
        frame.unpersist()


class JobCounter:
    """Spark jobs started since the last call (job ids grow by one per job), per stage text."""

    def __init__(self, spark: SparkSession) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.stages: list[tuple[str, float, int]] = []

    def last_job(self) -> int:
        return max(self.tracker.getJobIdsForGroup(None), default=-1)

    def stage(self, text: str) -> None:
        self.stages.append((text.split(" ")[0], time.perf_counter(), self.last_job()))

    def by_stage(self) -> dict[str, dict[str, float]]:
        """Per kind of stage: how often it ran, its seconds and Spark jobs in all."""
        totals: dict[str, dict[str, float]] = {}
        for (kind, began, first), (_, ended, last) in zip(self.stages, self.stages[1:], strict=False):
            total = totals.setdefault(kind, {"times": 0, "seconds": 0.0, "jobs": 0})
            total["times"] += 1
            total["seconds"] += ended - began
            total["jobs"] += last - first
        return totals


def one_round(spark: SparkSession, job: JoinSpec, span: Slice, pinned: dict, batch: int, site: str) -> dict:
    """One timed replay of the span, then one timed validated backfill of it in hourly slices."""
    counter = JobCounter(spark)
    first, began = counter.last_job(), time.perf_counter()
    metrics = replay(spark, job, span.start, span.end, RunOptions(versions=pinned))
    replay_s, replay_jobs = time.perf_counter() - began, counter.last_job() - first
    backfill_job = replace(job, output=replace(job.output, path=job.output.location + "_backfill"))
    first, began = counter.last_job(), time.perf_counter()
    counter.stage("planning")
    plan = plan_backfill(spark, backfill_job, span, every="1h", options=RunOptions(versions=pinned))
    outcomes = run_backfill(spark, plan, options=RunOptions(site=site), batch=batch, on_stage=counter.stage)
    counter.stage("done")
    backfill_s, backfill_jobs = time.perf_counter() - began, counter.last_job() - first
    return {
        "replay_s": replay_s,
        "replay_jobs": replay_jobs,
        "backfill_s": backfill_s,
        "backfill_jobs": backfill_jobs,
        "ratio": backfill_s / replay_s,
        "rows_out": metrics.rows_out,
        "slices": len(outcomes),
        "statuses": sorted({o.status for o in outcomes}),
        "stages": counter.by_stage(),
        "same_rows": None,
    }


def same_rows(spark: SparkSession, a: str, b: str) -> bool:
    left, right = delta_io.read_snapshot(spark, a), delta_io.read_snapshot(spark, b)
    right = right.select(*left.columns)
    return left.exceptAll(right).isEmpty() and right.exceptAll(left).isEmpty()


def measure(spark: SparkSession, args: argparse.Namespace) -> dict:
    """Write the history, then `args.rounds` rounds; the first checks both outputs hold the same rows."""
    work = Path(args.work).resolve() / f"{args.hours}h"
    workload = nexmark.Workload(
        hours=args.hours, bids_per_hour=args.bids_per_hour, auctions_per_hour=args.bids_per_hour // 10
    )
    print(
        f"[slices] writing {args.hours} h of bids and auctions, {args.commit_hours} h per commit", flush=True
    )
    write_history(spark, work / "nexmark", workload, args.commit_hours)
    text = JOBS["q20"].read_text().replace("grace: 1h", f"grace: {args.grace}")
    (work / "q20.yaml").write_text(text)
    job = load_job(work / "q20.yaml", root=work)
    pinned = {t: delta_io.latest_version(spark, str(work / "nexmark" / t)) for t in TABLES}
    span = Slice.of(nexmark.START, nexmark.START + timedelta(hours=args.hours))
    rounds = []
    for number in range(args.rounds):
        result = one_round(spark, job, span, pinned, args.batch, str(work / "site"))
        if number == 0:
            result["same_rows"] = same_rows(spark, job.output.location, job.output.location + "_backfill")
        rounds.append(result)
        print(
            f"[slices] {args.hours} slices, round {number + 1}: backfill {result['backfill_s']:.1f} s "
            f"({result['backfill_jobs']} jobs), replay {result['replay_s']:.1f} s ({result['replay_jobs']} jobs), "
            f"ratio {result['ratio']:.2f}, stages {json.dumps(result['stages'])}",
            flush=True,
        )
    return {
        "slices": args.hours,
        "bids_per_hour": args.bids_per_hour,
        "commit_hours": args.commit_hours,
        "grace": args.grace,
        "batch": args.batch,
        "rounds": rounds,
    }


def report(runs: list[dict], run: dict) -> str:
    """bench/results/slices.md: per number of slices, the ratio's median (min-max) and the stages."""
    lines = [
        "# Backfill of hourly slices against one replay of the same hours",
        "",
        f"Run finished {run['finished']} on {run['machine']}. `python -m bench.slices`; q20, exact mode, "
        "every slice validated and recorded. Ratios are backfill / replay within a round; medians (min-max).",
        "",
        "| slices | bids per hour | commit every | batch | rounds | rows out | same rows | replay s | backfill s | backfill / replay | target | replay jobs | backfill jobs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        ratios = [x["ratio"] for x in r["rounds"]]
        target = 1.3 if r["slices"] <= 24 else 1.5
        median = statistics.median(ratios)
        lines.append(
            f"| {r['slices']} | {r['bids_per_hour']:,} | {r['commit_hours']} h | {r['batch']} | {len(ratios)} | "
            f"{r['rounds'][0]['rows_out']:,} | {'yes' if r['rounds'][0]['same_rows'] else '**NO**'} | "
            f"{statistics.median(x['replay_s'] for x in r['rounds']):.1f} | "
            f"{statistics.median(x['backfill_s'] for x in r['rounds']):.1f} | "
            f"{median:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | {target} {'met' if median <= target else '**missed**'} | "
            f"{r['rounds'][0]['replay_jobs']} | {r['rounds'][0]['backfill_jobs']} |"
        )
    lines += ["", "Stages of the backfill (last round): times run, seconds, Spark jobs.", ""]
    for r in runs:
        stages = r["rounds"][-1]["stages"]
        parts = [f"{k} x{v['times']}: {v['seconds']:.1f} s, {v['jobs']} jobs" for k, v in stages.items()]
        lines.append(f"- {r['slices']} slices: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slices", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=int, default=24, help="hourly slices (and hours of events)")
    parser.add_argument("--bids-per-hour", type=int, default=15_000, help="auctions: a tenth of it")
    parser.add_argument("--commit-hours", type=int, default=1, help="hours of arrival per commit")
    parser.add_argument("--grace", default="1h", help="the job's grace (longer with longer commits)")
    parser.add_argument("--batch", type=int, default=BATCH, help="slices replayed together")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default="build/bench/slices")
    parser.add_argument("--out", default=str(BENCH / "results"))
    args = parser.parse_args(argv)
    spark = get_spark(app_name="streamjoin-bench-slices")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "slices.json"
    runs = [
        r
        for r in (json.loads(saved.read_text())["runs"] if saved.exists() else [])
        if r["slices"] != args.hours
    ]
    runs = sorted([*runs, measure(spark, args)], key=lambda r: r["slices"])
    run = {"finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine()}
    saved.write_text(json.dumps({"run": run, "runs": runs}, indent=1))
    (out / "slices.md").write_text(report(runs, run))
    return 0 if all(r["rounds"][0]["same_rows"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
