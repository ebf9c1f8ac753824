"""A replay's fixed cost: `python -m bench.fixed_cost`.

Each bench query replays a slice of about a thousand input rows of the 1x workload (an exact
replay into an output that already holds the slice's rows and index, as a re-run finds it), and
its hand-written twin (`bench/handwritten.py`) runs on the same slice: each stream source read
from the same pinned snapshot in the replay's margins, the join, the slice's rows written to
Delta. Spark jobs are counted per phase of the replay with Spark's status tracker (each phase's
jobs carry a job tag); times are taken in the same round, ratios per round, medians over rounds.

`--causes` also lists every Spark job of one replay with the streamjoin functions it ran under
(innermost first) and Spark's description of it: where each job comes from.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench import handwritten, nexmark
from streamjoin import delta_io
from streamjoin.arrival import Slice
from streamjoin.jobfile import load_job
from streamjoin.runners import replay as replay_module
from streamjoin.runners.options import RunOptions
from streamjoin.session import get_spark
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import from_micros

BENCH = Path(__file__).resolve().parent
SLICE_ROWS = 1_000  # input rows of the stream sources a slice holds, about
TARGET_RATIO, TARGET_JOBS = 2.0, 12
# The replay's phases, each the runner functions whose Spark jobs it holds.
PHASES = {
    "plan": ("plan_replay",),
    "prepare": ("_prepare",),
    "read": ("_read_streams", "_read_tables"),
    "join": ("_step",),
    "write": ("_write",),
    "account": ("_account",),
}
# The modules whose functions `--causes` names a job by.
TRACED = [
    "accounting",
    "arrival",
    "changelog",
    "definition",
    "delta_io",
    "delta_log",
    "drift",
    "index",
    "journal",
    "kernel",
    "metrics",
    "plan",
    "runners.replay",
    "validation",
]


def slice_of(query: str, workload: nexmark.Workload) -> Slice:
    """The slice of `query` holding about SLICE_ROWS rows of its stream sources, in the middle of
    the workload's history (rows before and after it)."""
    job = load_job(BENCH / "jobs" / f"{query}.yaml", root="/")
    rate = sum(workload.rows()[s.name] / workload.hours for s in job.sources if s.kind == "stream")
    start = nexmark.START + timedelta(hours=workload.hours / 2)
    return Slice.of(start, start + timedelta(hours=SLICE_ROWS / rate))


def _tagged(spark: SparkSession, tag: str) -> list[int]:
    return list(spark.sparkContext._jsc.sc().statusTracker().getJobIdsForTag(tag))


def _wrapped(spark: SparkSession, tag: str, function: Callable) -> Callable:
    """`function`, its Spark jobs tagged `tag` while it runs."""

    @functools.wraps(function)
    def tagged(*args, **kwargs):
        spark.sparkContext.addJobTag(tag)
        try:
            return function(*args, **kwargs)
        finally:
            spark.sparkContext.removeJobTag(tag)

    return tagged


@contextmanager
def phases_tagged(spark: SparkSession, run: str) -> Iterator[dict[str, str]]:
    """While inside, the replay runner's phase functions tag their jobs `<run>:<phase>`; yields
    phase -> tag."""
    saved = {name: getattr(replay_module, name) for names in PHASES.values() for name in names}
    tags = {phase: f"fixed_cost:{run}:{phase}" for phase in PHASES}
    try:
        for phase, names in PHASES.items():
            for name in names:
                setattr(replay_module, name, _wrapped(spark, tags[phase], saved[name]))
        yield tags
    finally:
        for name, function in saved.items():
            setattr(replay_module, name, function)


def handwritten_slice(spark: SparkSession, query: str, job: JoinSpec, plan, out: str) -> None:
    """The hand-written query on the slice: stream sources read in the replay's margins from the
    pinned snapshots, the join, the output's rows in the slice written over `out`."""
    ranges = plan.ranges()
    times = {s.name: s.time for s in job.sources}

    def read(table: str) -> DataFrame:
        frame = delta_io.read_snapshot(spark, job.source(table).location, plan.versions[table])
        if table not in ranges:
            return frame
        low, high = (from_micros(m) for m in ranges[table])
        return frame.where((F.col(times[table]) >= F.lit(low)) & (F.col(times[table]) < F.lit(high)))

    span = plan.span
    rows = handwritten.spark_query(query, read).where(
        (F.col("event_time") >= F.lit(span.start)) & (F.col("event_time") < F.lit(span.end))
    )
    rows.write.format("delta").mode("overwrite").save(out)


