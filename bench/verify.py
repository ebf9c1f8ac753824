"""What `streamjoin verify` costs next to the replay it runs (`python -m bench.verify`).

Writes the Nexmark-like workload at `--scale` (bench/nexmark.py), runs `--query` live
(available-now) over it, then, in `--rounds` rounds and over the versions the live run read,
times with the real library:

1. the daily case: one day replayed into a scratch output, and `verify` of the same day;
2. the whole history: every day replayed as one run (`replay_slices`), and `verify` of them all.

Both replays write beside the live job and share its arrival index, as verify's own replay does,
so the ratio verify / replay (taken within a round, medians reported) is the comparison's cost.
Every verify must find every slice equal: at this size that is also the live = replay check.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench import nexmark
from bench.run import BENCH, JOBS, _timed, machine
from streamjoin import delta_io
from streamjoin.backfill import cut
from streamjoin.jobfile import load_job
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay_slices
from streamjoin.session import get_spark
from streamjoin.verify import verify


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=16, help="workload size, as bench.run's (default 16)")
    parser.add_argument("--query", default="q20", help="a job of bench/jobs/ (default q20)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--work", default="build/bench_verify", help="scratch folder for the Delta tables")
    parser.add_argument("--out", default=str(BENCH / "results"), help="where verify.md and verify.json go")
    args = parser.parse_args(argv)
    spark = get_spark(app_name="streamjoin-bench-verify")
    root = Path(args.work).resolve() / f"scale_{args.scale:g}"
    shutil.rmtree(root, ignore_errors=True)
    workload = nexmark.Workload().at(args.scale)
    nexmark.write(spark, str(root / "nexmark"), workload)
    job = load_job(JOBS[args.query], root=root)
    live_seconds, batches = _timed(LiveRunner(spark, job, str(root / "checkpoint")).run)
    versions = batches[-1].versions
    rows_in = sum(workload.rows()[s.name] for s in job.sources)
    whole = cut(nexmark.START - timedelta(days=1), nexmark.end_of_events(workload) + timedelta(days=1), "1d")
    day = whole[1:2]  # the first day of events
    scratch = replace(job.output, path=str(root / "replayed"))
    times: dict[str, list[float]] = {}
    rows_out = 0
    for round_ in range(args.rounds):
        for name, pieces in (("day", day), ("whole", whole)):
            options = RunOptions(versions=versions, into=scratch)
            seconds, runs = _timed(replay_slices, spark, job, pieces, options)
            times.setdefault(f"replay_{name}", []).append(seconds)
            seconds, outcome = _timed(verify, spark, job, pieces[0].start, pieces[-1].end)
            times.setdefault(f"verify_{name}", []).append(seconds)
            if not outcome.equal:
                print(outcome.describe(), file=sys.stderr)
                return 1
            if name == "whole":
                rows_out = sum(r.rows_out for r in runs)
            print(
                f"round {round_ + 1}, {name}: replay {times[f'replay_{name}'][-1]:.1f} s, "
                f"verify {times[f'verify_{name}'][-1]:.1f} s, {len(pieces)} slice(s) equal",
                flush=True,
            )
    ratios = {
        name: statistics.median(
            v / r for v, r in zip(times[f"verify_{name}"], times[f"replay_{name}"], strict=True)
        )
        for name in ("day", "whole")
    }
    result = {
        "finished": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "machine": machine(),
        "query": args.query,
        "scale": args.scale,
        "rows_in": rows_in,
        "rows_out": rows_out,
        "live_seconds": round(live_seconds, 1),
        "live_batches": len(batches),
        "slices_whole": len(whole),
        "times": times,
        "ratios": ratios,
        "output_rows": delta_io.read_snapshot(spark, job.output.location).count(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"Run finished {result['finished']} on {result['machine']}; {args.query} at {args.scale:g}x: "
        f"{rows_in:,} rows in, {result['output_rows']:,} rows out, live (available-now) {live_seconds:.0f} s "
        f"in {len(batches)} micro-batch(es); {args.rounds} rounds, medians.",
        "",
        "| verified | slices | replay s | verify s | verify / replay |",
        "|---|---|---|---|---|",
    ]
    for name, label, count in (("day", "one day", len(day)), ("whole", "the whole history", len(whole))):
        lines.append(
            f"| {label} | {count} | {statistics.median(times[f'replay_{name}']):.1f} | "
            f"{statistics.median(times[f'verify_{name}']):.1f} | **{ratios[name]:.2f}** |"
        )
    (out / "verify.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
