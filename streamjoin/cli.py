"""`streamjoin`: a thin shell over the library (demo, stream, index, replay, backfill, handoff, verify, report, explain, validate-job, list, setup-jars, setup-docs-assets)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamjoin import __version__
from streamjoin.errors import JobError, SetupError, StreamJoinError
from streamjoin.timeutil import format_duration, parse_instant

if TYPE_CHECKING:
    from streamjoin.backfill import Backfill
    from streamjoin.heartbeat import Heartbeat
    from streamjoin.index import StartAt
    from streamjoin.job import Job


def _print_json(value: object) -> None:
    """What `--json` prints: one JSON document on stdout."""
    print(json.dumps(value, indent=2, default=str))


def _root(args) -> str:
    return args.root or os.environ.get("STREAMJOIN_ROOT", "data")


def _job(args) -> Job:
    return _announcing(_load(args.job, args))


def _load(path: str | Path, args) -> Job:
    """A job file loaded (its structure checked); no Spark is started."""
    from streamjoin.job import Job

    return Job.load(path, root=_root(args), master=args.master)


def _announcing(job: Job) -> Job:
    """The job, saying on stderr when it starts Spark (a JVM: the seconds a command waits for first)."""
    job.on_spark_start = lambda: print(
        f"job {job.name}: starting Spark (a JVM, once per command) ...", file=sys.stderr, flush=True
    )
    return job


def _seconds(text: str) -> float:
    """A positive number of seconds (`--timeout`)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds; give e.g. 60")
    return seconds


