"""The one Spark session factory: Delta enabled from jars fetched at set-up (`jars.py`), UTC, quiet.

Every entry point (CLI, tests, DAG tasks) gets its session here, so that the classpath, the time
zone and the Delta settings are the same wherever a job runs.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys

from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

from streamjoin import jars
from streamjoin.errors import SetupError

PROJECT_ROOT = jars.CHECKOUT  # the folder above the package: the repository, in a checkout
DEFAULT_MASTER = "local[*]"


def running() -> bool:
    """A Spark session is active in this process (asking starts none)."""
    return SparkSession.getActiveSession() is not None


def check_java() -> None:
    """Fail with what to do when Spark's launcher would find no Java ($JAVA_HOME, else `java` on PATH)."""
    home = os.environ.get("JAVA_HOME")
    if (home and os.access(os.path.join(home, "bin", "java"), os.X_OK)) or (
        not home and shutil.which("java")
    ):
        return
    where = f"$JAVA_HOME ({home}) holds no bin/java" if home else "no java on PATH and $JAVA_HOME is not set"
    raise SetupError(
        f"this command runs Spark, which needs Java 17, and {where}: install a JDK 17 and put its java on "
        "PATH or set JAVA_HOME. Commands that read no data run without it: --help, --version, list, "
        "validate-job --structure-only, explain --structure-only"
    )


