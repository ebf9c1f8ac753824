"""Airflow DAGs for streamjoin jobs: per job file, a backfill DAG and (with schedule.live_every) a live DAG.

`streamjoin_<job>` replays one data interval [data_interval_start, data_interval_end) per run, cut on
local calendar boundaries of the job's schedule (every, timezone), validates it with Great
Expectations and fails when the slice did not succeed. `streamjoin_<job>_live` runs the live
runner available-now every schedule.live_every. Both declare the job's Delta output as an asset.

Parsing stays cheap: job files are read here, Spark and Great Expectations only inside tasks. A job
file that cannot be loaded is skipped with a warning (Airflow lists it among the file's import
warnings) so the other jobs' DAGs still load. See docs/airflow.md.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import (
    DAG,
    Asset,
    CronDataIntervalTimetable,
    DeltaTriggerTimetable,
    Param,
    task,
)
from airflow.sdk.exceptions import AirflowFailException

import streamjoin
from streamjoin.enums import Mode
from streamjoin.errors import JobError
from streamjoin.job import Job
from streamjoin.jobfile import job_files
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import parse_duration

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# spark-submit's application: the CLI (streamjoin/resources/submitted_cli.py).
SUBMITTED_CLI = Path(streamjoin.__file__).parent / "resources" / "submitted_cli.py"
DEFAULT_START = "2024-01-01"  # first data interval when a job's schedule has no start (local midnight)
MASTER_VARIABLE = "streamjoin_master"  # Airflow Variable naming the Spark master; beats $STREAMJOIN_MASTER
# Airflow Variable naming a Spark connection (Apache Spark provider): when set, the backfill DAGs'
# tasks are submitted through it by spark-submit, each with a driver of its own (docs/airflow.md).
SPARK_CONN_VARIABLE = "streamjoin_spark_conn_id"
log = logging.getLogger(__name__)


def jobs_folder() -> Path:
    """$STREAMJOIN_JOBS, else the project's jobs/ folder."""
    return Path(os.environ.get("STREAMJOIN_JOBS") or PROJECT_ROOT / "jobs")


def data_root() -> Path:
    """Where relative Delta paths of job files resolve: $STREAMJOIN_ROOT, else the project's data/."""
    return Path(os.environ.get("STREAMJOIN_ROOT") or PROJECT_ROOT / "data")


def cron_for(every: str) -> str:
    """The cron expression whose runs start on local multiples of `every` counted from midnight.

    Minutes dividing an hour and hours dividing a day repeat every day; 1d is local midnight and
    7d is Monday's local midnight. Other cadences have no cron form and are refused.
    """
    step = parse_duration(every, "schedule: every")
    minutes = step // timedelta(minutes=1)
    if step == timedelta(days=1):
        return "0 0 * * *"
    if step == timedelta(days=7):
        return "0 0 * * 1"
    if step > timedelta(0) and step == timedelta(minutes=minutes):
        if minutes < 60 and 60 % minutes == 0:
            return f"*/{minutes} * * * *"
        if minutes == 60:
            return "0 * * * *"
        if minutes % 60 == 0 and 24 % (minutes // 60) == 0:
            return f"0 */{minutes // 60} * * *"
    raise JobError(
        f"schedule: every {every!r} has no cron form aligned on local time that Airflow can schedule; "
        "write minutes dividing an hour (15m, 30m), hours dividing a day (1h, 6h), 1d or 7d"
    )


def start_date(spec: JoinSpec) -> datetime:
    """schedule.start (an ISO date or datetime, local to schedule.timezone), else DEFAULT_START."""
    text = spec.meta.schedule.start or DEFAULT_START
    try:
        return pendulum.parse(text, tz=pendulum.timezone(spec.meta.schedule.timezone))
    except Exception:
        raise JobError(f"schedule: start {text!r} is not an ISO date or datetime, e.g. 2024-05-01") from None


def output_asset(spec: JoinSpec) -> Asset:
    """The job's Delta output as an asset: file://<absolute path>, or delta://<table name>."""
    out = spec.output
    uri = f"file://{Path(out.path).resolve()}" if out.path else f"delta://{out.table}"
    return Asset(name=f"streamjoin_{spec.name}_output", uri=uri, group="streamjoin")


def slice_options(params: dict[str, Any]) -> tuple[str, dict[str, int] | None]:
    """The run's replay mode and pinned versions (dag_run.conf overrides the DAG's params)."""
    mode, versions = params.get("mode") or "exact", params.get("versions")
    if mode not in list(Mode):
        raise AirflowFailException(
            f"conf mode {mode!r} is unknown; use 'exact' (as live ran) or 'complete' (every row on time)"
        )
    if versions is not None and (
        not isinstance(versions, dict)
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in versions.values())
    ):
        raise AirflowFailException(
            f'conf versions {versions!r} must map source names to Delta versions, e.g. {{"orders": 12, "payments": 9}}'
        )
    return mode, versions or None


