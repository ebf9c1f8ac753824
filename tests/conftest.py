"""One Spark session for the whole test run, and helpers that write real Delta tables commit by commit."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta

import pytest

from streamjoin import jars
from streamjoin.frames import local_frame

# A pytest-xdist worker runs with a __main__ that has neither a spec nor a file, which
# pyspark.sql.connect (imported by Great Expectations) takes for its own doctest run and answers
# with sys.exit(0). Give the worker's __main__ a file: one that exists and does nothing, since a
# process started with multiprocessing's spawn runs its parent's main file first.
_main = sys.modules["__main__"]
if getattr(_main, "__spec__", None) is None and not hasattr(_main, "__file__"):
    _main.__file__ = os.path.join(os.path.dirname(__file__), "xdist_worker_main.py")

os.environ.setdefault("STREAMJOIN_SHUFFLE_PARTITIONS", "2")
# Each test worker (make test runs two) has one driver for the files it is dealt, which touch
# hundreds of Delta tables: 4 GB filled its old generation by the middle of a one-worker run.
os.environ.setdefault("STREAMJOIN_DRIVER_MEMORY", "6g")
# The tests' tables hold tens of rows, where compiling each query's Java code (whole-stage and
# expression code generation) costs more than running it: interpreted, a replay of the fixed
# example takes 5.2 s instead of 8.0 s (bench/results/suite-history.md). And Hadoop's local file system keeps a
# `.crc` checksum beside every file it writes, setting each file's permissions and resolving
# each rename by starting a `chmod` or `readlink` process (about 15 per Delta commit, 1,000 in
# a minute of tests): the raw local file system writes the same files without them, and a replay
# of the fixed example takes 5.8 s instead of 6.9 s. Adaptive execution runs each shuffle stage of
# a query as a job of its own and re-plans the rest after it: on tens of rows that costs more than
# any plan it could pick (four kernel-level tests took 39 s without it, 50 s with it;
# bench/results/suite-history.md). The product keeps it for real sizes. Every hash aggregate and sort of a task
# takes a memory page of its own, 64 MB with a 6 GB driver, and every broadcast (each stage's task
# is one) a first 4 MB chunk, whatever they hold: over a 3-minute file that was 13 GB of pages and
# 10 GB of chunks of the 107 GB the JVM allocated, and 14 full collections. With 1 MB pages and
# 256 kB chunks: 6 full collections, GC pauses 3.9 s instead of 11 s (bench/results/suite-history.md). Delta's
# data skipping plans and runs a query over a table's file statistics before each filtered scan
# (`PrepareDeltaScan`): on tables of a few files it skips nothing and took 1.4 s of a 6 s replay;
# without it, `test_backfill.py` and `test_interval_seeds.py` took 217 and 220 s against 234 and
# 275 s (bench/results/suite-history.md). Tables the tests create have no row tracking unless a test asks for
# it (the aged tables, the demo's, the fixed example's replays): Delta 4.4 takes a row-tracked
# table's row-ID high-water mark from the snapshot's computed state, a Spark job that rebuilds the
# table's state before every commit: an append costs 0.43 to 0.47 s instead of 0.15 to 0.20 s.
# Their replays read the change feed, as for a user's table without row tracking; the other read
# is checked wherever row tracking is on (bench/results/suite-history.md). And they write a checkpoint every 100
# commits, not every 10: one-row appends 0.11 s instead of 0.17 s (a checkpoint rebuilds and
# writes the table's state); the aged tables get theirs where their clean-up needs them
# (tests/aging.py). And where Hadoop renames a file through its FileContext API (Delta's commit
# files, its checksums, a streaming query's checkpoint), it asks for the link status of both
# names, which on the raw local file system starts a `readlink` process each time: 25 processes
# per one-row append. Delta's local log store and Spark's file-system checkpoint manager rename
# with the FileSystem API (File.renameTo, after the same check that the name is free), 9 processes
# per append, and 40 appends took 5.3 and 5.5 s instead of 6.2 and 6.7 s (bench/results/suite-history.md). That
# log store makes a commit exclusive within one JVM only (its check and rename are two steps),
# which the tests allow: each of their tables has one writing process at a time. The product keeps
# the defaults, made for storage that several processes and machines share. Processes the tests
# start inherit these.
os.environ.setdefault(
    "STREAMJOIN_SPARK_CONF",
    ",".join(
        (
            "spark.sql.adaptive.enabled=false",
            "spark.sql.codegen.wholeStage=false",
            "spark.sql.codegen.factoryMode=NO_CODEGEN",
            "spark.hadoop.fs.file.impl=org.apache.hadoop.fs.RawLocalFileSystem",
            "spark.hadoop.fs.AbstractFileSystem.file.impl=org.apache.hadoop.fs.local.RawLocalFs",
            "spark.buffer.pageSize=1m",
            "spark.broadcast.blockSize=256k",
            "spark.databricks.delta.stats.skipping=false",
            "spark.databricks.delta.properties.defaults.enableRowTracking=false",
            "spark.databricks.delta.properties.defaults.checkpointInterval=100",
            "spark.delta.logStore.file.impl=io.delta.storage.LocalLogStore",
            "spark.sql.streaming.checkpointFileManagerClass="
            "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
        )
    ),
)

# Every JVM of the tests collects with the parallel collector rather than G1: pauses do not matter
# here, and over a long run G1's concurrent marking and barriers cost CPU. Five seed and chain
# files in one process: 659 CPU-s in the JVM instead of 832, GC 67 instead of 151; the whole
# suite 4,956 worker-seconds instead of 5,673 (bench/results/suite-history.md). And the JIT compilers inline
# less: Spark's driver code is too varied for deep inlining to pay over tens of rows, and the C2
# compiler, a quarter of a worker's CPU, compiles each method in less time. Two processes side by
# side (six files): 589 CPU-s instead of 679, 243 and 355 s instead of 292 and 393 (bench/results/suite-history.md).
# One's own setting is left alone. Decided once, by the first process to load this file: pytest-xdist
# workers inherit its environment, the options already set, and must still know they are the tests'
# own (until 2026-11-30 they took them for one's own, and the processes they started ran without
# SHORT_LIVED_JVM below).
_OWN_JAVA_OPTIONS = "STREAMJOIN_TESTS_SET_JAVA_OPTIONS"
os.environ.setdefault(_OWN_JAVA_OPTIONS, "0" if "STREAMJOIN_JAVA_OPTIONS" in os.environ else "1")
TESTS_SET_JAVA_OPTIONS = os.environ[_OWN_JAVA_OPTIONS] == "1"
if TESTS_SET_JAVA_OPTIONS:
    os.environ["STREAMJOIN_JAVA_OPTIONS"] = (
        "-XX:+UseParallelGC -XX:MaxInlineLevel=6 -XX:FreqInlineSize=100 -XX:InlineSmallCode=1000"
    )


# The test files that take longest (worker-seconds in the clean-clone run of the session of stop 86,
# bench/results/suite-history.md), slowest first. `make test` deals whole files to two workers in
# collection order (--no-loadscope-reorder), so these go out first and the short files fill in at
# the end; dealt alphabetically, a long file drawn last kept one worker busy minutes after the
# other had stopped.
SLOWEST_FIRST = (
    "test_real_history",  # 270: 45 days of history, two backfills
    "test_cli",  # 209: the demo
    "test_dags",  # 198: a cluster and a spark-submit through Airflow's Spark provider
    "test_aged_tables",  # 163
    "test_bench",  # 147
    "test_chains",  # 131
    "test_restart",  # 119: ten SIGKILLs, each a new JVM started one ahead of its turn
    "test_enrichment_seeds",  # 109
    "test_enrichment_equivalence",  # about 85
    "test_kernel_interval_chain",  # 81
    "test_handoff",  # 78
    "test_cluster",  # 74
    "test_interval_seeds",  # 74
    "test_equivalence",  # 70
    "test_backfill",  # 68
    "test_lookup_seeds",  # 66
    "test_report",  # 66
    "test_object_storage",  # 63: an S3 server and S3A's first use
    "test_setup",  # 63
    "test_validation",  # 54
    "test_live",  # 53
    "test_kernel_enrichment",  # 50
    "test_table_table",  # 49
    "test_rows_seeds",  # 45
    "test_delta_io",  # 42
    "test_lateral_seeds",  # 41
    "test_window_seeds",  # 40
    "test_kernel_chain",  # 39
    "test_job_start",  # 38
    "test_verify",  # 35
    "test_journal",  # 27
    "test_joins_base",  # 26
    "test_kernel_rows",  # 24
    "test_kernel_start",  # 24
    "test_spec",  # 22
    "test_schema_drift",  # 22
    "test_faults",  # 20
    "test_kernel_lookup",  # 20
)


def pytest_collection_modifyitems(items) -> None:
    """Order the collected tests slowest file first (SLOWEST_FIRST), the rest as collected."""
    rank = {name: place for place, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.fixture(scope="module", autouse=True)
def forget_between_modules():
    """After each test file: drop cached DataFrames and the table snapshots Delta keeps per path,
    so that what one file touched does not stay in the driver's heap for the rest of the run."""
    yield
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.catalog.clearCache()
        session.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


