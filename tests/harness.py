"""Spark-side helpers shared by the equivalence and restart tests: two event streams written commit
by commit to real Delta tables, the job that joins them, and the outputs read back as multisets.

Event times are whole seconds after conftest.BASE; the reference (tests/reference.py) works on the
same seconds and on the arrival positions read back from each table's change data feed.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta

from conftest import BASE, at
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType
from reference import Event

from streamjoin import delta_io
from streamjoin.frames import local_frame
from streamjoin.joins.interval import IntervalLink, TimeBounds
from streamjoin.joins.rows import RowsLink
from streamjoin.joins.window import WindowLink, Windows
from streamjoin.links import Link
from streamjoin.metrics import BUCKETS
from streamjoin.spec import JoinSpec, Output, Source, spec_from_dict

SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("k", StringType()),
        StructField("t", TimestampType()),
        StructField("v", IntegerType()),
    ]
)
SIDES = ("l", "r")
EVERYTHING = (BASE - timedelta(days=1), datetime(2100, 1, 1))  # a slice holding every row, NULL times too


# The fixed example of the end-to-end tests: a FULL join BETWEEN -2s AND 5s with 3s grace, where
# later commits bring joins, padded rows on both sides, late rows and rejected rows (NULL key, NULL
# time), and commits of two files that one-file micro-batches cut in two. Parts of the input, each a
# list of commits (side, rows (id, key, seconds, v), files). Generated cases are decided at the
# kernel's level (tests/test_kernel_interval.py); these tests check the wiring around it.
FIXED_HOW, FIXED_LO, FIXED_HI, FIXED_GRACE = "full", -2, 5, 3
FIXED_PARTS = [
    [
        (0, [("l1", "a", 0, 0), ("l2", "b", 1, 0), ("l3", None, 2, 0)], 2),
        (1, [("r1", "a", 2, 0), ("r2", "b", 9, 0)], 2),
    ],
    [
        (0, [("l4", "a", 10, 0), ("l5", "c", 11, 0)], 2),
        (1, [("r3", "a", 1, 0), ("r4", "a", 12, 0), ("r5", "c", None, 0)], 2),
        (0, [("l6", "b", 20, 0), ("l7", "a", 13, 0), ("l8", None, 14, 0)], 2),
        (1, [("r6", "b", 22, 0), ("r7", "a", 5, 0), ("r8", "a", 30, 0)], 2),
        (0, [("l9", "a", 31, 0), ("l10", "c", 3, 0)], 1),
    ],
    [
        (1, [("r9", "c", 40, 0)], 1),
        (0, [("l11", "a", 41, 0), ("l12", "a", 39, 0)], 2),
    ],
]


def create_tables(spark, root, row_tracking: bool = False) -> dict[int, str]:
    """Both source tables, empty (version 0 holds no rows), change data feed on; row tracking
    only when asked (the tests' session default is off: tests/conftest.py)."""
    paths = {}
    for side, name in enumerate(SIDES):
        paths[side] = f"{root}/{name}"
        writer = local_frame(spark, [], SCHEMA).write.format("delta")
        writer.option("delta.enableRowTracking", str(row_tracking).lower()).save(paths[side])
    return paths


def write_commit(spark, path: str, rows, files: int | None = None) -> None:
    """One Delta commit of rows (id, key, seconds | None, v), in one file unless `files` splits it
    into that many."""
    data = [(i, k, None if t is None else at(t), v) for i, k, t, v in rows]
    if files:  # the rows split in order into `files` parts, a file each
        frame = spark.createDataFrame(spark.sparkContext.parallelize(data, files), SCHEMA)
    else:
        frame = local_frame(spark, data, SCHEMA).coalesce(1)
    frame.write.format("delta").mode("append").save(path)


def job(
    root,
    paths: dict[int, str],
    how: str,
    lo: int,
    hi: int,
    grace: int,
    residual: bool = False,
    output: str = "out",
    emit: str = "final",
    window: tuple[int, int] | None = None,
    rows: dict[str, int] | None = None,
) -> JoinSpec:
    """l JOIN r ON l.k = r.k [AND l.v <> r.v] BETWEEN lo AND hi seconds, projected to ids (a CROSS
    join: no condition); `window` (hop, size in seconds): in time windows instead of the bounds;
    `rows` (source -> count): in ROWS windows instead."""
    on = None if how == "cross" else "l.k = r.k" + (" AND l.v <> r.v" if residual else "")
    return JoinSpec(
        name="eq",
        sources=(
            Source("l", "stream", path=paths[0], time="t"),
            Source("r", "stream", path=paths[1], time="t"),
        ),
        start="l",
        joins=(_link(how, on, lo, hi, grace, emit, window, rows),),
        output=Output(path=f"{root}/{output}"),
        select=("l.id AS lid", "r.id AS rid"),
    )


def _link(how, on, lo, hi, grace, emit, window, rows) -> Link:
    """The link `job` describes: in ROWS windows, in time windows, else within bounds."""
    if rows:
        return RowsLink("r", type=how, on=on, rows=tuple(rows.items()))
    if window:
        windows = Windows(timedelta(seconds=window[0]), timedelta(seconds=window[1]))
        return WindowLink("r", type=how, on=on, window=windows, grace=timedelta(seconds=grace))
    bounds = TimeBounds(timedelta(seconds=lo), timedelta(seconds=hi))
    return IntervalLink("r", type=how, on=on, bounds=bounds, grace=timedelta(seconds=grace), emit=emit)


def with_output(spec: JoinSpec, path: str) -> JoinSpec:
    return replace(spec, output=replace(spec.output, path=path))


def enrichment_job(root, paths: dict[int, str], how: str, table: dict, join: dict) -> JoinSpec:
    """Stream l (side 0) enriched from table r (side 1; its settings `table`), join settings `join`."""
    return spec_from_dict(
        {
            "name": "enrich",
            "sources": {
                "l": {"path": paths[0], "time": "t"},
                "r": {"path": paths[1], "kind": "table", **table},
            },
            "from": "l",
            "joins": [{"join": "r", "type": how, **join}],
            "select": ["l.id AS lid", "r.id AS rid"],
            "output": {"path": f"{root}/out"},
        }
    )


# BASE in Spark's UTC microseconds as the tests' frames store it: createDataFrame (the tables
# conftest writes) and streamjoin.frames.local_frame (the kernel harness) both read a naive
# datetime in the machine's time zone, as Python's own `timestamp()` does.
BASE_MICROS = int(BASE.timestamp()) * 1_000_000


def positions(spark, path: str, side: int) -> dict[int, tuple[int, int, int]]:
    """Each commit version with rows -> its arrival position (commit timestamp micros, side, version)."""
    changes = (
        spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(path)
    )
    rows = (
        changes.select("_commit_version", F.unix_micros("_commit_timestamp").alias("ts")).distinct().collect()
    )
    return {r["_commit_version"]: (r["ts"], side, r["_commit_version"]) for r in rows}


def events(spark, paths: dict[int, str], commits) -> list[Event]:
    """The reference's events for `commits` [(side, version, rows)], positioned from the change feed."""
    found = {side: positions(spark, paths[side], side) for side in paths}
    return [
        Event(side, i, k, t, found[side][version], v)
        for side, version, rows in commits
        for i, k, t, v in rows
    ]


def read_output(spark, path: str) -> Counter:
    """The output table as a multiset of (left id, right id, output time in seconds after BASE)."""
    if not delta_io.exists(spark, path):
        return Counter()  # no batch wrote a row
    base = BASE_MICROS
    frame = spark.read.format("delta").load(path)
    rows = frame.select("lid", "rid", F.unix_micros("event_time").alias("t")).collect()
    result = Counter()
    for r in rows:
        assert (r["t"] - base) % 1_000_000 == 0, r
        result[(r["lid"], r["rid"], (r["t"] - base) // 1_000_000)] += 1
    return result


def read_side(spark, path: str) -> Counter:
    """A late or rejected side table as a multiset of (source, reason, row as JSON)."""
    if not delta_io.exists(spark, path):
        return Counter()
    return Counter(
        tuple(r) for r in spark.read.format("delta").load(path).select("source", "reason", "row").collect()
    )


def live_metrics(spark, spec: JoinSpec) -> list:
    """The live run's metrics rows, by batch."""
    rows = spark.read.format("delta").load(spec.output.side("metrics")).collect()
    return sorted(rows, key=lambda r: r["batch"])


def by_source(row) -> dict[str, dict[str, int]]:
    return json.loads(row["by_source"])


# ---------------------------------------------------------------------------- runs and their accounting

FINAL = ("rows_in", "rejected", "late", "joined", "unmatched_emitted", "unmatched_dropped")
ACCOUNTED = FINAL + ("open", "unsettled")


class FailOnce:
    """A live runner's after_write hook (streamjoin.runners.hooks) that raises once, right after `table` is written by a batch >= 1."""

    def __init__(self, table: str):
        self.table, self.fired = table, None

    def __call__(self, table: str, batch: int) -> None:
        if self.fired is None and table == self.table and batch >= 1:
            self.fired = batch
            raise RuntimeError(f"injected failure after writing {table} in batch {batch}")


# The order in which a micro-batch of stream sources writes its tables (runners/live.py): the
# output's pass first, then its late and rejected rows, its state, its metrics row.
WRITES = ("output", "late", "rejected", "state", "metrics")


class FailAfterEach:
    """An after_write hook that fails `batch` once right after each of `writes` (the tables it
    writes, in `WRITES`' order), in turn: the first attempt dies after its first write, the rerun
    (which Delta lets skip that write) after the second, and so on, until the last attempt
    completes the batch."""

    def __init__(self, batch: int, writes: tuple[str, ...] = WRITES):
        self.batch, self.writes = batch, writes
        self.fired: list[tuple[str, int]] = []

    def __call__(self, table: str, batch: int) -> None:
        writes = self.writes
        if batch == self.batch and len(self.fired) < len(writes) and table == writes[len(self.fired)]:
            self.fired.append((table, batch))
            raise RuntimeError(f"injected failure after writing {table} in batch {batch}")


def concurrently(calls: dict) -> dict:
    """Run independent jobs (zero-argument callables, by name) at once and return their results.

    Jobs here are small, so their time goes to driver-side latency that overlaps well even on
    two cores; each writes its own tables.
    """
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
        return {name: future.result() for name, future in futures.items()}


def run_live(runners) -> None:
    """One available-now run of every runner, concurrently (each is its own streaming query)."""
    concurrently({i: (lambda r=r: r.run(900)) for i, r in enumerate(runners)})


def read(spark, location: str):
    return spark.read.format("delta").load(location).collect()


def source_counts(metrics) -> dict[str, dict[str, int]]:
    """A replay's accounting per source, in the buckets that must add up."""
    return {name: {b: getattr(c, b) for b in ACCOUNTED} for name, c in metrics.sources.items()}


def live_accounting(
    spark, output: str, final: tuple[str, ...] = FINAL
) -> tuple[dict[str, dict[str, int]], int]:
    """Check every live micro-batch's metrics balance and chain; return the run's accounting.

    Per batch and per source: rows_in + carried_in = rejected + late + joined + unmatched_emitted
    + unmatched_dropped + open + unsettled, and a batch carries in exactly what the one before
    left open or unsettled. The accounting of the whole run is the sum of the final buckets over
    the batches plus what the last batch left open or unsettled.
    """
    rows = sorted(read(spark, f"{output}_metrics"), key=lambda r: r.batch)
    totals: dict[str, Counter] = {}
    previous = None
    for row in rows:
        assert row.runner == "live"
        assert row.rows_in + row.carried_in == sum(row[b] for b in BUCKETS), row
        by_source = json.loads(row.by_source)
        for name, c in by_source.items():
            assert c["rows_in"] + c["carried_in"] == sum(c[b] for b in BUCKETS), (row.batch, name, c)
            carried = 0 if previous is None else previous[name]["open"] + previous[name]["unsettled"]
            assert c["carried_in"] == carried, (row.batch, name, c)
            totals.setdefault(name, Counter()).update({b: c[b] for b in final})
        previous = by_source
    accounting = {
        name: {
            **{b: t[b] for b in final},
            "open": previous[name]["open"],
            "unsettled": previous[name]["unsettled"],
        }
        for name, t in totals.items()
    }
    return accounting, len(rows)


# ---------------------------------------------------------------------------- table sources


def upsert(spark, path: str, rows, schema, key: tuple[str, ...]) -> None:
    """One MERGE commit: insert or update `rows` by `key` (a table updated in place); creates the table."""
    delta_io.upsert(local_frame(spark, rows, schema), path, key)


def delete(spark, path: str, condition: str) -> None:
    """One DELETE commit on a table updated in place."""
    DeltaTable.forPath(spark, path).delete(condition)
