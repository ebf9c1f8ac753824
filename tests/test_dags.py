"""The Airflow DAGs (dags/streamjoin_dags.py) with real Airflow: parsing, schedules, and runs through dag.test.

Airflow reads its configuration when first imported, so the session fixture sets AIRFLOW_HOME and
migrates a SQLite metadata database before anything here imports airflow (imports are inside tests).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pendulum
import pytest
from conftest import SHORT_LIVED_JVM
from harness import create_tables, write_commit
from spark_cluster import finished_apps

from streamjoin.jobfile import job_files, load_job
from streamjoin.runners.options import RunOptions

REPO = Path(__file__).resolve().parent.parent
DAG_FILE = REPO / "dags" / "streamjoin_dags.py"
VENV_BIN = REPO / ".venv" / "bin"
UTC = UTC
H, D = 3600, 86_400
BERLIN = "Europe/Berlin"
CRON = {"15m": "*/15 * * * *", "1h": "0 * * * *", "6h": "0 */6 * * *", "1d": "0 0 * * *", "7d": "0 0 * * 1"}


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory):
    """A fresh AIRFLOW_HOME with a migrated SQLite database; env set before airflow's first import."""
    if "airflow" in sys.modules:
        raise RuntimeError(
            "airflow was imported before tests/test_dags.py set AIRFLOW_HOME; import it inside tests only"
        )
    home = tmp_path_factory.mktemp("airflow_home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AIRFLOW_HOME", str(home))
        env.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        env.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(DAG_FILE.parent))
        env.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{home}/airflow.db")
        migrated = subprocess.run(
            [str(VENV_BIN / "airflow"), "db", "migrate"],
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ),
        )
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        yield home


# ---------------------------------------------------------------- parsing

IMPORT_PROBE = """
import importlib.util, json, sys, time
began = time.process_time()  # CPU seconds: what the import costs, whatever else the machine runs
spec = importlib.util.spec_from_file_location("streamjoin_dags", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
seconds = time.process_time() - began
print(json.dumps({
    "seconds": seconds,
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "great_expectations", "py4j")),
    "dags": {
        dag_id: {
            "timetable": type(dag.timetable).__name__,
            "cron": getattr(dag.timetable, "expression", None),
            "timezone": str(getattr(dag.timetable, "timezone", "")),
            "catchup": dag.catchup, "tags": sorted(dag.tags), "max_active_runs": dag.max_active_runs,
            "outlets": {t.task_id: [a.uri for a in t.outlets] for t in dag.tasks},
        }
        for dag_id, dag in module.DAGS.items()
    },
}))
"""