def job_of(spec: JoinSpec) -> Job:
    """The job as a task runs it; master from the Airflow Variable, else $STREAMJOIN_MASTER, else local[*]."""
    from airflow.sdk import Variable

    return Job(
        spec, master=Variable.get(MASTER_VARIABLE, default=None) or None, app_name="streamjoin-airflow"
    )


def spark_conn_id() -> str | None:
    """The Spark connection the backfill tasks are submitted through (Variable
    streamjoin_spark_conn_id, read when the DAGs are made), else None: they run in the task's process."""
    from airflow.sdk import Variable

    return Variable.get(SPARK_CONN_VARIABLE, default=None) or None


@functools.cache
def submit_operator() -> type:
    """SparkSubmitOperator running `streamjoin backfill` over the run's data interval (the provider is
    imported only when a DAG submits): Delta's jars and the driver's JVM options passed to
    spark-submit, the slice's arguments
    made from the run, and the CLI's refusal (exit 2) or an invalid slice (exit 3) failing the task
    without retries."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from streamjoin import jars
    from streamjoin.errors import EXIT_INVALID, StreamJoinError

    refused = StreamJoinError.exit_code  # the CLI's exit code for a job it will not run as written

    class StreamjoinSubmitOperator(SparkSubmitOperator):
        def __init__(self, *, spec: JoinSpec, job_file: Path, **kwargs: Any) -> None:
            super().__init__(
                application=str(SUBMITTED_CLI),
                name=f"streamjoin-{spec.name}",
                env_vars={"STREAMJOIN_ROOT": str(data_root()), "PYSPARK_PYTHON": sys.executable},
                **kwargs,
            )
            self.spec, self.job_file = spec, str(job_file)

        def execute(self, context: Any) -> None:
            # The driver starts as the CLI's does (class archive, UTC, quiet logs, the object
            # storage connector), unless the operator's own conf says otherwise: spark-submit
            # starts its JVM before the session.
            delta, conf, env = jars.submit_settings()
            self.jars = ",".join(delta)
            self.conf = {**conf, **(self.conf or {})}
            self.env_vars = {**env, **(self.env_vars or {})}
            self.application_args = ["backfill", self.job_file, *self._arguments(context)]
            try:
                super().execute(context)
            except Exception:
                code = getattr(getattr(self._hook, "_submit_sp", None), "returncode", None)
                # A retry would repeat the refusal or the failed validation.
                if code in (refused, EXIT_INVALID):
                    raise AirflowFailException(
                        f"job {self.spec.name}: `streamjoin backfill` exited {code} "
                        f"({'refused' if code == refused else 'a slice is invalid'}); its log above says why"
                    ) from None
                raise

        def _arguments(self, context: Any) -> list[str]:
            """The run's slice: its data interval cut as the schedule cuts it, its mode and versions."""
            mode, versions = slice_options(context["params"])
            run = context["dag_run"]
            return [
                *("--start", context["data_interval_start"].isoformat()),
                *("--end", context["data_interval_end"].isoformat()),
                *("--every", self.spec.meta.schedule.every, "--timezone", self.spec.meta.schedule.timezone),
                *("--mode", mode, "--backfill-id", f"airflow:{run.dag_id}:{run.run_id}"),
                *(("--versions", ",".join(f"{k}={v}" for k, v in versions.items())) if versions else ()),
            ]

    return StreamjoinSubmitOperator


