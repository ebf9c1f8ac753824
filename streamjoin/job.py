"""The facade: one job, every way to run it.

    from streamjoin import Job

    job = Job.load("jobs/orders_payments.yaml")
    print(job.explain().text())
    metrics = job.replay("2024-05-01", "2024-05-02")
    outcomes = job.backfill("2024-05-01", "2024-05-08", every="1d")
    runs = job.live(checkpoint="/chk/orders").run(timeout=60)
    same = job.verify("2024-05-01", "2024-05-02").equal

The CLI and the Airflow DAGs go through this class only; it starts Spark when a call first needs it
(loading and checking a job's structure need none) and binds the job to its tables once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamjoin.errors import JobError
from streamjoin.jobfile import load_job
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import Instant, parse_instant

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamjoin.backfill import Backfill, Slice, SliceOutcome
    from streamjoin.index import StartAt
    from streamjoin.metrics import RunMetrics
    from streamjoin.plan import Plan
    from streamjoin.reach import Reach
    from streamjoin.runners.live import LiveRunner
    from streamjoin.runners.replay import ReplayPlan
    from streamjoin.verify import Verification


@dataclass(frozen=True)
class Explanation:
    """What `explain` says of a job: the bound plan over pinned versions, its warnings, what each
    source can serve, for a SQL job the YAML it compiles to, and given a range, the replay's plan."""

    plan: Plan
    versions: dict[str, int]
    margins: dict[str, Any]
    warnings: list[str]
    reach: list[Reach]
    compiled: dict | None = None
    replay: ReplayPlan | None = None

    def text(self) -> str:
        from streamjoin import plan as plans
        from streamjoin import reach

        parts = _compiled_text(self.compiled)
        parts += [plans.describe(self.plan, self.versions, self.margins), reach.describe(self.reach)]
        parts += [self.replay.describe()] if self.replay else []
        return "\n".join(parts + [f"warning: {warning}" for warning in self.warnings])

    def as_json(self) -> dict:
        from streamjoin import plan as plans
        from streamjoin import reach

        described = plans.as_json(self.plan, self.versions, self.margins)
        document = {**described, "warnings": self.warnings, "reach": reach.as_json(self.reach)}
        document |= {"replay": self.replay.as_json()} if self.replay else {}
        return document | ({"job": self.compiled} if self.compiled else {})


@dataclass(frozen=True)
class Structure:
    """What `explain --structure-only` says of a job from its file alone (no Spark, no table read):
    its sources, its links with their settings, its output, and for a SQL job the YAML it compiles to."""

    spec: JoinSpec
    compiled: dict | None = None

    def text(self) -> str:
        from streamjoin.plan import link_words

        spec = self.spec
        lines = _compiled_text(self.compiled)
        lines += [f"job {spec.name}" + (f": {spec.meta.description}" if spec.meta.description else "")]
        lines.append("sources:")
        for source in spec.sources:
            time = "" if not source.time else f", event time {source.time}"
            lines.append(f"  {source.name}: {source.kind} at {source.location}{time}")
        lines.append(f"join chain (applied in the order written), from {spec.start}:")
        lines += [
            f"  {step}. {link.type.upper()} JOIN {link.source}: {link_words(link)}"
            for step, link in enumerate(spec.joins, 1)
        ]
        lines += [f"select: {', '.join(spec.select)}"] if spec.select else []
        lines += [f"where: {spec.where}"] if spec.where else []
        out = spec.output
        lines.append(f"output: {out.location} (event time column {out.time})")
        lines.append(
            "not bound to the tables (--structure-only): columns, types, pinned versions and replay "
            "margins need the sources; run explain without --structure-only for them"
        )
        return "\n".join(lines)

    def as_json(self) -> dict:
        spec = self.spec
        document = {
            "job": spec.name,
            "checked": "structure",
            "sources": [
                {"name": s.name, "kind": s.kind, "location": s.location, "time": s.time} for s in spec.sources
            ],
            "joins": [{"step": step, **link.settings()} for step, link in enumerate(spec.joins, 1)],
            "select": list(spec.select),
            "where": spec.where,
            "output": {"location": spec.output.location, "time": spec.output.time},
        }
        return document | ({"compiled": self.compiled} if self.compiled else {})