# A JVM that lives for seconds (a live runner killed at random, a CLI command, a fresh clone's
# smoke run, a cluster's executor for one small replay) compiles with C1 only, which costs a cold
# driver 40% less CPU; the workers' own long-lived drivers keep both compilers, as C1 alone made
# them slower (bench/results/suite-history.md).
SHORT_LIVED_JVM = jars.C1_ONLY


@pytest.fixture(scope="session")
def spark():
    from streamjoin.session import get_spark

    session = get_spark(app_name="streamjoin-tests")
    # The processes the tests start after it live for seconds (SHORT_LIVED_JVM).
    if TESTS_SET_JAVA_OPTIONS:
        os.environ["STREAMJOIN_JAVA_OPTIONS"] += f" {SHORT_LIVED_JVM}"
    yield session
    _say_cpu_seconds(session)
    session.stop()


_CPU_SECONDS: list[str] = []


def _say_cpu_seconds(session) -> None:
    """Keep the CPU seconds this test process's driver JVM and its Python spent, for the run's
    summary: what a change to the tests or the product costs, which load does not distort the way
    it does wall time. Processes the tests started are not counted."""
    pid = session.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getPid()
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:  # utime and stime: fields 14 and 15
        ticks = stat.read().rsplit(")", 1)[1].split()[11:13]
    jvm = sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK")
    python = sum(os.times()[:2])
    _CPU_SECONDS.append(f"CPU seconds of the test process: JVM {jvm:.1f}, Python {python:.1f}")


