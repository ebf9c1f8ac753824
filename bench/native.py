"""Live micro-batch latency against Spark's own stream-stream join: `python -m bench.native`.

Both read the same two Delta tables and write a Delta table, one step at a time: a commit of N
rows to each table, then an available-now run of streamjoin's live runner and one of a Spark
Structured Streaming query joining the two streams itself (watermarks, an interval condition,
append mode), each on its own checkpoint. A step's latency is the sum of Spark's
`triggerExecution` over the micro-batches the run made (its progress reports; Spark's own query
may add a batch without data that advances its watermark). Ratios are taken within a step; the
first step of each round (a cold query) is left out. Both must write the same pairs. Beside the
times, each step's Spark jobs (load-independent) and the Delta commits streamjoin's micro-batches
made to the job's tables (output, side tables, metrics, index), per micro-batch (up to each one's
metrics row), and those its run made after its batches (the index entries they kept).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from bench.run import BENCH, machine
from streamjoin.runners import hooks
from streamjoin.runners.live import LiveRunner
from streamjoin.session import get_spark
from streamjoin.spec import JoinSpec, spec_from_dict

START = datetime(2024, 1, 1)
STEP = timedelta(minutes=1)  # the event time a step's rows span
# Seconds: the join window either way, and the watermark delay / grace. The grace exceeds a
# step's span: streamjoin judges lateness by the newest event time of both streams (Spark by the
# older of the two watermarks), so a step's second commit must not be late behind its first.
WITHIN, GRACE = 10, 120


def job(root: Path) -> JoinSpec:
    """The streamjoin job: an INNER interval join of l and r on k within 10 s, grace 30 s."""
    return spec_from_dict(
        {
            "name": "native_comparison",
            "sources": {side: {"path": str(root / side), "time": "t"} for side in ("l", "r")},
            "from": "l",
            "joins": [{"join": "r", "on": "l.k = r.k", "within": f"{WITHIN}s", "grace": f"{GRACE}s"}],
            "select": ["l.id AS lid", "r.id AS rid"],
            "output": {"path": str(root / "streamjoin_out")},
        }
    )


def native_query(spark: SparkSession, root: Path) -> StreamingQuery:
    """Spark's own join of the same tables into a Delta table, available-now, on its checkpoint."""

    def side(name: str) -> DataFrame:
        stream = spark.readStream.format("delta").load(str(root / name))
        return stream.withWatermark("t", f"{GRACE} seconds").alias(name)

    condition = F.expr(
        f"l.k = r.k AND r.t >= l.t - INTERVAL {WITHIN} SECONDS AND r.t <= l.t + INTERVAL {WITHIN} SECONDS"
    )
    joined = (
        side("l").join(side("r"), condition).select(F.col("l.id").alias("lid"), F.col("r.id").alias("rid"))
    )
    return (
        joined.writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", str(root / "native_checkpoint"))
        .trigger(availableNow=True)
        .start(str(root / "native_out"))
    )