def outcome_summary(outcome) -> dict[str, Any]:
    """A SliceOutcome as plain values (XCom holds JSON)."""
    metrics, validation = outcome.metrics, outcome.validation
    return {
        "status": outcome.status,
        "start": outcome.slice.start.isoformat(),
        "end": outcome.slice.end.isoformat(),
        "versions": metrics.versions if metrics else None,
        "rows_in": metrics.total("rows_in") if metrics else None,
        "rows_out": metrics.rows_out if metrics else None,
        "validation_failed": list(validation.failed) if validation else [],
        "docs": validation.docs if validation else None,
        "error": outcome.error,
        "duration_s": outcome.duration_s,
    }


def failure_message(job: str, summary: dict[str, Any]) -> str:
    """Why a slice did not succeed, with the failed expectations or the error and the Data Docs page."""
    where = f"job {job}, slice [{summary['start']}, {summary['end']})"
    if summary["status"] == "invalid":
        failed = "; ".join(summary["validation_failed"]) or "no expectation named"
        return f"{where}: output failed validation: {failed}. Data Docs: {summary['docs']}"
    return f"{where}: replay failed: {summary['error']}"


def backfill_dag(spec: JoinSpec, job_file: Path, conn_id: str | None = None) -> DAG:
    """`streamjoin_<job>`: one slice per data interval, on the job's local calendar schedule; catches
    up from schedule.start only when the job declares one (a job without a start would otherwise
    run every interval since DEFAULT_START on unpausing). With `conn_id` (a Spark connection), its
    one task is `streamjoin backfill` of the interval, submitted through it."""
    asset = output_asset(spec)
    schedule = spec.meta.schedule
    with DAG(
        dag_id=f"streamjoin_{spec.name}",
        description=spec.meta.description or f"streamjoin job {spec.name}: backfill slices",
        schedule=CronDataIntervalTimetable(cron_for(schedule.every), timezone=schedule.timezone),
        start_date=start_date(spec),
        catchup=spec.meta.schedule.start is not None,
        max_active_runs=1,  # each run starts a Spark driver; `backfill create --max-active-runs` raises it
        tags=["streamjoin", "backfill"],
        doc_md=f"Replays job file `{job_file}` one data interval (every {schedule.every}, "
        f"{schedule.timezone}) at a time and validates the slice; output `{spec.output.location}`. "
        "Conf: `mode` (exact | complete), `versions` ({source: Delta version}, default latest).",
        params={
            "mode": Param(
                "exact",
                type="string",
                enum=list(Mode),
                description="exact: as live ran; complete: every row on time",
            ),
            "versions": Param(
                None,
                type=["null", "object"],
                description="pinned Delta versions {source: version}; null: latest",
            ),
        },
        default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    ) as made:
        if conn_id:  # one driver per run: `backfill` brings the index up to the versions it pins itself
            submit_operator()(
                task_id="replay_slice", spec=spec, job_file=job_file, conn_id=conn_id, outlets=[asset]
            )
            return made

        @task
        def index_sources(params=None) -> str:
            """Bring the job's arrival index up to the versions the slices read (cheap when it is current)."""
            _, versions = slice_options(params)
            try:
                text, _ = job_of(spec).index(upto=versions)
            except JobError as exc:  # no start the job can begin at, or a source that rewrites rows
                raise AirflowFailException(f"job {spec.name}: {exc}") from None
            log.info(text)
            return text

        @task(outlets=[asset])
        def replay_slice(
            data_interval_start=None, data_interval_end=None, params=None, dag_run=None, ti=None
        ) -> dict:
            """Replay and validate [data_interval_start, data_interval_end); fail unless the slice succeeded."""
            from streamjoin.backfill import INVALID, SUCCEEDED

            mode, versions = slice_options(params)
            try:
                outcome = job_of(spec).replay_slice(
                    data_interval_start,
                    data_interval_end,
                    mode=mode,
                    versions=versions,
                    backfill_id=f"airflow:{dag_run.dag_id}:{dag_run.run_id}",
                )
            except JobError as exc:  # the job cannot run as written: retrying would not help
                raise AirflowFailException(f"job {spec.name}: {exc}") from None
            summary = outcome_summary(outcome)
            if outcome.status == SUCCEEDED:
                return summary
            ti.xcom_push(key="outcome", value=summary)
            if outcome.status == INVALID:  # the data is what it is: a retry would validate the same rows
                raise AirflowFailException(failure_message(spec.name, summary))
            raise RuntimeError(failure_message(spec.name, summary))  # Spark or I/O: retried

        @task
        def report(summary: dict) -> str:
            """One line per slice in the task log: rows, versions read, where the Data Docs are."""
            line = (
                f"job {spec.name}: slice [{summary['start']}, {summary['end']}) {summary['status']}: "
                f"{summary['rows_in']} rows in, {summary['rows_out']} out, versions {summary['versions']}, "
                f"{summary['duration_s']} s; Data Docs {summary['docs']}"
            )
            log.info(line)
            return line

        replayed = replay_slice()
        index_sources() >> replayed
        report(replayed)
    return made