def _compiled_text(compiled: dict | None) -> list[str]:
    """A SQL job's YAML as `explain` prints it above the plan (nothing for a YAML job)."""
    if not compiled:
        return []
    import yaml

    text = yaml.safe_dump(compiled, sort_keys=False, allow_unicode=True).rstrip()
    return ["the SQL job as YAML (the same job; either file runs):", text, ""]


@dataclass(frozen=True)
class Validation:
    """What `validate` found: the job's structure, and unless only that was checked, its sources'
    columns, types and expressions, what each source can serve, and warnings."""

    job: str
    checked: str  # "structure" or "sources"
    output_columns: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)
    reach: list[Reach] = field(default_factory=list)

    def text(self) -> str:
        from streamjoin import reach

        if self.checked == "structure":
            return (
                f"job {self.job}: columns and types not checked (--structure-only: the file alone, no Spark)"
            )
        lines = [
            f"job {self.job}: columns, types, expressions and change data feeds ok; the runners take it; "
            f"output columns {', '.join(self.output_columns)}",
            reach.describe(self.reach),
        ]
        return "\n".join(lines + [f"warning: {warning}" for warning in self.warnings])

    def as_json(self) -> dict:
        from streamjoin import reach

        document: dict[str, Any] = {
            "job": self.job,
            "ok": True,
            "checked": self.checked,
            "warnings": self.warnings,
        }
        if self.checked == "sources":
            document |= {"output_columns": list(self.output_columns), "reach": reach.as_json(self.reach)}
        return document