def test_dag_file_imports_fast_without_spark_and_makes_every_jobs_dag(airflow_home):
    env = {
        k: v for k, v in os.environ.items() if k not in ("STREAMJOIN_JOBS", "STREAMJOIN_ROOT")
    }  # the defaults
    probe = subprocess.run(
        [str(VENV_BIN / "python"), "-c", IMPORT_PROBE, str(DAG_FILE)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=airflow_home,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    parsed = json.loads(probe.stdout.strip().splitlines()[-1])
    print(f"DAG file import: {parsed['seconds']:.2f} CPU-s")
    assert parsed["seconds"] < 10
    assert parsed["heavy"] == []  # Spark, py4j and Great Expectations load inside tasks only

    jobs = [load_job(f, root=REPO / "data") for f in job_files(REPO / "jobs")]
    expected = {f"streamjoin_{j.name}" for j in jobs} | {
        f"streamjoin_{j.name}_live" for j in jobs if j.meta.schedule.live_every
    }
    assert set(parsed["dags"]) == expected
    for job in jobs:
        dag = parsed["dags"][f"streamjoin_{job.name}"]
        assert (
            dag["timetable"] == "CronDataIntervalTimetable" and dag["timezone"] == job.meta.schedule.timezone
        )
        assert dag["cron"] == CRON[job.meta.schedule.every]
        assert dag["catchup"] is (job.meta.schedule.start is not None) and dag["tags"] == [
            "backfill",
            "streamjoin",
        ]
        assert dag["outlets"]["replay_slice"] == [f"file://{job.output.location}"]


def test_bad_conf_says_what_to_write(airflow_home):
    from airflow.sdk.exceptions import AirflowFailException

    loader = importlib.util.spec_from_file_location("streamjoin_dags_under_test", DAG_FILE)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    assert module.slice_options({"mode": "complete", "versions": {"l": 3}}) == ("complete", {"l": 3})
    assert module.slice_options({"mode": "exact", "versions": None}) == ("exact", None)
    with pytest.raises(AirflowFailException, match="use 'exact' .* or 'complete'"):
        module.slice_options({"mode": "fast", "versions": None})
    with pytest.raises(
        AirflowFailException, match='must map source names to Delta versions, e.g. {"orders": 12'
    ):
        module.slice_options({"mode": "exact", "versions": {"l": "latest"}})


def write_job(folder: Path, name: str, body: str) -> Path:
    file = folder / f"{name}.yaml"
    file.write_text(textwrap.dedent(body))
    return file


JOB = """\
    name: {name}
    sources:
      l: {{path: l, kind: stream, time: t}}
      r: {{path: r, kind: stream, time: t}}
    from: l
    joins:
      - join: r
        type: left
        on: l.k = r.k
        between: [0s, 1h]
        grace: 1d
    select: [l.id AS lid, r.id AS rid]
    output: {{path: out/{name}}}
    schedule: {{every: 1d, timezone: Europe/Berlin, start: "2023-12-01"{extra}}}
    quality: {{match_column: rid, min_match_rate: {rate}}}
"""


def test_schedules_live_dags_and_bad_job_files(airflow_home, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import DeltaTriggerTimetable
    from airflow.serialization.encoders import coerce_to_core_timetable

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write_job(jobs, "berlin", JOB.format(name="berlin", rate=0.5, extra=", live_every: 15m"))
    write_job(jobs, "hourly", JOB.format(name="hourly", rate=0.5, extra="").replace("every: 1d", "every: 1h"))
    write_job(jobs, "broken", "name: broken\nsources: [unclosed\n")
    write_job(
        jobs,
        "sevenhours",
        JOB.format(name="sevenhours", rate=0.5, extra="").replace("every: 1d", "every: 7h"),
    )
    write_job(
        jobs, "nostart", JOB.format(name="nostart", rate=0.5, extra="").replace(', start: "2023-12-01"', "")
    )
    write_job(jobs, "zz_again", JOB.format(name="berlin", rate=0.5, extra=""))  # a second job named berlin
    write_job(jobs, "unverifiable", JOB.format(name="unverifiable", rate=0.5, extra=", verify: true"))
    monkeypatch.setenv("STREAMJOIN_JOBS", str(jobs))
    monkeypatch.setenv("STREAMJOIN_ROOT", str(tmp_path / "data"))

    with pytest.warns(UserWarning, match="skipped, no DAG made"):  # DagBag re-raises the file's warnings
        bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {
        "streamjoin_berlin",
        "streamjoin_berlin_live",
        "streamjoin_hourly",
        "streamjoin_nostart",
    }
    # issue 18, item 7: only a job that says where its data starts catches up on unpausing
    assert bag.get_dag("streamjoin_berlin").catchup is True
    assert bag.get_dag("streamjoin_nostart").catchup is False
    warned = "\n".join(w for ws in bag.captured_warnings.values() for w in ws)
    assert "broken.yaml skipped" in warned and "is not valid YAML" in warned
    assert (
        "sevenhours.yaml skipped" in warned
        and "write minutes dividing an hour (15m, 30m), hours dividing a day" in warned
    )
    assert "zz_again.yaml skipped" in warned and "DAG id streamjoin_berlin is already made" in warned
    assert "unverifiable.yaml skipped" in warned and "verify runs after each scheduled live run" in warned

    daily = coerce_to_core_timetable(bag.get_dag("streamjoin_berlin").timetable)
    # A daily run's data interval is a local calendar day, 23 hours long on the day clocks go forward.
    spring = daily.infer_manual_data_interval(run_after=pendulum.datetime(2024, 4, 1, tz=BERLIN))
    assert (spring.start, spring.end) == (
        datetime(2024, 3, 30, 23, tzinfo=UTC),
        datetime(2024, 3, 31, 22, tzinfo=UTC),
    )
    autumn = daily.infer_manual_data_interval(run_after=pendulum.datetime(2024, 10, 28, tz=BERLIN))
    assert autumn.end - autumn.start == timedelta(hours=25)
    hourly = coerce_to_core_timetable(bag.get_dag("streamjoin_hourly").timetable)
    hour = hourly.infer_manual_data_interval(run_after=pendulum.datetime(2024, 3, 31, 3, tz=BERLIN))
    assert (hour.start, hour.end) == (
        datetime(2024, 3, 31, 0, tzinfo=UTC),
        datetime(2024, 3, 31, 1, tzinfo=UTC),
    )

    live = bag.get_dag("streamjoin_berlin_live")
    assert isinstance(live.timetable, DeltaTriggerTimetable) and live.timetable.delta == timedelta(minutes=15)
    assert live.max_active_runs == 1 and live.catchup is False and sorted(live.tags) == ["live", "streamjoin"]
    output = f"file://{tmp_path}/data/out/berlin"
    assert [a.uri for a in live.get_task("run_live").outlets] == [output]
    assert live.task_ids == ["run_live"]  # no verify task unless schedule.verify says so
    assert [a.uri for a in bag.get_dag("streamjoin_berlin").get_task("replay_slice").outlets] == [output]
    assert bag.get_dag("streamjoin_berlin").start_date == pendulum.datetime(2023, 12, 1, tz=BERLIN)


def test_airflow_backfill_create_makes_one_run_per_local_day(airflow_home, tmp_path):
    """The command docs/airflow.md gives, as a dry run: logical dates are the local days' starts."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write_job(jobs, "cli_berlin", JOB.format(name="cli_berlin", rate=0.5, extra=""))
    env = {**os.environ, "STREAMJOIN_JOBS": str(jobs), "STREAMJOIN_ROOT": str(tmp_path / "data")}

    def airflow(*args: str) -> str:
        done = subprocess.run(
            [str(VENV_BIN / "airflow"), *args], capture_output=True, text=True, timeout=300, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    airflow("dags", "reserialize")
    backfill = ["backfill", "create", "--dag-id", "streamjoin_cli_berlin", "--dry-run"]
    local = airflow(
        *backfill, "--from-date", "2024-03-30T00:00:00+01:00", "--to-date", "2024-04-01T00:00:00+02:00"
    )
    assert "2024-03-30 00:00:00+01:00" in local  # 30 March, then 31 March (23 hours), then 1 April
    assert "2024-03-30 23:00:00+00:00" in local and "2024-03-31 22:00:00+00:00" in local
    utc = airflow(*backfill, "--from-date", "2024-03-30", "--to-date", "2024-04-01")
    assert "2024-03-30 23:00:00+00:00" in utc and "2024-03-30 00:00:00+01:00" not in utc  # misses 30 March


# ---------------------------------------------------------------- runs through dag.test

# Three local (Berlin, UTC+1) days of 2024-01-01..03 and a later commit that closes every window.
# (id, key, seconds after 2024-01-01T00:00Z, v); one commit per side per day, on time (grace 1d).
LEFT = [
    [
        ("l1", "a", 2 * H, 1),
        ("l2", "b", 5 * H, 1),
        ("l3", "c", 22 * H + 2400, 1),
        ("l4", "d", 23 * H + 1800, 1),
    ],
    [("l5", "a", D + 3 * H, 1), ("l6", "e", D + 12 * H, 1), ("l7", "f", D + 22 * H + 3000, 1)],
    [("l8", "a", 2 * D + H, 1), ("l9", "g", 2 * D + 8 * H, 1), ("l10", "h", 2 * D + 21 * H, 1)],
    [("l11", "z", 5 * D, 1)],
]
RIGHT = [
    [("r1", "a", 2 * H + 600, 1), ("r2", "c", 23 * H + 600, 1), ("r3", "d", 23 * H + 3000, 1)],
    [("r4", "a", D + 3 * H + 1800, 1), ("r5", "f", D + 23 * H + 1200, 1), ("r6", "x", D + 5 * H, 1)],
    [("r7", "a", 2 * D + H + 300, 1), ("r8", "h", 2 * D + 21 * H + 3540, 1)],
    [("r9", "z", 5 * D, 1)],
]
DAYS = [pendulum.datetime(2024, 1, day, tz=BERLIN) for day in (1, 2, 3, 4)]


@pytest.fixture(scope="module")
def project(spark, airflow_home, tmp_path_factory):
    """Source tables under data/, job files under jobs/ (a LEFT join passing its quality rules, and one
    that demands every row be matched), and the real DagBag of dags/ with STREAMJOIN_* pointing there."""
    from airflow.dag_processing.dagbag import DagBag

    # Airflow's logging config lowers the root level to INFO; py4j would then log its shutdown at exit
    # into a stream pytest has already closed.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    root = tmp_path_factory.mktemp("dag_runs")
    paths = create_tables(spark, str(root / "data"))
    for left, right in zip(LEFT, RIGHT, strict=False):
        write_commit(spark, paths[0], left)
        write_commit(spark, paths[1], right)
    (root / "jobs").mkdir()
    write_job(root / "jobs", "airflow_daily", JOB.format(name="airflow_daily", rate=0.5, extra=""))
    write_job(root / "jobs", "airflow_strict", JOB.format(name="airflow_strict", rate=1.0, extra=""))
    write_job(
        root / "jobs",
        "airflow_stream",
        JOB.format(name="airflow_stream", rate=0.5, extra=", live_every: 1h, verify: true"),
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("STREAMJOIN_JOBS", str(root / "jobs"))
        env.setenv("STREAMJOIN_ROOT", str(root / "data"))
        bag = DagBag(dag_folder=str(DAG_FILE))
        assert bag.import_errors == {} and not bag.captured_warnings
        yield root, bag


def output_rows(spark, location: str) -> Counter:
    from streamjoin import delta_io

    return Counter(tuple(r) for r in delta_io.read_snapshot(spark, location).collect())


def run_day(dag, day_end: datetime, conf: dict | None = None):
    """One DAG run whose data interval is the local day ending at `day_end` (dag.test infers the interval
    a manual run at that instant has: the last whole day before it)."""
    return dag.test(logical_date=day_end, run_conf=conf)


def test_three_daily_runs_equal_one_replay_and_a_rerun_changes_nothing(spark, project):
    from streamjoin.backfill import attempts
    from streamjoin.runners.replay import replay

    root, bag = project
    dag = bag.get_dag("streamjoin_airflow_daily")
    spec = load_job(root / "jobs" / "airflow_daily.yaml", root=root / "data")
    for start, end in zip(DAYS, DAYS[1:], strict=False):
        run = run_day(dag, end)
        assert run.state == "success", [(t.task_id, t.state) for t in run.get_task_instances()]
        assert (run.data_interval_start, run.data_interval_end) == (start, end)

    whole = replace(spec, output=replace(spec.output, path=str(root / "data" / "out" / "whole")))
    replay(spark, whole, DAYS[0], DAYS[-1], RunOptions(mode="exact"))
    expected = output_rows(spark, whole.output.location)
    assert output_rows(spark, spec.output.location) == expected
    assert sum(expected.values()) == 10  # every left row of the three days: 7 matched, 3 padded

    again = run_day(dag, DAYS[2])  # the second day once more
    assert again.state == "success"
    assert output_rows(spark, spec.output.location) == expected

    recorded = attempts(spark, spec).collect()
    assert len(recorded) == 4 and {r.status for r in recorded} == {"succeeded"}
    assert all(r.backfill_id.startswith("airflow:streamjoin_airflow_daily:") for r in recorded)
    assert {r.mode for r in recorded} == {"exact"}
    assert (
        asset_events(f"file://{spec.output.location}") == 4
    )  # one per successful run: downstream DAGs see each


def asset_events(uri: str) -> int:
    """How many events the metadata database holds for the asset at `uri`."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return session.scalar(
            select(func.count())
            .select_from(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == uri)
        )


def xcom(run, task_id: str, key: str):
    """An XCom value the run's task pushed, read from the metadata database."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(run_id=run.run_id, key=key, task_ids=task_id, dag_ids=run.dag_id)
        return XComModel.deserialize_value(session.scalars(query).one())


def test_a_slice_failing_its_quality_rules_fails_the_run_and_names_its_data_docs(spark, project, capfd):
    root, bag = project
    run = run_day(bag.get_dag("streamjoin_airflow_strict"), DAYS[1])  # 2024-01-01 has l2, never paid
    assert run.state == "failed"
    tasks = {t.task_id: t for t in run.get_task_instances()}
    assert {k: t.state for k, t in tasks.items()} == {
        "index_sources": "success",
        "replay_slice": "failed",
        "report": "upstream_failed",
    }
    assert tasks["replay_slice"].try_number == 1  # invalid data is not retried

    outcome = xcom(run, "replay_slice", "outcome")
    assert (
        outcome["status"] == "invalid" and outcome["rows_out"] == 2
    )  # l1 with r1, l2 padded (l3's pair ends at 00:10)
    assert any("rid" in line and "not_be_null" in line for line in outcome["validation_failed"])
    assert Path(outcome["docs"]).is_file() and outcome["docs"].startswith(
        str(root / "data" / "out" / "airflow_strict_quality")
    )
    logged = capfd.readouterr()
    assert (
        "job airflow_strict, slice [2023-12-31T23:00:00+00:00, 2024-01-01T23:00:00+00:00): output failed validation: "
        "expect_column_values_to_not_be_null(rid" in logged.out + logged.err
    )


def test_live_dag_processes_what_is_committed_once(spark, project):
    from harness import EVERYTHING

    from streamjoin.runners.replay import replay

    root, bag = project
    dag = bag.get_dag("streamjoin_airflow_stream_live")
    spec = load_job(root / "jobs" / "airflow_stream.yaml", root=root / "data")
    first = dag.test()
    assert first.state == "success"
    assert xcom(first, "run_live", "return_value")["batches"] >= 1
    whole = replace(spec, output=replace(spec.output, path=str(root / "data" / "out" / "live_whole")))
    replay(spark, whole, *EVERYTHING, options=RunOptions(mode="exact"))
    expected = output_rows(spark, whole.output.location)
    assert (
        output_rows(spark, spec.output.location) == expected and sum(expected.values()) == 10
    )  # l11 stays open: r9's commit is past the frontier

    second = dag.test()  # nothing committed since: the checkpoint makes it a no-op
    assert second.state == "success"
    assert output_rows(spark, spec.output.location) == expected
    assert asset_events(f"file://{spec.output.location}") == 2
    # schedule.verify: each run compares the days it wrote into with the exact replay.
    assert xcom(first, "verify", "return_value") == {"slices": 3, "equal": True}
    assert xcom(second, "verify", "return_value") == {"slices": 0, "equal": True}

    # A second writer adds a row to the day the next run writes into: that run's verify fails it.
    from streamjoin import delta_io
    from streamjoin.verify import consistency

    output = delta_io.read_snapshot(spark, spec.output.location)
    intruder = output.limit(1).selectExpr(
        "'intruder' AS lid", "rid", "timestamp'2024-01-06 12:00:00' AS event_time"
    )
    intruder.write.format("delta").mode("append").save(spec.output.location)
    left, right = (source.location for source in spec.sources)
    write_commit(spark, left, [("l12", "z", 5 * D + 2 * H, 1)])
    write_commit(spark, right, [("r10", "z", 5 * D + 2 * H + 60, 1)])
    write_commit(spark, left, [("l13", "y", 8 * D, 1)])
    write_commit(spark, right, [("r11", "y", 8 * D, 1)])
    third = dag.test()
    assert third.state == "failed"
    assert {t.task_id: t.state for t in third.get_task_instances()} == {
        "run_live": "success",
        "verify": "failed",
    }
    sixth = [c for c in consistency(spark, spec) if c["slice_start"].day == 5]  # 6 January, Berlin
    assert [(c["extra"], c["missing"], c["rows_live"], c["rows_replayed"]) for c in sixth] == [(1, 0, 3, 2)]


@pytest.mark.slow  # a standalone master and worker of its own
def test_a_slice_submitted_through_sparks_airflow_provider_runs_on_the_cluster(
    spark, project, cluster, tmp_path, monkeypatch
):
    """With the Variable streamjoin_spark_conn_id naming a Spark connection, the backfill DAG's tasks
    are the provider's SparkSubmitOperator running the streamjoin CLI: the slice's driver is a process
    of its own on the standalone cluster, and it writes, validates and records what the in-process
    task writes for the same day."""
    from airflow.dag_processing.dagbag import DagBag

    from streamjoin.backfill import attempts
    from streamjoin.runners.replay import replay

    root, _ = project
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    write_job(jobs, "airflow_submitted", JOB.format(name="airflow_submitted", rate=0.5, extra=""))
    monkeypatch.setenv("STREAMJOIN_JOBS", str(jobs))
    monkeypatch.setenv("AIRFLOW_VAR_STREAMJOIN_SPARK_CONN_ID", "streamjoin_cluster")
    monkeypatch.setenv("AIRFLOW_CONN_STREAMJOIN_CLUSTER", cluster["url"])
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")  # the worker's spark-submit
    # Delta rebuilds a table's state with 50 tasks on a cluster by default: much of a small slice's
    # time. The executor lives for one small replay: C1 alone (spark_cluster.ONE_SMALL_REPLAY).
    monkeypatch.setenv(
        "STREAMJOIN_SPARK_CONF",
        os.environ["STREAMJOIN_SPARK_CONF"]
        + f",spark.databricks.delta.snapshotPartitions=2,spark.executor.defaultJavaOptions={SHORT_LIVED_JVM}",
    )
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {} and not bag.captured_warnings
    dag = bag.get_dag("streamjoin_airflow_submitted")
    assert [(t.task_id, type(t).__name__) for t in dag.tasks] == [
        ("replay_slice", "StreamjoinSubmitOperator")
    ]

    run = run_day(dag, DAYS[1])
    assert run.state == "success", [(t.task_id, t.state) for t in run.get_task_instances()]
    apps = finished_apps(cluster, named="streamjoin-airflow_submitted")
    assert [(a["name"], a["state"]) for a in apps] == [("streamjoin-airflow_submitted", "FINISHED")], apps

    spec = load_job(jobs / "airflow_submitted.yaml", root=root / "data")
    alone = replace(spec, output=replace(spec.output, path=str(tmp_path / "alone")))
    replay(spark, alone, DAYS[0], DAYS[1], RunOptions(mode="exact"))
    assert output_rows(spark, spec.output.location) == output_rows(spark, alone.output.location)
    (recorded,) = attempts(spark, spec).collect()
    assert recorded.status == "succeeded" and recorded.backfill_id == f"airflow:{dag.dag_id}:{run.run_id}"

    strict = JOB.format(name="airflow_submitted", rate=1.0, extra="")  # every row matched; l2 is not
    write_job(jobs, "airflow_submitted", strict)
    failed = run_day(DagBag(dag_folder=str(DAG_FILE)).get_dag("streamjoin_airflow_submitted"), DAYS[1])
    tasks = {t.task_id: t for t in failed.get_task_instances()}
    assert failed.state == "failed" and tasks["replay_slice"].state == "failed"
    assert tasks["replay_slice"].try_number == 1  # invalid rows are not submitted again