def measure_query(spark: SparkSession, root: Path, query: str, piece: Slice, rounds: int) -> dict:
    """One query's slice: a warm-up run of each side, then `rounds` timed rounds."""
    job = load_job(BENCH / "jobs" / f"{query}.yaml", root=root)
    plan = replay_module.plan_replay(spark, job, [piece], RunOptions(mode="exact"))
    options = RunOptions(mode="exact", versions=plan.versions)
    out = str(root / "out" / f"{query}_fixed_cost_handwritten")
    result: dict = {"query": query, "slice": [piece.start.isoformat(), piece.end.isoformat()]}
    result |= {"replay_s": [], "handwritten_s": [], "replay_jobs": [], "handwritten_jobs": []}
    for round_ in range(rounds + 1):  # round 0 warms up (and writes the index), untimed
        with phases_tagged(spark, f"{query}{round_}") as tags:
            began = time.perf_counter()
            metrics = replay_module.replay(spark, job, piece.start, piece.end, options)
            replay_s = time.perf_counter() - began
        jobs = {phase: len(_tagged(spark, tag)) for phase, tag in tags.items()}
        tag = f"fixed_cost:{query}{round_}:handwritten"
        spark.sparkContext.addJobTag(tag)
        try:
            began = time.perf_counter()
            handwritten_slice(spark, query, job, plan, out)
            handwritten_s = time.perf_counter() - began
        finally:
            spark.sparkContext.removeJobTag(tag)
        if round_:
            result["replay_s"].append(replay_s)
            result["handwritten_s"].append(handwritten_s)
            result["replay_jobs"].append(jobs)
            result["handwritten_jobs"].append(len(_tagged(spark, tag)))
        result["rows_in"] = sum(c.rows_in for c in metrics.sources.values())
        result["rows_out"] = metrics.rows_out
        print(
            f"[fixed cost] {query} round {round_}: replay {replay_s:.2f} s in {sum(jobs.values())} jobs "
            f"{jobs}, hand-written {handwritten_s:.2f} s in {len(_tagged(spark, tag))} jobs",
            flush=True,
        )
    return result


def causes(spark: SparkSession, root: Path, query: str, piece: Slice) -> list[dict]:
    """Every Spark job of one warm replay of `query`'s slice: the streamjoin functions it ran under
    (innermost first) and Spark's description."""
    job = load_job(BENCH / "jobs" / f"{query}.yaml", root=root)
    saved = _trace(spark)
    first = max([-1, *spark.sparkContext.statusTracker().getJobIdsForGroup(None)]) + 1
    try:
        replay_module.replay(spark, job, piece.start, piece.end, RunOptions(mode="exact"))
    finally:
        for (module, owner, name), function in saved.items():
            setattr(owner or importlib.import_module(module), name, function)
    return _described(spark, first)


def _traced(spark: SparkSession, name: str, function: Callable, depth: list[int]) -> Callable:
    """`function`, its Spark jobs tagged `fn<depth>:<name>` while it runs (`depth`: calls under way)."""

    @functools.wraps(function)
    def tagged(*args, **kwargs):
        tag = f"fn{depth[0]:03d}:{name}"
        depth[0] += 1
        spark.sparkContext.addJobTag(tag)
        try:
            return function(*args, **kwargs)
        finally:
            spark.sparkContext.removeJobTag(tag)
            depth[0] -= 1

    return tagged


def _trace(spark: SparkSession) -> dict:
    """Tag every Spark job with the streamjoin functions (of TRACED) it runs under; returns what
    to restore."""
    saved, depth = {}, [0]
    for name in TRACED:
        module = importlib.import_module(f"streamjoin.{name}")
        for attr, value in list(vars(module).items()):
            if inspect.isfunction(value) and value.__module__ == module.__name__:
                saved[(module.__name__, None, attr)] = value
                setattr(module, attr, _traced(spark, f"{name}.{attr}", value, depth))
            elif inspect.isclass(value) and value.__module__ == module.__name__:
                for method, function in list(vars(value).items()):
                    if inspect.isfunction(function) and not method.startswith("__"):
                        saved[(module.__name__, value, method)] = function
                        traced = _traced(spark, f"{name}.{attr}.{method}", function, depth)
                        setattr(value, method, traced)
    return saved


def _described(spark: SparkSession, first: int) -> list[dict]:
    """The jobs from id `first` on, from Spark's status store: functions (innermost first) and
    description."""
    store = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    jobs = []
    for i in range(store.size()):
        data = store.apply(i)
        if data.jobId() < first:
            continue
        tags = [data.jobTags().apply(k) for k in range(data.jobTags().size())]
        functions = [t.split(":", 1)[1] for t in sorted(t for t in tags if t.startswith("fn"))]
        text = data.description().get() if data.description().isDefined() else data.name()
        jobs.append({"job": data.jobId(), "functions": functions, "spark": text})
    return sorted(jobs, key=lambda j: j["job"])