def commit(spark: SparkSession, root: Path, side: str, step: int, rows: int, seed: int) -> None:
    """`rows` rows of step `step` to table `side`: ids unique per table, keys over a quarter as
    many values as rows, event times spread over the step's minute in id order."""
    first = step * rows
    frame = spark.range(first, first + rows, numPartitions=1).select(
        (F.rand(seed) * max(rows // 4, 1)).cast("int").alias("k"),
        F.col("id"),
        (
            F.lit(START + step * STEP)
            + F.make_dt_interval(
                secs=((F.col("id") - first) * STEP.total_seconds() / rows).cast("decimal(18,6)")
            )
        ).alias("t"),
    )
    frame.write.format("delta").mode("append").save(str(root / side))


def _jobs(spark: SparkSession) -> int:
    """How many Spark jobs the application has started so far (the scheduler's job counter)."""
    return spark.sparkContext._jsc.sc().dagScheduler().numTotalJobs()


def _commits(root: Path) -> int:
    """The Delta commits of streamjoin's output and its side tables under `root` so far."""
    tables = [p for p in root.glob("streamjoin_out*") if (p / "_delta_log").is_dir()]
    return sum(len(list((p / "_delta_log").glob("*.json"))) for p in tables)


def _latency(progress: list[dict]) -> float:
    """Seconds of `triggerExecution` over a run's micro-batches."""
    return sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000


def measure_round(spark: SparkSession, root: Path, rows: int, steps: int, seed: int) -> dict:
    """One round at `rows` rows per commit: per step, streamjoin's and Spark's latency (seconds)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for n, side in enumerate(("l", "r")):
        commit(spark, root, side, 0, rows, seed + n)
    runner = LiveRunner(spark, job(root), str(root / "streamjoin_checkpoint"))
    ours, theirs, jobs, commits = [], [], [], []
    for step in range(steps):
        if step:
            for n, side in enumerate(("l", "r")):
                commit(spark, root, side, step, rows, seed + 2 * step + n)
        began, written, batches = _jobs(spark), _commits(root), []

        def batch_written(table: str, batch: int | None, batches: list[int] = batches) -> None:
            if table == "metrics":  # a micro-batch's last write
                batches.append(_commits(root))

        with hooks.after_write(batch_written):
            runner.run(1800)
        ours.append(_latency(runner.progress()))
        ran = _jobs(spark)
        made = [b - a for a, b in zip([written, *batches], batches, strict=False)]
        commits.append([max(made, default=0), _commits(root) - (batches[-1] if batches else written)])
        query = native_query(spark, root)
        query.awaitTermination()
        theirs.append(_latency([json.loads(p.json) for p in query.recentProgress]))
        jobs.append([ran - began, _jobs(spark) - ran])
    last = steps + 60  # an hour later: every row before it is settled in both; its own may not be
    for n, side in enumerate(("l", "r")):
        commit(spark, root, side, last, rows, seed + n)
    runner.run(1800)
    native_query(spark, root).awaitTermination()
    pairs = {
        name: spark.read.format("delta")
        .load(str(root / name))
        .where(F.col("lid") < last * rows)
        .select("lid", "rid")
        for name in ("streamjoin_out", "native_out")
    }
    a, b = pairs["streamjoin_out"], pairs["native_out"]
    same = a.exceptAll(b).isEmpty() and b.exceptAll(a).isEmpty()
    return {
        "streamjoin": ours,
        "native": theirs,
        "jobs": jobs,  # per step: [streamjoin's run, Spark's query]
        "commits": commits,  # per step: [most Delta commits of one micro-batch, those after its batches]
        "same_pairs": same,
        "pairs": a.count(),
    }


def summarize(rounds: list[dict]) -> dict:
    """Per-step ratios (first step of each round left out): median, min, max."""
    ratios = [o / n for r in rounds for o, n in zip(r["streamjoin"][1:], r["native"][1:], strict=True) if n]
    return {
        "ratio_median": round(statistics.median(ratios), 2),
        "ratio_min": round(min(ratios), 2),
        "ratio_max": round(max(ratios), 2),
        "streamjoin_median_s": round(statistics.median(t for r in rounds for t in r["streamjoin"][1:]), 2),
        "native_median_s": round(statistics.median(t for r in rounds for t in r["native"][1:]), 2),
        "same_pairs": all(r["same_pairs"] for r in rounds),
        "jobs_median": [statistics.median(j[side] for r in rounds for j in r["jobs"][1:]) for side in (0, 1)],
        "commits_per_batch_max": max(c[0] for r in rounds for c in r["commits"][1:]),
        "commits_after_batches_max": max(c[1] for r in rounds for c in r["commits"][1:]),
    }


def write_report(path: Path, saved: dict) -> None:
    lines = [
        f"Run finished {saved['run']['finished']} ({saved['run']['minutes']} min) on {saved['run']['machine']}; "
        f"{saved['run']['rounds']} rounds of {saved['run']['steps']} steps (the first step of each left out).",
        "",
        "| rows per commit | streamjoin s per step | Spark native s per step | streamjoin / native (median, min-max) "
        "| Spark jobs per step, streamjoin / native | Delta commits per micro-batch (max), per run after it | same pairs |",
        "|---|---|---|---|---|---|---|",
    ]
    for rows, s in saved["summary"].items():
        ratio = s["ratio_median"]
        mark = f"**{ratio}** (missed)" if ratio > 1.5 else f"{ratio}"
        lines.append(
            f"| {int(rows):,} | {s['streamjoin_median_s']} | {s['native_median_s']} | {mark} "
            f"({s['ratio_min']}-{s['ratio_max']}) | {s['jobs_median'][0]:g} / {s['jobs_median'][1]:g} "
            f"| {s['commits_per_batch_max']:g}, {s['commits_after_batches_max']:g} | {'yes' if s['same_pairs'] else 'NO'} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.native", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", default="100,10000", help="rows per commit of each table (default 100,10000)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (default 3)")
    parser.add_argument(
        "--steps", type=int, default=6, help="steps per round, the first a warm-up (default 6)"
    )
    parser.add_argument("--work", default="build/bench_native", help="scratch folder for the Delta tables")
    parser.add_argument("--out", default=str(BENCH / "results"), help="where native.json and native.md go")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step of a round is a warm-up")
    spark = get_spark(app_name="streamjoin-bench-native")
    began = time.perf_counter()
    measured: dict[str, list[dict]] = {}
    for rows in (int(r) for r in args.rows.split(",")):
        measured[str(rows)] = []
        for k in range(args.rounds):
            result = measure_round(spark, Path(args.work).resolve() / f"{rows}_{k}", rows, args.steps, seed=k)
            measured[str(rows)].append(result)
            print(
                f"{rows} rows per commit, round {k + 1}: streamjoin {result['streamjoin']} native {result['native']}"
            )
    saved = {
        "run": {
            "finished": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "minutes": round((time.perf_counter() - began) / 60),
            "machine": machine(),
            "rounds": args.rounds,
            "steps": args.steps,
        },
        "summary": {rows: summarize(rounds) for rows, rounds in measured.items()},
        "rounds": measured,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "native.json").write_text(json.dumps(saved, indent=1))
    write_report(out / "native.md", saved)
    print((out / "native.md").read_text())
    return 0 if all(s["same_pairs"] for s in saved["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
