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
