"""Run the benchmark and write its report: `python -m bench.run` (see bench/README.md).

For every scale it writes the Nexmark-like workload, checks that each query's replay in
`complete` mode writes exactly the rows of the hand-written PySpark query (and of DuckDB), then
times, in rounds, the streamjoin replay (`exact`), the hand-written query, the scan-and-write
floor and DuckDB over the same snapshots. Ratios are taken within a round and their median is
reported; absolute times are there to read the ratios by, not to compare machines. The live
runner catches up the same history from its first commit, one commit per source per micro-batch
as it would have run live, while a thread samples the driver's heap and, after every micro-batch,
the heap kept after a full GC and the state's size on disk are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import functions as F

from bench import fixed_cost, handwritten, nexmark
from bench.chart import scaling_svg
from bench.report import write_report
from streamjoin import delta_io
from streamjoin.jobfile import load_job
from streamjoin.runners.hooks import after_write
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.session import get_spark

BENCH = Path(__file__).resolve().parent
JOBS = {name: BENCH / "jobs" / f"{name}.yaml" for name in handwritten.QUERIES}
STATEFUL = ("q8", "q20")  # the queries that hold state between micro-batches (window and interval joins)


@dataclass
class QueryResult:
    """One query at one scale: rows, per-round times (seconds) and what was checked."""

    query: str
    scale: float
    rows_in: int
    rows_out: int
    same_as_handwritten: bool
    same_as_duckdb: bool | None
    times: dict[str, list[float]] = field(default_factory=dict)
    phases: list[dict[str, float]] = field(default_factory=list)  # the exact replay's, per round
    live: dict | None = None

    def median(self, what: str) -> float:
        return statistics.median(self.times[what])

    def ratios(self, what: str, to: str) -> list[float]:
        """The ratio of `what` to `to` in each round (both measured in that round)."""
        return [a / b for a, b in zip(self.times[what], self.times[to], strict=False)]

    def ratio(self, what: str, to: str) -> float:
        """Median over rounds of the ratio of `what` to `to` measured in the same round."""
        return statistics.median(self.ratios(what, to))


def _timed(run, *args, **kwargs) -> tuple[float, object]:
    """Seconds that `run(*args, **kwargs)` took, and its value."""
    began = time.perf_counter()
    value = run(*args, **kwargs)
    return time.perf_counter() - began, value


class HeapSampler:
    """Samples the driver JVM's used heap every `every` seconds in a thread; `peak` in MiB."""

    def __init__(self, spark, every: float = 0.25) -> None:
        self.runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
        self.every, self.peak, self._stop = every, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            used = (self.runtime.totalMemory() - self.runtime.freeMemory()) / 2**20
            self.peak = max(self.peak, used)
            self._stop.wait(self.every)

    def __enter__(self) -> HeapSampler:
        self.runtime.gc()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class BatchProbe:
    """Called after each live write: at the end of a micro-batch (its state written) forces a full
    GC and records the heap the driver keeps (MiB) and the size of the batch's state on disk (KiB)."""

    def __init__(self, spark, checkpoint: Path) -> None:
        self.runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
        self.state = checkpoint / "streamjoin" / "state"
        self.heap_after_gc: list[float] = []
        self.state_kib: list[float] = []

    def __call__(self, table: str, batch: int) -> None:
        if table != "state":
            return
        self.runtime.gc()
        self.heap_after_gc.append(round((self.runtime.totalMemory() - self.runtime.freeMemory()) / 2**20))
        files = (self.state / str(batch)).rglob("*.parquet")
        self.state_kib.append(round(sum(f.stat().st_size for f in files) / 1024))


def _same_rows(spark, a: str, b_frame, before) -> bool:
    """The Delta table at `a` and the frame hold the same rows with event times before `before`
    (rows of the end-of-stream commit excluded: a stream's last rows are never all decided)."""
    left = delta_io.read_snapshot(spark, a)
    right = b_frame.select(*left.columns)
    left, right = (frame.where(F.col("event_time") < F.lit(before)) for frame in (left, right))
    return left.exceptAll(right).isEmpty() and right.exceptAll(left).isEmpty()