def summarize(result: dict) -> dict:
    """Medians (min-max) of a query's rounds."""
    ratios = [r / h for r, h in zip(result["replay_s"], result["handwritten_s"], strict=True)]
    totals = [sum(j.values()) for j in result["replay_jobs"]]
    return {
        "ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "replay_s": statistics.median(result["replay_s"]),
        "handwritten_s": statistics.median(result["handwritten_s"]),
        "jobs": statistics.median(totals),
        "handwritten_jobs": statistics.median(result["handwritten_jobs"]),
        "phases": {p: statistics.median(j[p] for j in result["replay_jobs"]) for p in PHASES},
    }


def report_lines(saved: dict) -> list[str]:
    """The report's section on the fixed cost, from `measure`'s result."""
    lines = [
        "## Fixed cost: a slice of a thousand rows",
        "",
        f"An exact replay of a slice of about {SLICE_ROWS:,} input rows of the {saved.get('scale', 1):g}x workload (warm, over an "
        "output already holding it) against the hand-written query on the same slice. Targets: at most "
        f"{TARGET_RATIO:g}x the hand-written query, at most {TARGET_JOBS} Spark jobs. "
        f"{saved['rounds']} rounds; medians (min-max).",
        "",
        "| query | rows in | rows out | replay s | hand-written s | replay / hand-written | (min-max) | replay jobs | hand-written jobs | jobs per phase |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in saved["queries"]:
        s = summarize(result)
        ratio = f"{s['ratio']:.2f}" if s["ratio"] <= TARGET_RATIO else f"**{s['ratio']:.2f}** (missed)"
        jobs = f"{s['jobs']:g}" if s["jobs"] <= TARGET_JOBS else f"**{s['jobs']:g}** (missed)"
        phases = ", ".join(f"{p} {n:g}" for p, n in s["phases"].items() if n)
        lines.append(
            f"| {result['query']} | {result['rows_in']:,} | {result['rows_out']:,} | {s['replay_s']:.2f} | "
            f"{s['handwritten_s']:.2f} | {ratio} | {s['ratio_range'][0]:.2f}-{s['ratio_range'][1]:.2f} | "
            f"{jobs} | {s['handwritten_jobs']:g} | {phases} |"
        )
    if saved.get("causes"):
        lines += ["", f"Where the Spark jobs of one replay of {saved['causes']['query']} come from:", ""]
        lines += causes_table(saved["causes"]["jobs"])
    return lines + [""]


def causes_table(jobs: list[dict]) -> list[str]:
    """Jobs grouped by the streamjoin function they ran under (the innermost two) and Spark's
    description, with their count."""
    counted = Counter((" < ".join(j["functions"][-1:-3:-1]) or "-", _short(j["spark"])) for j in jobs)
    lines = ["| jobs | streamjoin function (< its caller) | Spark's description |", "|---|---|---|"]
    return lines + [f"| {n} | {where} | {what} |" for (where, what), n in counted.items()]


def _short(description: str) -> str:
    """Spark's job description without run-specific numbers."""
    for prefix in ("Delta: Compute snapshot", "Delta: Rewriting", "broadcast exchange"):
        if description.startswith(prefix):
            return prefix
    return description.split(" at ")[0] if " at " in description else description


def measure(
    spark: SparkSession,
    work: Path,
    rounds: int,
    queries: list[str],
    query_causes: str | None,
    scale: float = 1,
) -> dict:
    """Write the workload at `scale` under `work`, measure each query's slice; the result as saved."""
    root, workload = work / "fixed_cost", nexmark.Workload().at(scale)
    nexmark.write(spark, str(root / "nexmark"), workload)
    saved: dict = {"rounds": rounds, "scale": scale, "queries": []}
    for query in queries:
        saved["queries"].append(measure_query(spark, root, query, slice_of(query, workload), rounds))
    if query_causes:
        jobs = causes(spark, root, query_causes, slice_of(query_causes, workload))
        saved["causes"] = {"query": query_causes, "jobs": jobs}
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fixed_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", default=",".join(handwritten.QUERIES))
    parser.add_argument(
        "--causes", default="q20", help="the query whose replay's jobs are listed ('' for none)"
    )
    parser.add_argument("--scale", type=float, default=1.0, help="the workload's size (bench/nexmark.py)")
    parser.add_argument("--work", default="build/bench")
    parser.add_argument("--out", default=str(BENCH / "results"))
    args = parser.parse_args(argv)
    spark = get_spark(app_name="streamjoin-bench-fixed-cost")
    queries, work = args.queries.split(","), Path(args.work).resolve()
    saved = measure(spark, work, args.rounds, queries, args.causes or None, args.scale)
    saved["finished"] = f"{datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    out = Path(args.out)
    (out / "fixed_cost.json").write_text(json.dumps(saved, indent=1))
    (out / "fixed_cost.md").write_text("\n".join(["# streamjoin: fixed cost", "", *report_lines(saved)[2:]]))
    print("\n".join(report_lines(saved)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
