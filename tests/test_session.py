"""The session factory's own settings: $STREAMJOIN_SPARK_CONF, read by every process that builds
a session (pure Python; the settings' effect is every other test's, which run with the suite's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from streamjoin import jars
from streamjoin.errors import SetupError
from streamjoin.session import conf_from_env


def test_spark_conf_from_the_environment_is_read_as_key_value_pairs(monkeypatch):
    monkeypatch.setenv("STREAMJOIN_SPARK_CONF", " spark.a=1 ,spark.b = x=y,, ")
    assert conf_from_env() == {"spark.a": "1", "spark.b": "x=y"}
    monkeypatch.delenv("STREAMJOIN_SPARK_CONF")
    assert conf_from_env() == {}


def test_a_setting_without_a_value_is_refused_with_its_text(monkeypatch):
    monkeypatch.setenv("STREAMJOIN_SPARK_CONF", "spark.a=1,spark.cores.max")
    with pytest.raises(SetupError, match=r"'spark.cores.max': write each setting as key=value"):
        conf_from_env()


def test_the_session_carries_no_yarn_defaults_and_keeps_the_rest(spark, tmp_path):
    """get_spark drops yarn-default.xml's entries from the Hadoop configuration (every file task
    carries it); the file system's own settings stay, and Delta writes and reads as before. Loading
    the S3A connector (the first `s3a://` path does) reloads every configuration; the entries stay
    out after it too."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    assert conf.getValByRegex(r"^yarn\.").isEmpty()
    spark.sparkContext._jvm.java.lang.Class.forName("org.apache.hadoop.fs.s3a.S3AFileSystem")
    assert conf.getValByRegex(r"^yarn\.").isEmpty()
    assert conf.get("fs.defaultFS") == "file:///" and conf.get("io.file.buffer.size") is not None
    task_conf = spark._jsparkSession.sessionState().newHadoopConf()  # what a write task is given
    assert task_conf.getValByRegex(r"^yarn\.").isEmpty()
    spark.range(3).write.format("delta").save(str(tmp_path / "t"))
    assert spark.read.format("delta").load(str(tmp_path / "t")).count() == 3


def test_a_driver_spark_submit_starts_with_the_submit_settings_reaches_object_storage(tmp_path):
    """A driver spark-submit starts (an Airflow task through Spark's provider, or by hand) with
    `jars.submit_settings()` finds the S3A connector set-up fetched, as a driver the session
    launches does: without it on the driver's class path, every `s3a://` path fails there."""
    app = tmp_path / "app.py"
    app.write_text(
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.master('local[1]').getOrCreate()\n"
        "jvm, conf = spark.sparkContext._jvm, spark.sparkContext._jsc.hadoopConfiguration()\n"
        "print('s3a:', jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass('s3a', conf).getName())\n"
        "spark.stop()\n"
    )
    delta, conf, env = jars.submit_settings()
    assert jars.object_storage_jars(), "set-up fetched no object storage connector (infra/setup.sh)"
    command = [str(Path(sys.executable).with_name("spark-submit")), "--jars", ",".join(delta)]
    for key, value in {**conf, "spark.ui.enabled": "false"}.items():
        command += ["--conf", f"{key}={value}"]
    home = {"SPARK_HOME": str(Path(pyspark.__file__).parent)}  # pyspark's own, as a worker's PATH finds it
    done = subprocess.run(
        [*command, str(app)], env={**os.environ, **home, **env}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "s3a: org.apache.hadoop.fs.s3a.S3AFileSystem" in done.stdout