def bench_scale(
    spark, scale: float, root: Path, rounds: int, queries: list[str], live: list[str], duckdb: bool
) -> list[QueryResult]:
    """Write the workload at `scale`, check and time every query; returns one result per query."""
    workload = nexmark.Workload().at(scale)
    data = root / "nexmark"
    print(f"[scale {scale}] writing {workload.rows()} over {workload.hours} h of events", flush=True)
    seconds, commits = _timed(lambda: nexmark.write(spark, str(data), workload))
    print(f"[scale {scale}] {commits} commits in {seconds:.0f} s", flush=True)
    versions = {table: delta_io.latest_version(spark, str(data / table)) for table in commits}
    start = nexmark.START - timedelta(days=1)
    end = nexmark.START + timedelta(hours=workload.hours, days=1)
    cut = nexmark.end_of_events(workload) + timedelta(hours=12)
    results = []
    for query in queries:
        job = load_job(JOBS[query], root=root)
        inputs = handwritten.INPUTS[query]
        out = root / "out"
        pinned = {t: versions[t] for t in inputs}
        complete = replace(job, output=replace(job.output, path=str(out / f"{query}_complete")))
        replay(spark, complete, start, end, RunOptions(mode="complete", versions=pinned))
        expected = handwritten.spark_query(
            query, lambda t: delta_io.read_snapshot(spark, str(data / t), versions[t])
        )
        same = _same_rows(spark, str(out / f"{query}_complete"), expected, cut)
        same_duck = None
        if duckdb:
            handwritten.run_duckdb(
                query, str(data), versions, str(out / f"{query}_duckdb.parquet"), threads=os.cpu_count() or 1
            )
            duck = spark.read.parquet(str(out / f"{query}_duckdb.parquet"))
            same_duck = _same_rows(spark, str(out / f"{query}_complete"), duck, cut)
        result = QueryResult(query, scale, sum(workload.rows()[t] for t in inputs), 0, same, same_duck)
        print(
            f"[scale {scale}] {query}: complete replay equals hand-written PySpark: {same}, DuckDB: {same_duck}",
            flush=True,
        )
        # Counted once, outside the timed runs: the floor writes as many rows as the query does.
        sizes = {t: delta_io.read_snapshot(spark, str(data / t), versions[t]).count() for t in inputs}
        rows = expected.count()
        for round_ in range(rounds):
            seconds, metrics = _timed(
                replay, spark, job, start, end, RunOptions(mode="exact", versions=pinned)
            )
            result.times.setdefault("replay", []).append(seconds)
            result.phases.append(metrics.phases)
            result.rows_out = metrics.rows_out
            seconds, _ = _timed(
                handwritten.run_spark, spark, query, str(data), versions, str(out / f"{query}_spark")
            )
            result.times.setdefault("handwritten", []).append(seconds)
            seconds, _ = _timed(
                handwritten.run_floor,
                spark,
                query,
                str(data),
                versions,
                sizes,
                rows,
                str(out / f"{query}_floor"),
            )
            result.times.setdefault("floor", []).append(seconds)
            if duckdb:
                seconds, _ = _timed(
                    handwritten.run_duckdb,
                    query,
                    str(data),
                    versions,
                    str(out / f"{query}_duckdb.parquet"),
                    threads=os.cpu_count() or 1,
                )
                result.times.setdefault("duckdb", []).append(seconds)
            print(
                f"[scale {scale}] {query} round {round_ + 1}: "
                + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in result.times.items())
                + " (replay: "
                + ", ".join(f"{phase} {s:.1f} s" for phase, s in metrics.phases.items())
                + ")",
                flush=True,
            )
        if query in live:
            checkpoint = out / f"{query}_live_checkpoint"
            shutil.rmtree(checkpoint, ignore_errors=True)
            live_job = replace(job, output=replace(job.output, path=str(out / f"{query}_live")))
            shutil.rmtree(out / f"{query}_live", ignore_errors=True)
            probe = BatchProbe(spark, checkpoint)
            runner = LiveRunner(spark, live_job, str(checkpoint), max_files_per_trigger=1)
            with HeapSampler(spark) as heap, after_write(probe):
                seconds, batches = _timed(runner.run)
            state = [sum(c.open + c.unsettled for c in b.sources.values()) for b in batches]
            result.live = {
                "seconds": seconds,
                "batches": len(batches),
                "peak_state_rows": max(state, default=0),
                "peak_heap_mib": round(heap.peak),
                "rows_out": sum(b.rows_out for b in batches),
                "peak_heap_after_gc_mib": max(probe.heap_after_gc, default=0),
                "peak_state_kib": max(probe.state_kib, default=0),
                "state_rows_by_batch": state,
                "heap_after_gc_by_batch": probe.heap_after_gc,
            }
            replayed = delta_io.read_snapshot(spark, job.output.location)
            result.live["same_as_replay"] = _same_rows(spark, str(out / f"{query}_live"), replayed, end)
            print(
                f"[scale {scale}] {query} live catch-up: {result.live['seconds']:.0f} s in {len(batches)} micro-batches, "
                f"peak state {result.live['peak_state_rows']} rows ({result.live['peak_state_kib']} KiB), "
                f"heap after GC at most {result.live['peak_heap_after_gc_mib']} MiB (peak {result.live['peak_heap_mib']}), "
                f"equals the replay: {result.live['same_as_replay']}",
                flush=True,
            )
        results.append(result)
    return results