def live_dag(spec: JoinSpec, job_file: Path) -> DAG:
    """`streamjoin_<job>_live`: the live runner, available-now, every schedule.live_every; one run at a time."""
    asset = output_asset(spec)
    checkpoint = f"{spec.output.location}_checkpoint"
    with DAG(
        dag_id=f"streamjoin_{spec.name}_live",
        description=f"streamjoin job {spec.name}: live runner, available-now",
        schedule=DeltaTriggerTimetable(parse_duration(spec.meta.schedule.live_every, "schedule: live_every")),
        start_date=start_date(spec),
        catchup=False,
        max_active_runs=1,
        tags=["streamjoin", "live"],
        doc_md=f"Runs job file `{job_file}` live (available-now) every {spec.meta.schedule.live_every}; "
        f"checkpoint `{checkpoint}`, output `{spec.output.location}`.",
        default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    ) as made:

        @task(outlets=[asset])
        def run_live() -> dict:
            """Process every committed row not yet processed, then stop; the micro-batches' totals and
            the output's version before the run (what `verify` starts after)."""
            from streamjoin.metrics import combine

            job = job_of(spec)
            before = job.written_version() if spec.meta.schedule.verify else None  # only verify reads it
            runs = job.live(checkpoint).run()
            summary = combine(runs).summary() if runs else "nothing new to process"
            log.info("job %s live: %d micro-batch(es): %s", spec.name, len(runs), summary)
            return {
                "batches": len(runs),
                "rows_out": sum(r.rows_out for r in runs),
                "summary": summary,
                "output_version_before": before,
            }

        ran = run_live()
        if spec.meta.schedule.verify:

            @task
            def verify(ran: dict) -> dict:
                """Compare the slices this run wrote into with the exact replay; fail on a difference."""
                outcome = job_of(spec).verify_written(ran["output_version_before"], checkpoint)
                if outcome is None:
                    log.info("job %s: the live run wrote no rows, nothing to verify", spec.name)
                    return {"slices": 0, "equal": True}
                text = outcome.describe(spec.meta.schedule.timezone)
                log.info("%s", text)
                if not outcome.equal:
                    raise AirflowFailException(
                        f"job {spec.name}: the live output differs from the replay: {text}"
                    )
                return {"slices": len(outcome.slices), "equal": True}

            verify(ran)
    return made


def build_dags(folder: Path) -> dict[str, DAG]:
    """Every job file's DAGs by id; a job file that fails to load is skipped with a warning."""
    dags: dict[str, DAG] = {}
    conn_id = spark_conn_id()
    for job_file in job_files(folder):
        try:
            spec = Job.load(job_file, root=data_root()).spec
            # refuse a bad schedule before any DAG of the job is registered
            cron_for(spec.meta.schedule.every)
            start_date(spec)
            ids = [f"streamjoin_{spec.name}"] + (
                [f"streamjoin_{spec.name}_live"] if spec.meta.schedule.live_every else []
            )
            taken = [i for i in ids if i in dags]
            if taken:
                raise JobError(
                    f"DAG id {taken[0]} is already made from another job file; give this job another name"
                )
        except Exception as exc:  # one bad job file must not hide the other jobs' DAGs
            message = f"streamjoin: job file {job_file} skipped, no DAG made: {type(exc).__name__}: {exc}"
            log.error(message)
            warnings.warn(message, stacklevel=1)
            continue
        dags[ids[0]] = backfill_dag(spec, job_file, conn_id)
        if spec.meta.schedule.live_every:
            dags[ids[1]] = live_dag(spec, job_file)
    return dags


DAGS = build_dags(jobs_folder())
