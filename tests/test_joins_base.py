"""The operator interface's counting helpers: counts observed in the pass that writes the rows
(`SliceCounts`), read after it (`Deferred`), and counted apart whenever the observation cannot be
trusted."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from streamjoin.arrival import Slices
from streamjoin.joins.base import Deferred, SliceCounts, counted_pass


def jobs_so_far(spark) -> int:
    return max([-1, *spark.sparkContext.statusTracker().getJobIdsForGroup(None)])


@settings(max_examples=30, deadline=None)
@given(
    times=st.lists(st.integers(min_value=-5, max_value=35), max_size=40),
    bounds=st.lists(st.integers(min_value=0, max_value=30), min_size=2, max_size=12, unique=True),
)
def test_counts_observed_in_the_write_equal_those_counted_apart(spark, tmp_path_factory, times, bounds):
    """Rows counted by slice and condition as a Delta write passes equal the same counts taken by
    an aggregate of their own, and reading them after the write runs no Spark job."""
    slices = Slices(tuple(sorted(bounds)))
    rows = spark.createDataFrame([(t,) for t in times], "t long")
    number = slices.number(F.col("t"))
    made = {"everything": (number, F.lit(True)), "even": (number, F.col("t") % 2 == 0)}
    observed, apart = (
        SliceCounts(rows, len(slices), **made),
        SliceCounts(rows, len(slices), observed=False, **made),
    )
    observed.rows.write.format("delta").mode("overwrite").save(str(tmp_path_factory.mktemp("out")))
    before = jobs_so_far(spark)
    counted = observed.get()
    assert jobs_so_far(spark) == before  # read from the observation, no job of its own
    expected = {
        k: {
            "everything": sum(1 for t in times if bounds_of(slices, k)[0] <= t < bounds_of(slices, k)[1]),
            "even": sum(
                1 for t in times if bounds_of(slices, k)[0] <= t < bounds_of(slices, k)[1] and t % 2 == 0
            ),
        }
        for k in range(len(slices))
    }
    assert counted == expected == apart.get()


def bounds_of(slices: Slices, k: int) -> tuple[int, int]:
    assert slices.bounds is not None
    return slices.bounds[k], slices.bounds[k + 1]


def test_counts_of_more_slices_than_an_observation_carries_are_one_aggregation_by_slice(spark):
    """A backfill's group of 600 slices: counted apart, grouped by slice, each slice found by a
    binary search over the bounds."""
    slices = Slices(tuple(range(0, 1201, 2)))
    rows = spark.range(1200).select(F.col("id").alias("t"))
    number = slices.number(F.col("t"))
    counts = SliceCounts(rows, len(slices), every=(number, F.lit(True)), even=(number, F.col("t") % 2 == 0))
    assert counts.get() == {k: {"every": 2, "even": 1} for k in range(600)}


def test_counts_read_before_any_pass_or_pruned_away_are_counted_apart(spark):
    """Before a pass over the rows ran, or when Spark pruned the observed plan (a filter it proved
    false above it), the counts still come out right: from an aggregate of their own."""
    rows = spark.range(10).withColumn("t", F.col("id"))
    early = SliceCounts(rows, 1, n=(F.lit(0), F.col("t") > 3))
    assert early.get() == {0: {"n": 6}}
    pruned = SliceCounts(rows, 1, n=(F.lit(0), F.col("t") > 3))
    assert pruned.rows.where(F.lit(False)).collect() == []
    assert pruned.get() == {0: {"n": 6}}


def test_the_frame_goes_on_with_its_own_columns(spark):
    """The slice numbers a count needs are not left on the rows that go on."""
    rows = spark.range(3).withColumn("t", F.col("id"))
    counts = SliceCounts(rows, 2, n=(Slices((0, 1, 5)).number(F.col("t")), F.lit(True)))
    assert counts.rows.columns == ["id", "t"]
    assert sorted(r["t"] for r in counts.rows.collect()) == [0, 1, 2]
    assert counts.get() == {0: {"n": 1}, 1: {"n": 2}}


def test_within_a_counted_pass_the_observation_is_used_when_no_stage_ran_twice(spark, tmp_path):
    """In a runner's pass (`counted_pass`), the counts come from the observation after a write
    whose stages each ran once (a shuffle included), and the pass's tag is gone afterwards."""
    with counted_pass(spark):
        rows = spark.range(100).withColumn("k", F.col("id") % 7)
        counts = SliceCounts(rows.groupBy("k").count(), 1, keys=(F.lit(0), F.lit(True)))
        counts.rows.write.format("delta").save(str(tmp_path / "out"))
        before = jobs_so_far(spark)
        assert counts.get() == {0: {"keys": 7}}
        assert jobs_so_far(spark) == before
        # A second count in the same pass, after the first has found the pass's jobs so far clean:
        # its counts still come from its own observation, with no Spark job of their own.
        again = SliceCounts(rows.where(F.col("k") < 3), 1, small=(F.lit(0), F.col("id") < 50))
        again.rows.write.format("delta").mode("append").save(str(tmp_path / "out2"))
        before = jobs_so_far(spark)
        assert again.get() == {0: {"small": 22}}
        assert jobs_so_far(spark) == before
    assert not spark.sparkContext.getJobTags()


def test_deferred_computes_once_when_first_read_and_compares_as_a_list():
    calls = []

    def compute() -> list[int]:
        calls.append(1)
        return [1, 2]

    later = Deferred(compute)
    assert calls == []
    assert later == [1, 2] and list(later) == [1, 2] and later[1] == 2 and len(later) == 2
    assert calls == [1]
