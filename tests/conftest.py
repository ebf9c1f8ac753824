"""One Spark session for the whole test run, and helpers that write real Delta tables commit by commit."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

import pytest

os.environ.setdefault("STREAMJOIN_SHUFFLE_PARTITIONS", "2")


@pytest.fixture(scope="session")
def spark():
    from streamjoin.session import get_spark

    session = get_spark(app_name="streamjoin-tests")
    yield session
    session.stop()


BASE = datetime(2024, 1, 1)


def at(seconds: float) -> datetime:
    """The test clock: BASE plus `seconds`."""
    return BASE + timedelta(seconds=seconds)


def append(spark, path, rows, schema) -> None:
    """One Delta commit holding `rows` (a list of tuples)."""
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(str(path))