def pytest_terminal_summary(terminalreporter) -> None:
    """Say `_say_cpu_seconds`' numbers after the run (a process of its own, not an xdist worker's)."""
    for line in _CPU_SECONDS:
        terminalreporter.write_line(line)


BASE = datetime(2024, 1, 1)


def at(seconds: float) -> datetime:
    """The test clock: BASE plus `seconds`."""
    return BASE + timedelta(seconds=seconds)


def append(spark, path, rows, schema) -> None:
    """One Delta commit holding `rows` (a list of tuples), in one file (`write_commits`)."""
    local_frame(spark, rows, schema).coalesce(1).write.format("delta").mode("append").save(str(path))


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Debian's chromium, headless, with its console log kept. Its temporary folders (chromium
    leaves one behind at every start) go to pytest's temporary folder, not /tmp."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail(
            f"{CHROMIUM} or {CHROMEDRIVER} is missing: run `bash infra/setup.sh` (installs chromium and chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    scratch = {"TMPDIR": str(tmp_path_factory.mktemp("chromium"))}
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, env={**os.environ, **scratch}), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A Spark standalone master and worker on loopback (tests/spark_cluster.py), one per test
    process: the files that run on one (test_cluster.py, test_dags.py) share it when dealt to the
    same worker, each telling its own applications by name."""
    from spark_cluster import running_cluster

    with running_cluster(tmp_path_factory.mktemp("spark-cluster")) as started:
        yield started
