"""`streamjoin`: a thin shell over the library (demo, stream, replay, explain, validate-job)."""

from __future__ import annotations

import argparse
import os
import sys
from streamjoin.errors import StreamJoinError
from streamjoin.timeutil import parse_instant


def _root(args) -> str:
    return args.root or os.environ.get("STREAMJOIN_ROOT", "data")


def _job(args):
    from streamjoin.spec import load_job

    return load_job(args.job, root=_root(args))


def _versions(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    pinned = {}
    for item in text.split(","):
        name, _, version = item.partition("=")
        if not version.strip().isdigit():
            raise StreamJoinError(f"--versions takes source=version pairs, e.g. orders=12,payments=9; got {item!r}")
        pinned[name.strip()] = int(version)
    return pinned


def cmd_validate(args) -> int:
    from streamjoin import delta_io
    from streamjoin.plan import bind
    from streamjoin.session import get_spark

    spec = _job(args)
    print(f"job {spec.name}: structure ok ({len(spec.sources)} sources, {len(spec.joins)} join(s))")
    spark = get_spark(master=args.master)
    missing = [s.name for s in spec.sources if not delta_io.exists(spark, s.location)]
    if missing:
        print(f"job {spec.name}: sources {', '.join(missing)} do not exist yet; columns and types not checked")
        return 0
    plan = bind(spark, spec)
    print(f"job {spec.name}: columns, types and expressions ok; output columns {', '.join(plan.output_columns)}")
    return 0


def cmd_explain(args) -> int:
    from streamjoin.plan import bind, describe
    from streamjoin.runners.replay import pin_versions
    from streamjoin.session import get_spark

    spark = get_spark(master=args.master)
    plan = bind(spark, _job(args))
    print(describe(plan, pin_versions(spark, plan, _versions(args.versions))))
    return 0


def cmd_replay(args) -> int:
    from streamjoin.runners.replay import replay
    from streamjoin.session import get_spark

    spec = _job(args)
    start, end = parse_instant(args.start, "--start"), parse_instant(args.end, "--end")
    spark = get_spark(master=args.master)
    metrics = replay(spark, spec, start, end, mode=args.mode, versions=_versions(args.versions))
    print(metrics.summary())
    print(f"output: {spec.output.location} (late rows: {spec.output.side('late')}, rejected: {spec.output.side('rejected')})")
    return 0


def cmd_stream(args) -> int:
    from streamjoin.runners.live import LiveRunner
    from streamjoin.session import get_spark

    spec = _job(args)
    spark = get_spark(master=args.master)
    checkpoint = args.checkpoint or f"{spec.output.location}_checkpoint"
    runner = LiveRunner(spark, spec, checkpoint, trigger=args.trigger)
    print(f"job {spec.name}: live, trigger {args.trigger}, checkpoint {checkpoint}")
    runs = runner.run(timeout=args.timeout)
    if runs:
        from streamjoin.metrics import combine

        print(f"{len(runs)} micro-batch(es): " + combine(runs).summary())
    else:
        print("nothing new to process")
    print(f"output: {spec.output.location}; per-batch metrics in {spec.output.side('metrics')}")
    return 0


def cmd_demo(args) -> int:
    from streamjoin.demo import run_demo

    run_demo(os.path.join(_root(args), "demo"), master=args.master)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamjoin", description=__doc__)
    parser.add_argument("--master", help="Spark master (default $STREAMJOIN_MASTER or local[*]); spark://host:7077 for a cluster")
    parser.add_argument("--root", help="folder that relative Delta paths in job files resolve against (default $STREAMJOIN_ROOT or ./data)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="generate demo Delta tables, run the demo jobs live and as replays, print a summary")
    demo.set_defaults(func=cmd_demo)

    validate = commands.add_parser("validate-job", help="check a job file (and, when its sources exist, their columns and types)")
    validate.add_argument("job", help="path of a YAML job file, e.g. jobs/orders_payments.yaml")
    validate.set_defaults(func=cmd_validate)

    explain = commands.add_parser("explain", help="print the resolved plan: sources and pinned versions, join chain, bounds, state, output")
    explain.add_argument("job")
    explain.add_argument("--versions", help="pin source versions, e.g. orders=12,payments=9 (default: latest)")
    explain.set_defaults(func=cmd_explain)

    replay = commands.add_parser("replay", help="replay [start, end) over pinned Delta versions, replacing that slice of the output")
    replay.add_argument("job")
    replay.add_argument("--start", required=True, help="ISO date or datetime, e.g. 2024-05-01 or 2024-05-01T06:00+02:00")
    replay.add_argument("--end", required=True, help="exclusive end, same formats as --start")
    replay.add_argument("--mode", choices=("exact", "complete"), default="exact",
                        help="exact: late rows excluded as live excluded them; complete: every row on time")
    replay.add_argument("--versions", help="pin source versions, e.g. orders=12,payments=9 (default: latest)")
    replay.set_defaults(func=cmd_replay)

    stream = commands.add_parser("stream", help="run the job live with Structured Streaming")
    stream.add_argument("job")
    stream.add_argument("--trigger", default="available-now", help="available-now (process what is there, stop) or processing-time:30s")
    stream.add_argument("--checkpoint", help="checkpoint folder (default <output>_checkpoint)")
    stream.add_argument("--timeout", type=float, help="stop after this many seconds (processing-time triggers)")
    stream.set_defaults(func=cmd_stream)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StreamJoinError as exc:
        print(f"streamjoin: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