def _versions(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    pinned = {}
    for item in text.split(","):
        name, _, version = item.partition("=")
        if not version.strip().isdigit():
            raise StreamJoinError(
                f"--versions takes source=version pairs, e.g. orders=12,payments=9; got {item!r}"
            )
        pinned[name.strip()] = int(version)
    return pinned


def _start_at(text: str | None) -> dict[str, StartAt] | None:
    """--from: `orders=120,rates=2024-05-01` (per source), or one version or time for every source."""
    if not text:
        return None
    if "=" not in text:
        return {"*": text.strip()}
    starts: dict[str, StartAt] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if not name.strip() or not value.strip():
            raise StreamJoinError(
                f"--from takes a version or time, or source=version pairs, e.g. orders=120,rates=7; got {item!r}"
            )
        starts[name.strip()] = value.strip()
    return starts


def _starts_for(spec, text: str | None) -> dict[str, StartAt] | None:
    starts = _start_at(text)
    if starts and "*" in starts:
        return {s.name: starts["*"] for s in spec.sources}
    unknown = sorted(set(starts or {}) - {s.name for s in spec.sources})
    if unknown:
        raise StreamJoinError(
            f"--from names {', '.join(unknown)}, which job {spec.name} does not have; sources: "
            f"{', '.join(s.name for s in spec.sources)}"
        )
    return starts


def cmd_index(args) -> int:
    from streamjoin import reach

    job = _job(args)
    positions, served = job.index(start_at=_starts_for(job.spec, args.from_))
    print(positions)
    print(reach.describe(served))
    return 0


def cmd_validate(args) -> int:
    job = _job(args)
    if not args.json:
        print(
            f"job {job.name}: structure ok ({len(job.spec.sources)} sources, {len(job.spec.joins)} join(s))"
        )
    validation = job.validate(structure_only=args.structure_only)
    if args.json:
        _print_json(validation.as_json())
    else:
        print(validation.text())
    return 0


def cmd_explain(args) -> int:
    if args.structure_only:
        return _explain_structure(args)
    explanation = _job(args).explain(_versions(args.versions), args.start, args.end, args.mode)
    if args.json:
        _print_json(explanation.as_json())
    else:
        print(explanation.text())
    return 0


def _explain_structure(args) -> int:
    """`explain --structure-only`: what the file alone says, with no Spark started."""
    given = [
        option
        for option, value in (("--versions", args.versions), ("--start", args.start), ("--end", args.end))
        if value
    ]
    if given:
        raise JobError(
            f"explain --structure-only reads no table, so it takes no {', '.join(given)}; drop "
            f"{'them' if len(given) > 1 else 'it'}, or --structure-only"
        )
    structure = _job(args).explain_structure()
    if args.json:
        _print_json(structure.as_json())
    else:
        print(structure.text())
    return 0


def cmd_replay(args) -> int:
    from streamjoin.metrics import untimed_elsewhere

    job = _job(args)
    start, end = parse_instant(args.start, "--start"), parse_instant(args.end, "--end")
    metrics = job.replay(start, end, mode=args.mode, versions=_versions(args.versions), closed=args.closed)
    elsewhere = untimed_elsewhere(job.spark, job.spec, start, end, metrics.versions)
    output = job.spec.output
    if args.json:
        _print_json({"output": output.location, "metrics": metrics.as_json(), "warnings": elsewhere})
    else:
        print(metrics.summary())
        for line in elsewhere:
            print(f"warning: {line}")
        print(
            f"output: {output.location} (late rows: {output.side('late')}, rejected: {output.side('rejected')})"
        )
    _fail_unbalanced([metrics])
    return 0


def _fail_unbalanced(runs) -> None:
    """Raise the error of the first run whose accounting does not add up (exit 1)."""
    failure = next((error for error in (run.unbalanced() for run in runs) if error), None)
    if failure is not None:
        raise failure


def cmd_backfill(args) -> int:
    from streamjoin.backfill import BATCH
    from streamjoin.progress import BackfillProgress

    job = _job(args)
    backfill = job.plan_backfill(
        parse_instant(args.start, "--start"),
        parse_instant(args.end, "--end"),
        every=args.every,
        timezone=args.timezone,
        mode=args.mode,
        versions=_versions(args.versions),
        assume_earliest_known=args.assume_earliest_known,
    )
    if args.backfill_id:
        backfill = replace(backfill, id=args.backfill_id)
    slices = list(backfill.slices)
    if args.only_failed:
        slices, recorded = job.unfinished(backfill)
        if recorded and not args.versions:  # re-run with what the failed attempt read
            backfill = replace(backfill, versions=recorded)
    if args.dry_run:
        return _dry_run(args, backfill, slices)
    if not slices and not args.json:
        print(f"job {job.name}: every slice of this backfill succeeded already; nothing to run")
        return 0
    with BackfillProgress(backfill, len(slices)) as progress:  # on stderr: --json keeps stdout clean
        outcomes = job.run(
            backfill,
            slices,
            validate=not args.no_validate,
            on_slice=progress.advance,
            site=args.site,
            on_stage=progress.stage,
            batch=BATCH if args.batch is None else args.batch,
        )
    return _backfilled(args, job, backfill, slices, outcomes)


def _dry_run(args, backfill: Backfill, slices: list) -> int:
    """What `backfill --dry-run` prints: the plan, and with --only-failed what would run."""
    if args.json:
        _print_json({**_backfill_json(backfill), "would_run": [_slice_json(s) for s in slices]})
        return 0
    print(backfill.describe())
    if args.only_failed:
        print(f"--only-failed: {len(slices)} of {len(backfill.slices)} slice(s) would run")
    return 0


def _backfill_exit(outcomes: list) -> int:
    """0 when every slice succeeded; EXIT_INVALID when the others are invalid; 1 when one failed."""
    from streamjoin.backfill import INVALID
    from streamjoin.errors import EXIT_INVALID

    statuses = {o.status for o in outcomes if not o.ok}
    return 0 if not statuses else EXIT_INVALID if statuses == {INVALID} else 1


def _backfilled(args, job: Job, backfill: Backfill, slices: list, outcomes: list) -> int:
    """What a backfill prints once run: each slice's outcome, what failed and why; its exit code
    (`_backfill_exit`)."""
    from streamjoin.metrics import untimed_elsewhere
    from streamjoin.progress import outcome_table, problems

    failed = [o for o in outcomes if not o.ok]
    pinned = next((o.metrics.versions for o in outcomes if o.metrics), None)
    elsewhere = (
        untimed_elsewhere(job.spark, job.spec, slices[0].start, slices[-1].end, pinned) if pinned else []
    )
    if args.json:
        _print_json(
            {
                **_backfill_json(backfill),
                "slices": [_outcome_json(o) for o in outcomes],
                "warnings": elsewhere,
            }
        )
        return _backfill_exit(outcomes)
    _console().print(outcome_table(backfill, outcomes))
    for line in problems(backfill, outcomes):  # below the table, whole: what failed and why
        print(line)
    for line in elsewhere:
        print(f"warning: {line}")
    output = job.spec.output
    print(
        f"{len(outcomes) - len(failed)} of {len(outcomes)} slice(s) succeeded; output {output.location}, "
        f"attempts recorded in {output.side('backfill')}"
    )
    for line in _advice(job, outcomes):
        print(line, file=sys.stderr)
    return _backfill_exit(outcomes)


def _advice(job: Job, outcomes: list) -> list[str]:
    """What would change the slices that did not succeed: a slice that failed (an error) may pass on
    a re-run with the same versions (--only-failed); one its data made invalid fails again on the
    same rows, so the advice is what changes those rows, and validate-job's warnings."""
    from streamjoin.backfill import FAILED, INVALID
    from streamjoin.links import Graced
    from streamjoin.plan import grace_warnings

    lines = []
    if any(o.status == FAILED for o in outcomes):
        lines.append("re-run the failed slices with the same versions: add --only-failed")
    invalid = [o for o in outcomes if o.status == INVALID]
    if not invalid:
        return lines
    late = sum(o.metrics.total("late") for o in invalid if o.metrics)
    lines.append(
        f"{len(invalid)} slice(s) invalid: their rows fail the job's expectations, and a re-run over the same "
        "versions writes the same rows (--only-failed would not change them): change the data, the job or "
        "its expectations (quality in the job file, docs/validation.md)"
    )
    if late:
        graces = ", ".join(
            f"join {step}'s grace is {format_duration(link.grace)}"
            for step, link in enumerate(job.spec.joins, 1)
            if isinstance(link, Graced)
        )
        lines.append(
            f"{late} row(s) of those slices arrived late, left out of the join ({job.spec.output.side('late')}): "
            f"a longer grace keeps them ({graces}), or a later job start (rows committed by the start are "
            "history, never late: streamjoin reset, then start_at or --from)"
        )
        lines += [f"warning: {warning}" for warning in grace_warnings(job.spark, job.plan())]
    return lines


def _slice_json(piece) -> dict:
    return {"start": piece.start.isoformat(), "end": piece.end.isoformat()}


def _backfill_json(backfill) -> dict:
    """A backfill's plan as `--json` prints it."""
    return {
        "job": backfill.job.name,
        "backfill": backfill.id,
        "start": backfill.start.isoformat(),
        "end": backfill.end.isoformat(),
        "every": backfill.every,
        "timezone": backfill.timezone,
        "mode": backfill.mode,
        "versions": backfill.versions,
        "output": backfill.job.output.location,
        "record": backfill.job.output.side("backfill"),
    }


def _outcome_json(outcome) -> dict:
    """One slice's outcome: status, the replay's metrics, the validation, the error."""
    validation = outcome.validation
    return {
        **_slice_json(outcome.slice),
        "status": outcome.status,
        "duration_s": outcome.duration_s,
        "error": outcome.error,
        "metrics": outcome.metrics.as_json() if outcome.metrics else None,
        "validation": None
        if validation is None
        else {
            "success": validation.success,
            "evaluated": validation.evaluated,
            "failed": list(validation.failed),
            "docs": validation.docs,
        },
    }


def cmd_reset(args) -> int:
    job = _job(args)
    if not args.yes:
        print(
            f"would delete job {job.name}'s output {job.spec.output.location}, its side tables and its index "
            f"(and {args.checkpoint}, given as --checkpoint); nothing deleted: add --yes",
            file=sys.stderr,
        )
        return 2
    deleted = job.reset(checkpoint=args.checkpoint)
    print(f"deleted {len(deleted)}: " + ", ".join(deleted) if deleted else "nothing to delete")
    return 0


def cmd_handoff(args) -> int:
    from streamjoin.metrics import combine

    job = _job(args)
    at = parse_instant(args.at, "--at")
    checkpoint = args.checkpoint or job.checkpoint
    seeded = job.handoff(
        at,
        checkpoint,
        versions=_versions(args.versions),
        on_stage=lambda text: print(f"job {job.name}: {text} ...", flush=True),
    )
    print(
        f"job {job.name}: rows from {at.isoformat()} on decided by versions {seeded.versions} written "
        f"({seeded.rows_out} rows); live continues from the next versions, checkpoint {checkpoint}",
        flush=True,
    )
    runner = job.live(checkpoint, trigger=args.trigger, on_batch=_print_batch)
    _heartbeat(job, args).attach(runner)
    runs = runner.run(timeout=args.timeout)
    print(f"{len(runs)} micro-batch(es)" + (": " + combine(runs).summary() if runs else "; nothing new yet"))
    _fail_unbalanced(runs)
    return 0


def cmd_verify(args) -> int:
    job = _job(args)
    start, end = parse_instant(args.start, "--start"), parse_instant(args.end, "--end")
    outcome = job.verify(start, end, every=args.every, checkpoint=args.checkpoint)
    if args.json:
        _print_json(outcome.as_json())
    else:
        print(outcome.describe(job.spec.meta.schedule.timezone))
        print(f"recorded in {job.spec.output.side('consistency')}")
    return 0 if outcome.equal else 1


def cmd_report(args) -> int:
    job = _job(args)
    print(f"job {job.name}: data-quality page {job.report(args.folder)}")
    return 0


def _console():
    """stdout for rich tables: the terminal's width, or 100 columns when piped to a file or a log."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=100)


def cmd_stream(args) -> int:
    from streamjoin.metrics import combine

    job = _job(args)
    checkpoint = args.checkpoint or job.checkpoint
    runner = job.live(
        checkpoint, trigger=args.trigger, start_at=_starts_for(job.spec, args.from_), on_batch=_print_batch
    )
    _heartbeat(job, args).attach(runner)
    print(
        f"job {job.name}: live, trigger {args.trigger}, checkpoint {checkpoint} (Ctrl-C stops it)",
        flush=True,
    )
    with _interruptible() as interrupted:
        runs = runner.run(timeout=args.timeout, stop_requested=interrupted)
    print(f"{len(runs)} micro-batch(es): " + combine(runs).summary() if runs else "nothing new to process")
    print(f"output: {job.spec.output.location}; per-batch metrics in {job.spec.output.side('metrics')}")
    if interrupted():
        print(
            f"stopped between micro-batches; resume with: streamjoin stream {args.job} --checkpoint {checkpoint}"
            + (f" --trigger {args.trigger}" if args.trigger != "available-now" else "")
        )
    _fail_unbalanced(runs)
    return 0


def _heartbeat(job: Job, args) -> Heartbeat:
    """The line a live run prints every --heartbeat seconds while no micro-batch comes."""
    from streamjoin.heartbeat import EVERY, Heartbeat

    return Heartbeat(job.spark, job.spec, lambda line: print(line, flush=True), args.heartbeat or EVERY)


def _print_batch(metrics) -> None:
    """One line per live micro-batch, as it is recorded."""
    held = metrics.held()
    print(
        f"batch {metrics.batch}: in {metrics.total('rows_in')}, out {metrics.rows_out}, late {metrics.total('late')}, "
        f"rejected {metrics.total('rejected')}, held {held} ({metrics.duration_s:.1f} s)",
        flush=True,
    )


@contextlib.contextmanager
def _interruptible():
    """While inside: the first Ctrl-C asks for a stop between micro-batches (the yielded callable
    says whether it came); a second one interrupts at once."""
    requested = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum, frame) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()
        print(
            "stopping after the current micro-batch (Ctrl-C again to interrupt it)",
            file=sys.stderr,
            flush=True,
        )

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield requested.is_set
    finally:
        signal.signal(signal.SIGINT, previous)


def cmd_list(args) -> int:
    """The job files of a folder, each with its output and its last recorded run (read from the
    metrics tables' files: Spark starts only for tables their log cannot list)."""
    from streamjoin.jobfile import job_files

    folder = Path(args.jobs)
    files = job_files(folder)
    if not files:
        raise StreamJoinError(
            f"no job files (*.yaml, *.sql) in {str(folder)!r}; point --jobs at the folder that holds them"
        )
    listed: list[dict[str, Any]] = []
    for file in files:
        try:
            job = _announcing(_load(file, args))
        except JobError as exc:
            listed.append({"file": str(file), "error": str(exc)})
            continue
        listed.append(
            {
                "file": str(file),
                "job": job.name,
                "output": job.spec.output.location,
                "last_run": job.last_run(),
            }
        )
    if args.json:
        _print_json(listed)
        return 0
    for entry in listed:
        if "error" in entry:
            print(f"{entry['file']}: invalid: {entry['error']}")
            continue
        run = entry["last_run"]
        ran = (
            f"last run {run['runner']}/{run['mode']} at {run['started_at']}, {run['rows_out']} rows out"
            if run
            else "never run"
        )
        print(f"{entry['job']} ({entry['file']}): output {entry['output']}; {ran}")
    return 0


def cmd_setup_docs_assets(args) -> int:
    from streamjoin import datadocs

    where = Path(args.dir).resolve() if args.dir else datadocs.folder()
    if datadocs.fetched(where):
        print(f"Data Docs' styles and scripts are in {where} already")
    else:
        datadocs.fetch(where)
        print(f"{len(datadocs.ASSETS)} file(s) and Font Awesome's fonts in {where}")
    if where != datadocs.folder().resolve():
        print(f"Data Docs builds look in {datadocs.folder()}: export STREAMJOIN_DOCS_ASSETS={where}")
    return 0


def cmd_setup_jars(args) -> int:

    from streamjoin import jars

    where = Path(args.dir).resolve() if args.dir else jars.folder()
    if jars.fetched(where) and not args.force:
        print(
            f"Delta's jars and the object storage connector are in {where} already (--force fetches them again)"
        )
    else:
        kept = jars.fetch(where, offline=args.offline, force=args.force)
        print(f"{len(kept)} jar(s) in {where}: {', '.join(p.name for p in kept)}")
    if args.class_archive and (args.force or not jars.archive_current(where)):
        try:
            print(f"driver class archive: {jars.build_class_archive(where)}")
        except SetupError as error:  # an archive only saves start-up time: say why, go on without
            print(f"warning: {error}", file=sys.stderr)
    if where != jars.folder().resolve():
        print(f"the session looks in {jars.folder()}: export STREAMJOIN_JARS={where}")
    return 0


def cmd_demo(args) -> int:
    from streamjoin.demo import run_demo

    print("demo: starting Spark (a JVM, once per command) ...", file=sys.stderr, flush=True)
    run_demo(os.path.join(_root(args), "demo"), master=args.master)
    return 0


_FROM_HELP = (
    "where a new job begins: a version or an ISO time for every source, or source=version pairs "
    "(default: the job's start_at, else version 0); an existing index keeps its start"
)


def _global_options(parser: argparse.ArgumentParser, after_command: bool = False) -> None:
    """--master, --root and --log-level, accepted before the command and after it (`after_command`: a value
    given there wins; absent, it leaves the one given before)."""
    default = argparse.SUPPRESS if after_command else None
    parser.add_argument(
        "--master",
        default=default,
        help="Spark master (default $STREAMJOIN_MASTER or local[*]); spark://host:7077 for a cluster",
    )
    parser.add_argument(
        "--root",
        default=default,
        help="folder that relative Delta paths in job files resolve against (default $STREAMJOIN_ROOT or ./data)",
    )
    parser.add_argument(
        "--log-level",
        default=default,
        choices=("ERROR", "WARN", "INFO", "DEBUG"),
        help="what Spark logs on stderr (default $STREAMJOIN_LOG_LEVEL or ERROR)",
    )


class _Commands:
    """Subcommands that all take the global options and a description."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.group = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(self, name: str, help: str) -> argparse.ArgumentParser:
        command = self.group.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        _global_options(command, after_command=True)
        return command


_HEARTBEAT_HELP = (
    "while no micro-batch comes (no new data), print every this many seconds since when the run waits "
    "and each source's newest commit (default 60, heartbeat.EVERY)"
)
_JOB_HELP = "path of a job file, YAML or SQL, e.g. jobs/orders_payments.yaml"
_JSON_HELP = "print one JSON document on stdout instead of text (progress, if any, stays on stderr)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamjoin", description=__doc__)
    parser.add_argument("--version", action="version", version=f"streamjoin {__version__}")
    _global_options(parser)
    commands = _Commands(parser)

    demo = commands.add(
        "demo", "generate demo Delta tables, run the demo jobs live and as replays, print a summary"
    )
    demo.set_defaults(func=cmd_demo)

    validate = commands.add(
        "validate-job",
        "check a job file, its sources' columns and types, its expressions, and that the runners take it",
    )
    validate.add_argument("job", help=_JOB_HELP)
    validate.add_argument("--json", action="store_true", help=_JSON_HELP)
    validate.add_argument(
        "--structure-only",
        action="store_true",
        help="check the file alone (sources that do not exist yet are not an error)",
    )
    validate.set_defaults(func=cmd_validate)

    explain = commands.add(
        "explain",
        "print the resolved plan: sources and pinned versions, join chain, bounds, state, margins, output",
    )
    explain.add_argument("job", help=_JOB_HELP)
    explain.add_argument("--json", action="store_true", help=_JSON_HELP)
    explain.add_argument(
        "--versions", help="pin source versions, e.g. orders=12,payments=9 (default: latest)"
    )
    explain.add_argument(
        "--start", help="with --end: also the plan of a replay of [start, end), moving no data"
    )
    explain.add_argument("--end", help="the end of that replay's range (exclusive)")
    explain.add_argument("--mode", choices=["exact", "complete"], default="exact", help="that replay's mode")
    explain.add_argument(
        "--structure-only",
        action="store_true",
        help="the file alone: sources, links and output as written, no Spark started and no table read",
    )
    explain.set_defaults(func=cmd_explain)

    replay = commands.add(
        "replay", "replay [start, end) over pinned Delta versions, replacing that slice of the output"
    )
    replay.add_argument("job", help=_JOB_HELP)
    replay.add_argument("--json", action="store_true", help=_JSON_HELP)
    replay.add_argument(
        "--start", required=True, help="ISO date or datetime, e.g. 2024-05-01 or 2024-05-01T06:00+02:00"
    )
    replay.add_argument("--end", required=True, help="exclusive end, same formats as --start")
    replay.add_argument(
        "--mode",
        choices=("exact", "complete"),
        default="exact",
        help="exact: late rows excluded as live excluded them; complete: every row on time",
    )
    replay.add_argument("--versions", help="pin source versions, e.g. orders=12,payments=9 (default: latest)")
    replay.add_argument(
        "--closed",
        action="store_true",
        help="the input ends at the pinned versions: close every window and write its last padded rows "
        "(live never writes them until more data comes)",
    )
    replay.set_defaults(func=cmd_replay)

    backfill = commands.add(
        "backfill", "replay [start, end) slice by slice over versions pinned once, validate each slice"
    )
    backfill.add_argument("job", help=_JOB_HELP)
    backfill.add_argument(
        "--json",
        action="store_true",
        help=_JSON_HELP + "; exit code 1 if a slice failed, 3 if one is invalid",
    )
    backfill.add_argument("--start", required=True, help="ISO date or datetime (no zone: UTC)")
    backfill.add_argument("--end", required=True, help="exclusive end, same formats as --start")
    backfill.add_argument(
        "--every", help="slice length: 1h, 6h, 1d, 7d... (default: the job's schedule.every)"
    )
    backfill.add_argument(
        "--timezone", help="IANA zone slices are aligned in (default: the job's schedule.timezone)"
    )
    backfill.add_argument(
        "--mode",
        choices=("exact", "complete"),
        default="exact",
        help="exact: late rows excluded as live excluded them; complete: every row on time",
    )
    backfill.add_argument(
        "--versions", help="pin source versions, e.g. orders=12,payments=9 (default: latest)"
    )
    backfill.add_argument(
        "--only-failed",
        action="store_true",
        help="run only the slices whose last attempt failed or never ran, with the versions it pinned",
    )
    backfill.add_argument(
        "--dry-run",
        action="store_true",
        help="print slices, pinned versions, margins and what each source can serve; run nothing",
    )
    backfill.add_argument(
        "--assume-earliest-known",
        action="store_true",
        help="run a range that starts before what a table can serve: rows looked up before it are looked up "
        "in its earliest known state, counted as assumed, and fail validation unless the job allows them",
    )
    backfill.add_argument(
        "--no-validate", action="store_true", help="skip the Great Expectations validation of each slice"
    )
    backfill.add_argument("--site", help="folder for Data Docs (default <output>_quality/data_docs)")
    backfill.add_argument(
        "--backfill-id",
        help="the id its attempts are recorded under (default: a new UUID; Airflow's tasks "
        "give airflow:<dag_id>:<run_id>)",
    )
    backfill.add_argument(
        "--batch",
        type=int,
        help="consecutive slices replayed together, each still decided, validated and recorded alone "
        "(default 24, streamjoin.backfill.BATCH; 1: one replay per slice)",
    )
    backfill.set_defaults(func=cmd_backfill)

    handoff = commands.add(
        "handoff", "start live where a backfill ending at --at stopped: no gap, no overlap"
    )
    handoff.add_argument("job", help=_JOB_HELP)
    handoff.add_argument("--at", required=True, help="the end of the backfill (ISO date or datetime)")
    handoff.add_argument("--checkpoint", help="a new checkpoint folder (default <output>_checkpoint)")
    handoff.add_argument("--versions", help="the versions the backfill read (default: from its record)")
    handoff.add_argument("--trigger", default="available-now", help="available-now or processing-time:30s")
    handoff.add_argument(
        "--timeout", type=_seconds, help="stop after this many seconds (processing-time triggers)"
    )
    handoff.add_argument("--heartbeat", type=_seconds, help=_HEARTBEAT_HELP)
    handoff.set_defaults(func=cmd_handoff)

    resetting = commands.add(
        "reset",
        "delete a job's output, side tables and arrival index (everything computed from its start), "
        "to start it again from another start",
    )
    resetting.add_argument("job", help=_JOB_HELP)
    resetting.add_argument("--yes", action="store_true", help="do delete (without it: say what would go)")
    resetting.add_argument("--checkpoint", help="a live checkpoint folder of the job to delete too")
    resetting.set_defaults(func=cmd_reset)

    verifying = commands.add(
        "verify",
        "replay [start, end) over the versions the live run had read and compare it with the live output, "
        "slice by slice; exit 1 when a slice differs",
    )
    verifying.add_argument("job", help=_JOB_HELP)
    verifying.add_argument(
        "--json", action="store_true", help=_JSON_HELP + "; exit code 1 if a slice differs"
    )
    verifying.add_argument("--start", required=True, help="ISO date or datetime (no zone: UTC)")
    verifying.add_argument("--end", required=True, help="exclusive end, same formats as --start")
    verifying.add_argument("--every", help="slice length: 1h, 6h, 1d... (default: the job's schedule.every)")
    verifying.add_argument(
        "--checkpoint", help="the live run's checkpoint folder (default <output>_checkpoint)"
    )
    verifying.set_defaults(func=cmd_verify)

    report = commands.add(
        "report", "build the job's data-quality page from its run metrics and backfill record"
    )
    report.add_argument("job", help=_JOB_HELP)
    report.add_argument("--folder", help="where index.html goes (default <output>_quality/report)")
    report.set_defaults(func=cmd_report)

    stream = commands.add("stream", "run the job live with Structured Streaming")
    stream.add_argument("job", help=_JOB_HELP)
    stream.add_argument(
        "--trigger",
        default="available-now",
        help="available-now (process what is there, stop) or processing-time:30s",
    )
    stream.add_argument("--checkpoint", help="checkpoint folder (default <output>_checkpoint)")
    stream.add_argument(
        "--timeout", type=_seconds, help="stop after this many seconds (processing-time triggers)"
    )
    stream.add_argument("--from", dest="from_", help=_FROM_HELP)
    stream.add_argument("--heartbeat", type=_seconds, help=_HEARTBEAT_HELP)
    stream.set_defaults(func=cmd_stream)

    index = commands.add(
        "index", "bring the job's arrival index up to the sources' latest versions (run it daily)"
    )
    index.add_argument("job", help=_JOB_HELP)
    index.add_argument("--from", dest="from_", help=_FROM_HELP)
    index.set_defaults(func=cmd_index)

    setup_jars = commands.add(
        "setup-jars",
        "fetch Delta's jars and the object storage connector (s3a) once with Maven and make the driver class archive (what an installed package needs before its first run)",
    )
    setup_jars.add_argument(
        "--dir",
        help="where to put them (default $STREAMJOIN_JARS, else .jars/ in a source checkout, "
        "else ~/.cache/streamjoin/jars)",
    )
    setup_jars.add_argument(
        "--offline", action="store_true", help="resolve from Maven's local repository only"
    )
    setup_jars.add_argument("--force", action="store_true", help="fetch again even if the folder holds them")
    setup_jars.add_argument(
        "--no-class-archive",
        dest="class_archive",
        action="store_false",
        help="skip the driver class archive (making it takes a minute, once; it halves each later driver's start)",
    )
    setup_jars.set_defaults(func=cmd_setup_jars)

    docs_assets = commands.add(
        "setup-docs-assets",
        "fetch once, from npm, the styles and scripts Great Expectations' Data Docs load from CDNs, so they work offline",
    )
    docs_assets.add_argument(
        "--dir",
        help="where to put them (default $STREAMJOIN_DOCS_ASSETS, else .docs-assets/ in a source checkout, "
        "else ~/.cache/streamjoin/docs-assets)",
    )
    docs_assets.set_defaults(func=cmd_setup_docs_assets)

    listing = commands.add("list", "list the job files of a folder with their outputs and last runs")
    listing.add_argument("--jobs", default="jobs", help="folder of job files (default ./jobs)")
    listing.add_argument("--json", action="store_true", help=_JSON_HELP)
    listing.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.log_level:
        os.environ["STREAMJOIN_LOG_LEVEL"] = args.log_level  # read by the session factory
    try:
        return args.func(args)
    except StreamJoinError as exc:
        return _refused(exc)
    except Exception as exc:  # a storage fault is the user's to fix: one paragraph, not a trace
        from streamjoin.delta_io import storage_fault

        fault = storage_fault(exc, _job_tables(args))
        if fault is None:
            raise
        return _refused(fault)


def _refused(error: StreamJoinError) -> int:
    """Print the error as one line on stderr; its exit code (2: refused, 1: a run that failed)."""
    print(f"streamjoin: error: {error}", file=sys.stderr)
    return error.exit_code


def _job_tables(args) -> list[str]:
    """The tables the command's job reads and writes (sources, output), to name the one a storage
    fault hit; none when the command has no job, or its file cannot be read."""
    from streamjoin.jobfile import load_job

    try:
        spec = load_job(args.job, root=_root(args)) if getattr(args, "job", None) else None
    except Exception:  # the fault being reported matters more than this one
        return []
    return [] if spec is None else [*(s.location for s in spec.sources), spec.output.location]


if __name__ == "__main__":
    sys.exit(main())