def machine() -> str:
    """One line describing this machine."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def _write(out: Path, results: list[QueryResult], run: dict) -> None:
    (out / "scaling.svg").write_text(scaling_svg(results))
    write_report(out / "report.md", results, run)
    print(f"report: {out / 'report.md'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scales",
        default="1,4,16,84",
        help="workload sizes, multiples of the 1x workload (4 hours of events; up to 16x more hours, beyond it higher rates; default 1,4,16,84: 84x holds 5 million bids)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed rounds per query and scale; medians are reported"
    )
    parser.add_argument("--queries", default=",".join(handwritten.QUERIES))
    parser.add_argument(
        "--live-scales", default="1,4", help="scales at which the live runner catches up (slow)"
    )
    parser.add_argument(
        "--live-queries",
        help=f"queries whose live catch-up is measured at every live scale (default: every query at "
        f"the smallest, {','.join(STATEFUL)} at the others)",
    )
    parser.add_argument("--no-duckdb", action="store_true", help="skip DuckDB (the bench extra)")
    parser.add_argument(
        "--no-fixed-cost",
        action="store_true",
        help="skip the fixed cost of a slice of a thousand rows (bench/fixed_cost.py)",
    )
    parser.add_argument("--work", default="build/bench", help="scratch folder for the Delta tables")
    parser.add_argument(
        "--out", default=str(BENCH / "results"), help="where report.md, scaling.svg and results.json go"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite report.md and scaling.svg from <out>/results.json"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report_only:
        saved = json.loads((out / "results.json").read_text())
        _write(out, [QueryResult(**r) for r in saved["results"]], saved["run"])
        return 0

    spark = get_spark(app_name="streamjoin-bench")
    scales = [float(s) for s in args.scales.split(",")]
    live_scales = {float(s) for s in args.live_scales.split(",") if s}
    queries = args.queries.split(",")
    results: list[QueryResult] = []
    began = time.perf_counter()
    for scale in scales:
        root = Path(args.work).resolve() / f"scale_{scale:g}"
        if scale not in live_scales:
            live = []
        elif args.live_queries:
            live = args.live_queries.split(",")
        elif scale == min(live_scales):
            live = queries
        else:
            live = list(STATEFUL)
        results += bench_scale(spark, scale, root, args.rounds, queries, live, not args.no_duckdb)
    fixed = None
    if not args.no_fixed_cost:
        fixed = fixed_cost.measure(spark, Path(args.work).resolve(), args.rounds, queries, "q20")
    out.mkdir(parents=True, exist_ok=True)
    run = {
        "fixed_cost": fixed,
        "finished": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "minutes": round((time.perf_counter() - began) / 60),
        "machine": machine(),
        "cores": os.cpu_count(),
    }
    (out / "results.json").write_text(
        json.dumps({"run": run, "results": [asdict(r) for r in results]}, indent=1)
    )
    _write(out, results, run)
    agree = all(
        r.same_as_handwritten and r.same_as_duckdb is not False and (not r.live or r.live["same_as_replay"])
        for r in results
    )
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
