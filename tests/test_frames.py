"""frames.local_frame: the rows Spark's own createDataFrame makes, held as a local relation."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamjoin.frames import local_frame

POSITION = StructType(
    [StructField("ts", LongType()), StructField("src", LongType()), StructField("v", LongType())]
)
SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("n", LongType()),
        StructField("t", TimestampType()),
        StructField("flag", BooleanType()),
        StructField("at", POSITION),
    ]
)
longs = st.none() | st.integers(-(2**62), 2**62)
times = st.none() | st.datetimes(datetime(1971, 1, 1), datetime(2100, 1, 1)).map(
    lambda t: t - timedelta(microseconds=t.microsecond % 7)
)
rows = st.lists(
    st.tuples(
        st.none() | st.text(max_size=5),
        longs,
        times,
        st.none() | st.booleans(),
        st.none() | st.tuples(longs, longs, longs),
    ),
    max_size=6,
)


@settings(max_examples=30, deadline=None)
@given(rows=rows)
def test_rows_read_back_as_createDataFrame_reads_them(spark, rows):
    made = local_frame(spark, rows, SCHEMA)
    assert made.schema == SCHEMA
    assert made.collect() == spark.createDataFrame(rows, SCHEMA).collect()


def test_a_naive_time_is_local_time_as_createDataFrame_takes_it(spark, monkeypatch):
    """On a machine outside UTC too: the same instants, and the same datetimes read back."""
    rows = [
        ("a", 1, datetime(2024, 3, 10, 1, 30), True, None),
        ("b", 2, datetime(2024, 7, 1, 12), None, None),
    ]
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        made, spark_made = local_frame(spark, rows, SCHEMA), spark.createDataFrame(rows, SCHEMA)
        instants = [r[0] for r in made.select(F.unix_micros("t")).collect()]
        assert instants == [r[0] for r in spark_made.select(F.unix_micros("t")).collect()]
        assert instants[0] == int(datetime(2024, 3, 10, 6, 30, tzinfo=UTC).timestamp()) * 1_000_000  # EST
        assert [r.t for r in made.collect()] == [row[2] for row in rows]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_spark_knows_its_size_and_broadcasts_it_into_a_join(spark):
    """Spark knows how small a local relation is and broadcasts it; rows from createDataFrame
    (a pickled RDD) have no known size, so both sides of the join are shuffled and sorted."""
    rows = [("a", 1, None, True, (1, 2, 3))]
    plans = {}
    for made, small in (
        ("local", local_frame(spark, rows, SCHEMA)),
        ("rdd", spark.createDataFrame(rows, SCHEMA)),
    ):
        joined = spark.range(3).withColumnRenamed("id", "n").join(small, "n", "left")
        assert sorted((r.n, r.id) for r in joined.collect()) == [(0, None), (1, "a"), (2, None)]
        plans[made] = joined._jdf.queryExecution().executedPlan().toString()
    assert "BroadcastHashJoin" in plans["local"] and "SortMergeJoin" not in plans["local"]
    assert "SortMergeJoin" in plans["rdd"]


def test_a_schema_given_as_ddl_makes_the_same_frame(spark):
    """As createDataFrame takes it: "name type, ..." (the tests' sources are often given so)."""
    rows = [("a", 1, datetime(2024, 1, 1, 12), True, (1, 2, 3)), (None, None, None, None, None)]
    ddl = "id string, n bigint, t timestamp, flag boolean, at struct<ts: bigint, src: bigint, v: bigint>"
    made = local_frame(spark, rows, ddl)
    assert made.schema == SCHEMA
    assert made.collect() == local_frame(spark, rows, SCHEMA).collect()
