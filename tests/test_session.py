"""The session factory's own settings: $STREAMJOIN_SPARK_CONF, read by every process that builds
a session (pure Python; the settings' effect is every other test's, which run with the suite's)."""

from __future__ import annotations

import pytest

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
    carries it); the file system's own settings stay, and Delta writes and reads as before."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    assert conf.getValByRegex(r"^yarn\.").isEmpty()
    assert conf.get("fs.defaultFS") == "file:///" and conf.get("io.file.buffer.size") is not None
    task_conf = spark._jsparkSession.sessionState().newHadoopConf()  # what a write task is given
    assert task_conf.getValByRegex(r"^yarn\.").isEmpty()
    spark.range(3).write.format("delta").save(str(tmp_path / "t"))
    assert spark.read.format("delta").load(str(tmp_path / "t")).count() == 3


def test_the_driver_remembers_the_jvm_classes_it_found_and_never_a_fields_value(spark):
    """remember_jvm_lookups: a class or package found by name, and a class's static method, are
    asked of the JVM once; a static field's value is asked every time. Counted as Py4J commands."""
    view = spark.sparkContext._jvm
    client = view._gateway_client
    sent = []
    original = client.send_command

    def counting(command, *args, **kwargs):
        sent.append(command)
        return original(command, *args, **kwargs)

    def both() -> None:
        assert view.java.lang.Math.abs(-2) == 2  # a package path and a static method
        assert view.PythonUtils.toSeq([1, 2]).size() == 2  # a name pyspark imported by package

    both()  # found once
    client.send_command = counting
    try:
        for _ in range(3):
            both()
        lookups = [c for c in sent if c.startswith("r\n")]  # Py4J's reflection commands
        static_calls = [c for c in sent if c.startswith("c\nz:")]
        assert len(static_calls) == 6 and not lookups, (lookups, static_calls)
        holder = view.java.lang.Integer
        sent.clear()
        assert [holder.MAX_VALUE for _ in range(2)] == [2**31 - 1] * 2
        assert len(sent) == 2 and "MAX_VALUE" not in holder.__dict__  # a field: asked each time
    finally:
        client.send_command = original