class Job:
    """A loaded job and the session it runs in."""

    def __init__(
        self,
        spec: JoinSpec,
        master: str | None = None,
        origin: str | None = None,
        app_name: str = "streamjoin",
    ) -> None:
        self.spec = spec
        self.master = master
        self.origin = origin  # the job file, when loaded from one
        self.app_name = app_name
        self.on_spark_start: Callable[[], None] | None = None  # told before the JVM starts (the CLI says so)
        self._plan: Plan | None = None

    @classmethod
    def load(
        cls, path: str | os.PathLike, root: str | os.PathLike | None = None, master: str | None = None
    ) -> Job:
        """Load a YAML or SQL job file; relative Delta paths resolve against `root` ($STREAMJOIN_ROOT,
        else ./data). Checks the file's structure only: no Spark is started."""
        return cls(load_job(path, root=root), master=master, origin=str(path))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def spark(self) -> SparkSession:
        """The Spark session (started on first use, after telling `on_spark_start`)."""
        from streamjoin.session import get_spark, running

        if self.on_spark_start is not None and not running():
            self.on_spark_start()
        return get_spark(master=self.master, app_name=self.app_name)

    def plan(self) -> Plan:
        """The job bound to its tables' columns (once)."""
        if self._plan is None:
            from streamjoin.plan import bind

            try:
                self._plan = bind(self.spark, self.spec)
            except JobError as error:
                raise self._in_file_terms(error) from None
        return self._plan

    def _in_file_terms(self, error: JobError) -> JobError:
        """A binding error of a job loaded from a SQL file, pointing at the line and column of the
        file and in its words (sql_places.py); any other as it is."""
        if not self.origin or Path(self.origin).suffix.lower() != ".sql":
            return error
        from streamjoin.sql_places import in_file_terms

        return in_file_terms(error, Path(self.origin).read_text(), self.origin)

    def missing_sources(self) -> list[str]:
        """The sources whose Delta table does not exist, as `location (source name)`."""
        from streamjoin import delta_io

        return [
            f"{s.location} (source {s.name})"
            for s in self.spec.sources
            if not delta_io.exists(self.spark, s.location)
        ]

    def validate(self, structure_only: bool = False) -> Validation:
        """Check the job against its tables: columns, types, expressions, change data feeds, that
        a runner takes it, no change to a column it uses over the versions a run would read
        (drift.py), what each source can serve; warnings on grace and time formats (which
        read a sample of rows). With `structure_only`, the file alone, checked when it was loaded:
        no Spark is started and no table read."""
        from streamjoin import delta_io, drift, index, kernel, reach
        from streamjoin.plan import grace_warnings, time_format_warnings

        if structure_only:
            return Validation(self.name, "structure")
        missing = self.missing_sources()
        if missing:
            raise JobError(
                f"job {self.name}: no Delta table at {', '.join(missing)}; create the table(s) or fix the "
                "path, or check the file alone with --structure-only"
            )
        plan = self.plan()
        kernel.runnable(self.spark, plan)
        # the versions a run would read: from the job's start (its index's, or the one it would take) to the newest
        newest = {s.name: delta_io.latest_version(self.spark, s.location) for s in self.spec.sources}
        drift.check(self.spark, plan, index.start_of(self.spark, plan)[1], newest)
        warnings = grace_warnings(self.spark, plan) + time_format_warnings(self.spark, plan)
        served = reach.reaches(self.spark, plan)
        return Validation(self.name, "sources", tuple(plan.output_columns), warnings, served)

    def explain(
        self,
        versions: dict[str, int] | None = None,
        start: Instant | None = None,
        end: Instant | None = None,
        mode: str = "exact",
    ) -> Explanation:
        """The plan over the versions a replay would pin now (or `versions`); given `start` and
        `end`, also the plan of a replay of [start, end) in `mode` (what it reads and writes).
        Moves no data."""
        from streamjoin import kernel, reach
        from streamjoin.plan import grace_warnings
        from streamjoin.runners.replay import pin_versions

        plan = self.plan()
        operator = kernel.runnable(self.spark, plan)
        margins = {source.name: operator.margins(source.name) for source in plan.streams}
        replay = self._replay_plan(start, end, mode, versions)
        return Explanation(
            plan,
            replay.versions if replay else pin_versions(self.spark, plan, versions),
            margins,
            grace_warnings(self.spark, plan),
            reach.reaches(self.spark, plan),
            self._compiled(),
            replay,
        )

    def explain_structure(self) -> Structure:
        """What the job file alone says (`explain --structure-only`): no Spark, no table read."""
        return Structure(self.spec, self._compiled())

    def _compiled(self) -> dict | None:
        """For a job loaded from a SQL file, the YAML document it compiles to."""
        from streamjoin.sql import spec_document_from_sql

        if not self.origin or Path(self.origin).suffix.lower() != ".sql":
            return None
        return spec_document_from_sql(Path(self.origin).read_text(), self.origin)

    def _replay_plan(
        self, start: Instant | None, end: Instant | None, mode: str, versions: dict[str, int] | None
    ) -> ReplayPlan | None:
        """The plan of a replay of [start, end) (None without a range; one end alone is refused)."""
        from streamjoin.arrival import Slice
        from streamjoin.runners.options import RunOptions
        from streamjoin.runners.replay import plan_replay

        if start is None and end is None:
            return None
        if start is None or end is None:
            raise JobError("explain takes a replay's range whole: give both --start and --end, or neither")
        piece = Slice(parse_instant(start, "--start"), parse_instant(end, "--end"))
        return plan_replay(self.spark, self.spec, [piece], RunOptions(mode=mode, versions=versions))

    def index(
        self, start_at: dict[str, StartAt] | None = None, upto: dict[str, int] | None = None
    ) -> tuple[str, list[Reach]]:
        """Extend the job's arrival index to its sources' newest versions (or `upto`; the scheduled
        index step); its description and what each source can serve."""
        from streamjoin import index, reach
        from streamjoin.runners.replay import one_driver

        with one_driver(self.spark, self.spec):
            positions = index.update(self.spark, self.plan(), upto, start_at=start_at)
        return index.describe(positions), reach.reaches(self.spark, self.plan())

    def replay(
        self,
        start: Instant,
        end: Instant,
        mode: str = "exact",
        versions: dict[str, int] | None = None,
        closed: bool = False,
    ) -> RunMetrics:
        """Replay [start, end) over pinned versions and replace that slice of the outputs."""
        from streamjoin.runners.options import RunOptions
        from streamjoin.runners.replay import replay

        options = RunOptions(mode=mode, versions=versions, closed=closed)
        return replay(
            self.spark, self.spec, parse_instant(start, "--start"), parse_instant(end, "--end"), options
        )

    def plan_backfill(
        self,
        start: Instant,
        end: Instant,
        every: str | None = None,
        timezone: str | None = None,
        mode: str = "exact",
        versions: dict[str, int] | None = None,
        assume_earliest_known: bool = False,
    ) -> Backfill:
        """Cut [start, end) into slices and pin versions once; nothing runs (a dry run's plan)."""
        from streamjoin.arrival import Slice
        from streamjoin.backfill import plan_backfill
        from streamjoin.runners.options import RunOptions

        return plan_backfill(
            self.spark,
            self.spec,
            Slice(parse_instant(start, "--start"), parse_instant(end, "--end")),
            every=every,
            timezone=timezone,
            options=RunOptions(mode=mode, versions=versions),
            assume_earliest_known=assume_earliest_known,
        )

    def backfill(
        self,
        start: Instant,
        end: Instant,
        every: str | None = None,
        validate: bool = True,
        on_slice: Callable[[SliceOutcome], None] | None = None,
    ) -> list[SliceOutcome]:
        """Plan and run a backfill of [start, end) cut `every` (default: the job's schedule), each
        slice validated; the outcome of each slice. For the options of `plan_backfill` and
        `run`, call them in turn."""
        return self.run(self.plan_backfill(start, end, every=every), validate=validate, on_slice=on_slice)

    def run(
        self,
        backfill: Backfill,
        slices: list[Slice] | None = None,
        validate: bool = True,
        on_slice: Callable[[SliceOutcome], None] | None = None,
        site: str | None = None,
        on_stage: Callable[[str], None] | None = None,
        batch: int | None = None,
    ) -> list[SliceOutcome]:
        """Run a planned backfill's slices (or the given subset), each validated (Data Docs in
        `site`) unless not `validate`, up to `batch` consecutive slices per replay (default
        `backfill.BATCH`); `on_slice` is told of each slice's outcome, `on_stage` of each stage."""
        from streamjoin.backfill import BATCH, run_backfill
        from streamjoin.runners.options import RunOptions

        options = RunOptions(validate=validate, site=site)
        return run_backfill(
            self.spark, backfill, slices, options, on_slice, BATCH if batch is None else batch, on_stage
        )

    def replay_slice(
        self,
        start: Instant,
        end: Instant,
        mode: str = "exact",
        versions: dict[str, int] | None = None,
        backfill_id: str | None = None,
    ) -> SliceOutcome:
        """Replay, validate and record one slice (a scheduler's task); never raises for the
        slice's own failure, which its outcome's status says."""
        from streamjoin.backfill import run_slice
        from streamjoin.runners.options import RunOptions

        start_at, end_at = parse_instant(start, "--start"), parse_instant(end, "--end")
        options = RunOptions(mode=mode, versions=versions)
        return run_slice(self.spark, self.spec, start_at, end_at, options, backfill_id)

    def unfinished(self, backfill: Backfill) -> tuple[list[Slice], dict[str, int] | None]:
        """The slices of a backfill not yet succeeded, and the versions its earlier attempt read."""
        from streamjoin.backfill import unfinished

        return unfinished(self.spark, backfill)

    def live(
        self,
        checkpoint: str | None = None,
        trigger: str = "available-now",
        start_at: dict[str, StartAt] | None = None,
        on_batch: Callable[[RunMetrics], None] | None = None,
    ) -> LiveRunner:
        """The live runner on `checkpoint` (default `<output>_checkpoint`); `.run()` starts it."""
        from streamjoin.runners.live import LiveRunner

        return LiveRunner(
            self.spark,
            self.spec,
            checkpoint or self.checkpoint,
            trigger=trigger,
            start_at=start_at,
            on_batch=on_batch,
        )

    @property
    def checkpoint(self) -> str:
        """The default live checkpoint."""
        return f"{self.spec.output.location}_checkpoint"

    def handoff(
        self,
        at: Instant,
        checkpoint: str | None = None,
        versions: dict[str, int] | None = None,
        on_stage: Callable[[str], None] | None = None,
    ) -> RunMetrics:
        """Seed a new live checkpoint to continue exactly where a backfill ending at `at` stopped."""
        from streamjoin.backfill import hand_off

        where = checkpoint or self.checkpoint
        return hand_off(
            self.spark, self.spec, parse_instant(at, "--at"), where, versions=versions, on_stage=on_stage
        )

    def verify(
        self, start: Instant, end: Instant, every: str | None = None, checkpoint: str | None = None
    ) -> Verification:
        """Compare the live output of [start, end) with the exact replay, slice by slice."""
        from streamjoin.verify import verify

        return verify(
            self.spark,
            self.spec,
            parse_instant(start, "--start"),
            parse_instant(end, "--end"),
            every,
            checkpoint,
        )

    def written_version(self) -> int | None:
        """The live output's newest version (None: not written yet): what `verify_written` starts after."""
        from streamjoin.verify import written_version

        return written_version(self.spark, self.spec)

    def verify_written(self, since_version: int | None, checkpoint: str | None = None) -> Verification | None:
        """Verify the slices live commits after `since_version` wrote into (None: every commit);
        None when they wrote none. What the live DAG runs after each live run."""
        from streamjoin.verify import verify_written

        return verify_written(self.spark, self.spec, since_version, checkpoint or self.checkpoint)

    def report(self, folder: str | None = None) -> Path:
        """Write the job's data-quality page; its path."""
        from streamjoin.report import build_report

        return build_report(self.spark, self.spec, folder)

    def last_run(self) -> dict[str, Any] | None:
        """The newest run recorded in the job's metrics table (runner, mode, start, rows out)."""
        from streamjoin import delta_io
        from streamjoin.timeutil import from_spark

        metrics = self.spec.output.side("metrics")
        read, newest_run = _newest_run_from_files(metrics)
        if read:
            return newest_run
        if not delta_io.exists(self.spark, metrics):
            return None
        newest = delta_io.read_snapshot(self.spark, metrics).orderBy("started_at", ascending=False).first()
        if newest is None:
            return None
        return {
            "runner": newest["runner"],
            "mode": newest["mode"],
            "started_at": from_spark(newest["started_at"]).isoformat(),
            "rows_out": newest["rows_out"],
        }

    def reset(self, checkpoint: str | None = None) -> list[str]:
        """Delete the output, side tables and index (and `checkpoint`, a live checkpoint folder),
        to begin again from another start; what was deleted."""
        import shutil

        from streamjoin.backfill import reset

        deleted = reset(self.spark, self.spec)
        if checkpoint and Path(checkpoint).is_dir():
            shutil.rmtree(checkpoint)
            deleted.append(checkpoint)
        return deleted


_RUN_COLUMNS = ("runner", "mode", "started_at", "rows_out")


def _newest_run_from_files(metrics: str) -> tuple[bool, dict[str, Any] | None]:
    """`Job.last_run` read from the metrics table's files, without Spark: (True, the newest run, or
    None when the table does not exist), or (False, None) where its log cannot list its files
    (a metastore table, object storage, a table Delta keeps no file list for): then Spark reads it."""
    from streamjoin.delta_log import LocalLog

    log = LocalLog.of(metrics)
    if log is None:
        return False, None
    if not log.exists():
        return True, None
    files = log.files()
    if files is None:
        return False, None
    import pyarrow.parquet as parquet

    runs = [
        row
        for path in log.paths(files)
        for row in parquet.read_table(path, columns=list(_RUN_COLUMNS)).to_pylist()
    ]
    newest = max(runs, key=lambda run: run["started_at"], default=None)
    if newest is None:
        return True, None
    started = newest["started_at"]  # Parquet's timestamps are UTC, read naive or aware
    return True, {**newest, "started_at": started.replace(tzinfo=started.tzinfo or UTC).isoformat()}
