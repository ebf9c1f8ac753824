"""The benchmark's yardsticks: each query hand-written as a plain PySpark batch query and as DuckDB
SQL over the same Delta snapshots, and the scan-and-write floor.

The hand-written queries give every row as on time (they know nothing of arrival order), so they
equal a streamjoin replay in `complete` mode; `bench/run.py` checks that before it times anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from streamjoin import delta_io

QUERIES = ("q3", "q8", "q20", "bid_tiers")
INPUTS = {
    "q3": ("auctions", "persons"),
    "q8": ("persons", "auctions"),
    "q20": ("bids", "auctions"),
    "bid_tiers": ("bids", "bidder_tiers"),
}


def _window_start(time: str) -> str:
    return f"floor(unix_seconds({time}) / 600)"


def spark_query(name: str, read) -> DataFrame:
    """Query `name` as a PySpark batch query; `read(table)` gives a table's snapshot."""
    if name == "q3":
        a, p = read("auctions").alias("a"), read("persons").alias("p")
        return (
            a.join(p, (F.col("a.seller") == F.col("p.id")) & (F.col("p.date_time") <= F.col("a.date_time")))
            .where((F.col("a.category") == 10) & F.col("p.state").isin("OR", "ID", "CA"))
            .select(
                "p.name",
                "p.city",
                "p.state",
                F.col("a.id").alias("auction_id"),
                "a.date_time",
                F.col("a.date_time").alias("event_time"),
            )
        )
    if name == "q8":
        p, a = read("persons").alias("p"), read("auctions").alias("a")
        return p.join(
            a,
            (F.col("p.id") == F.col("a.seller"))
            & (F.expr(_window_start("p.date_time")) == F.expr(_window_start("a.date_time"))),
        ).select(
            "p.id",
            "p.name",
            F.col("a.id").alias("auction_id"),
            F.expr(f"timestamp_seconds({_window_start('p.date_time')} * 600)").alias("window_start"),
            F.greatest("p.date_time", "a.date_time").alias("event_time"),
        )
    if name == "q20":
        b, a = read("bids").alias("b"), read("auctions").alias("a")
        return (
            b.join(
                a,
                (F.col("b.auction") == F.col("a.id"))
                & F.col("a.date_time").between(
                    F.col("b.date_time") - F.expr("INTERVAL 2 HOURS"), F.col("b.date_time")
                ),
            )
            .where(F.col("a.category") == 10)
            .select(
                "b.auction",
                "b.bidder",
                "b.price",
                "b.channel",
                "b.url",
                F.col("b.date_time").alias("bid_time"),
                "a.item_name",
                "a.description",
                "a.initial_bid",
                "a.reserve",
                F.col("a.date_time").alias("auction_time"),
                "a.expires",
                "a.seller",
                "a.category",
                F.greatest("b.date_time", "a.date_time").alias("event_time"),
            )
        )
    if name == "bid_tiers":
        b, t = read("bids").alias("b"), read("bidder_tiers").alias("t")
        candidates = b.join(
            t,
            (F.col("b.bidder") == F.col("t.person_id")) & (F.col("t.valid_from") <= F.col("b.date_time")),
            "left",
        )
        newest = Window.partitionBy("b.bid_id").orderBy(F.col("t.valid_from").desc())
        return (
            candidates.withColumn("_n", F.row_number().over(newest))
            .where(F.col("_n") == 1)
            .select(
                "b.bid_id",
                "b.bidder",
                "b.price",
                "t.tier",
                "b.date_time",
                F.col("b.date_time").alias("event_time"),
            )
        )
    raise ValueError(f"unknown query {name!r}; one of {', '.join(QUERIES)}")


def run_spark(spark: SparkSession, name: str, root: str, versions: dict[str, int], out: str) -> None:
    """Run the PySpark query over the snapshots at `versions` and write it to Delta at `out`."""
    result = spark_query(
        name, lambda table: delta_io.read_snapshot(spark, f"{root}/{table}", versions[table])
    )
    result.write.format("delta").mode("overwrite").save(out)


def run_floor(
    spark: SparkSession,
    name: str,
    root: str,
    versions: dict[str, int],
    sizes: dict[str, int],
    rows_out: int,
    out: str,
) -> None:
    """Scan every input of `name` (`sizes`: their row counts, known beforehand) and write about
    `rows_out` rows of the largest one: the cost of reading and writing with no join at all."""
    frames = {t: delta_io.read_snapshot(spark, f"{root}/{t}", versions[t]) for t in INPUTS[name]}
    largest = max(INPUTS[name], key=sizes.get)
    for table, frame in frames.items():
        if table != largest:
            frame.write.format("noop").mode("overwrite").save()
    share = F.pmod(F.xxhash64(*frames[largest].columns), F.lit(sizes[largest])) < F.lit(rows_out)
    frames[largest].where(share).write.format("delta").mode("overwrite").save(out)


DUCKDB_SQL = {
    "q3": """
        SELECT p.name, p.city, p.state, a.id AS auction_id, a.date_time, a.date_time AS event_time
        FROM auctions a JOIN persons p ON a.seller = p.id AND p.date_time <= a.date_time
        WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')""",
    "q8": """
        SELECT p.id, p.name, a.id AS auction_id, time_bucket(INTERVAL 10 MINUTES, p.date_time) AS window_start,
               greatest(p.date_time, a.date_time) AS event_time
        FROM persons p JOIN auctions a ON p.id = a.seller
         AND time_bucket(INTERVAL 10 MINUTES, p.date_time) = time_bucket(INTERVAL 10 MINUTES, a.date_time)""",
    "q20": """
        SELECT b.auction, b.bidder, b.price, b.channel, b.url, b.date_time AS bid_time, a.item_name, a.description,
               a.initial_bid, a.reserve, a.date_time AS auction_time, a.expires, a.seller, a.category,
               greatest(b.date_time, a.date_time) AS event_time
        FROM bids b JOIN auctions a ON b.auction = a.id
         AND a.date_time BETWEEN b.date_time - INTERVAL 2 HOURS AND b.date_time
        WHERE a.category = 10""",
    "bid_tiers": """
        SELECT b.bid_id, b.bidder, b.price, t.tier, b.date_time, b.date_time AS event_time
        FROM bids b ASOF LEFT JOIN bidder_tiers t ON b.bidder = t.person_id AND t.valid_from <= b.date_time""",
}


def run_duckdb(name: str, root: str, versions: dict[str, int], out: str, threads: int) -> None:
    """Run the query in DuckDB over the Delta snapshots' Parquet files (listed by delta-rs) and
    write the result as Parquet to `out`."""
    import duckdb
    from deltalake import DeltaTable

    connection = duckdb.connect()
    connection.execute(f"SET threads = {threads}")
    connection.execute("SET TimeZone = 'UTC'")
    for table in INPUTS[name]:
        files = DeltaTable(f"{root}/{table}", version=versions[table]).file_uris()
        listed = ", ".join(f"'{f.removeprefix('file://')}'" for f in files)
        connection.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{listed}])")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    if os.path.exists(out):
        os.remove(out)
    connection.execute(f"COPY ({DUCKDB_SQL[name]}) TO '{out}' (FORMAT parquet)")
    connection.close()