def submitted_master() -> str | None:
    """The master `spark-submit` gave this driver when it launched this program (an Airflow
    SparkSubmitOperator task, dags/streamjoin_dags.py), else None: its JVM is running already, and
    the session must join its master rather than start a local one."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):  # set by spark-submit for a Python application
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, whose settings SparkConf reads
    return SparkConf().get("spark.master", None)


def check_master_answers(master: str, timeout: float = 5.0) -> None:
    """Fail at once, with what to do, when no master of a spark:// URL accepts a connection.

    Spark itself keeps retrying an unreachable standalone master for about a minute and then
    stops with a Java stack trace; this probe says the same thing in seconds.
    """
    if not master.startswith("spark://"):
        return
    failures = []
    for address in master.removeprefix("spark://").split(","):  # spark://h1:7077,h2:7077 (HA masters)
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            return  # not host:port; Spark rejects the URL itself, naming the form it expects
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            return
        except OSError as exc:
            failures.append(f"{host}:{port}: {exc.strerror or exc}")
    raise SetupError(
        f"Spark master {master} does not answer ({'; '.join(failures)}): start the cluster "
        "(infra/spark-cluster.sh start runs one on this machine) or give the right --master / $STREAMJOIN_MASTER."
    )


def _defaults(master: str, shuffle_partitions: int | None) -> dict[str, str]:
    """The session's settings before the user's own: Delta, UTC, quiet, and small local defaults."""
    local = master.startswith("local")
    if shuffle_partitions is None:
        shuffle_partitions = int(os.environ.get("STREAMJOIN_SHUFFLE_PARTITIONS", 4 if local else 64))
    settings = {
        "spark.jars": ",".join(jars.delta_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": jars.driver_java_options(),
        "spark.executor.extraJavaOptions": jars.JVM_OPTIONS,
        **_object_storage_class_path(),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "true",
        # With DataFrame debugging on, pyspark wraps every `functions` call and Column operator
        # in four or five extra Py4J round trips (to record the Python call site for error
        # messages): a fifth of the time a join takes to build its plan, at every step and
        # micro-batch. streamjoin builds its plans itself, so those call sites would name its own
        # code; a query error still says what failed.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # A long-lived driver (a live runner, a test run, an Airflow worker) keeps the history of
        # every query it ran unless told otherwise; with the UI off nobody reads it.
        "spark.sql.ui.retainedExecutions": "20",
        "spark.ui.retainedJobs": "50",
        "spark.ui.retainedStages": "50",
        "spark.ui.retainedTasks": "2000",
        "spark.sql.streaming.ui.retainedQueries": "10",
        "spark.sql.streaming.numRecentProgressUpdates": "20",
        # Tables created with this session (sources of the demo, the tests and the benchmark)
        # carry their change data feed, monotonic commit times, and each row's commit version
        # (row tracking: what lets a replay read a slice from a snapshot). streamjoin's own
        # outputs and side tables turn row tracking off when they are created (delta_io.OWN_TABLE).
        "spark.databricks.delta.properties.defaults.enableChangeDataFeed": "true",
        "spark.databricks.delta.properties.defaults.enableInCommitTimestamps": "true",
        "spark.databricks.delta.properties.defaults.enableRowTracking": "true",
    }
    if local:
        settings["spark.driver.memory"] = os.environ.get("STREAMJOIN_DRIVER_MEMORY", "4g")
        # Delta rebuilds a table's state (its file list, before every write and after every
        # commit) with this many tasks. Its default of 50 is meant for clusters; on one machine
        # each task is pure latency, and one task reads the log of a table of tens of thousands
        # of files in well under a second.
        settings["spark.databricks.delta.snapshotPartitions"] = os.environ.get(
            "STREAMJOIN_SNAPSHOT_PARTITIONS", "1"
        )
    return settings


def _object_storage_class_path() -> dict[str, str]:
    """The object storage connector (`jars.object_storage_jars`) on the executors' class path, and
    on the driver's through $SPARK_DIST_CLASSPATH, which Spark's launcher appends after its own
    jars: the driver class archive, made without them, still maps (`spark.driver.extraClassPath`
    would come first and void it). Executors on other machines need the jars at the same path."""
    executors, driver_env = jars.connector_class_path()
    os.environ.update(driver_env)
    return executors


def get_spark(
    master: str | None = None,
    app_name: str = "streamjoin",
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Return the active session, or build one with Delta, UTC and small local defaults.

    `master` defaults to $STREAMJOIN_MASTER, then the one spark-submit launched this program with,
    then `local[*]`; a `spark://` URL runs the same jobs
    on a standalone cluster. Spark settings of one's own: $STREAMJOIN_SPARK_CONF
    (`key=value,key=value`), then `extra_conf`, each over the defaults here.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    # Spark's Python workers must run this interpreter, or they miss pandas and pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    submitted = submitted_master()
    master = master or os.environ.get("STREAMJOIN_MASTER") or submitted or DEFAULT_MASTER
    check_master_answers(master)
    settings = {**_defaults(master, shuffle_partitions), **conf_from_env(), **(extra_conf or {})}
    builder = SparkSession.builder.master(master)
    if submitted is None:  # else the name spark-submit gave it (--name) stays
        builder = builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not master.startswith("yarn"):
        drop_yarn_defaults(spark)
    spark.sparkContext.setLogLevel(os.environ.get("STREAMJOIN_LOG_LEVEL", "ERROR"))
    silence_query_context_loggers()
    return spark


_RELOADS_EVERY_CONFIGURATION = "org.apache.hadoop.fs.s3a.S3AFileSystem"


def drop_yarn_defaults(spark: SparkSession) -> None:
    """Remove the `yarn.*` entries from the session's Hadoop configuration.

    Hadoop loads yarn-default.xml into every configuration: 552 of its 1,104 entries, which
    nothing but a YARN client reads. Each task that writes or scans files carries a copy of the
    whole configuration, serialized with a gzip stream per entry and read back, and Parquet's
    writer matches every key against its per-column settings, so the entries cost every Delta
    write and read (a warm three-row append: 0.167 s with them, 0.154 s without; bench/results/suite-history.md).
    A session that runs locally or on a standalone cluster never reads them.

    A class that reloads every configuration when it is first loaded would bring them back: the
    S3A connector's (it registers its deprecated keys), loaded the first time a path names
    `s3a://`. It is loaded first, where set-up fetched it.
    """
    context = spark.sparkContext
    assert context._jvm is not None  # a classic session's driver
    if jars.object_storage_jars():
        context._jvm.java.lang.Class.forName(_RELOADS_EVERY_CONFIGURATION)
    conf = context._jsc.hadoopConfiguration()
    joined = context._jvm.java.lang.String.join("\n", conf.getValByRegex(r"^yarn\.").keySet())
    for key in filter(None, joined.split("\n")):
        conf.unset(key)


def conf_from_env() -> dict[str, str]:
    """$STREAMJOIN_SPARK_CONF as a dict: `key=value` pairs separated by commas. Every process that
    builds a session reads it (the CLI, a live runner, a DAG task), so one setting reaches them all."""
    conf = {}
    for pair in filter(None, (p.strip() for p in os.environ.get("STREAMJOIN_SPARK_CONF", "").split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SetupError(
                f"$STREAMJOIN_SPARK_CONF holds {pair!r}: write each setting as key=value, separated by commas"
            )
        conf[key.strip()] = value.strip()
    return conf


def silence_query_context_loggers() -> None:
    """PySpark logs every analysis error it raises, as a page of JSON with a Java stack trace, on
    loggers of its own (`pyspark.errors.exceptions.base`). The error is raised all the same, and
    streamjoin turns the ones a job can cause into messages that say what to change, so the log
    line only buries that message; it is turned off."""
    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True
