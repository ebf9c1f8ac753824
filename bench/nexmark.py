"""A Nexmark-like workload on Delta: persons, auctions, bids and bidder tiers, in many commits.

Event time advances at a fixed rate: up to 16x, `scale` multiplies the history's length (hours of
events and commits), not the rate, so 16x is sixteen times as many hours at the same rows per
hour; beyond, the history stays 64 hours long and the rates grow (84x: 5.25 times as many rows per
hour). So every commit holds one hour of arrival at every scale, as a job fed hourly would see it:
commits of several hours against a grace of one hour would make most rows late. Each row
arrives some time after its event (exponential delay), a fraction of rows arrives hours late, and a
table's rows are committed hour of arrival by hour of arrival, the four tables interleaved.

Everything is computed by Spark from row numbers with hash-based pseudo-random columns, so a
given (scale, seed) always writes the same rows.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

START = datetime(2024, 6, 1)  # event time of the first row (UTC)
CATEGORIES = 5  # auctions fall in categories 10..14; the queries keep category 10
AUCTION_HOURS = 2  # an auction runs this long; bids come while it runs
ARRIVAL = "_arrival_hour"  # which commit carries the row (hours since START)
MAX_HOURS = 64  # the longest history `Workload.at` writes (16x); larger scales raise the rates
STATES = ["OR", "ID", "CA", "WA", "NY", "TX", "AZ", "NV"]


@dataclass(frozen=True)
class Workload:
    """Rows per hour of event time and how they arrive; `hours` at scale 1."""

    hours: int = 4
    persons_per_hour: int = 400
    auctions_per_hour: int = 1_500
    bids_per_hour: int = 15_000
    tier_changes_per_hour: int = 300
    mean_delay_s: float = 120.0  # typical arrival delay after the event
    late_fraction: float = 0.01  # rows that arrive 2 to 4 hours after their event
    seed: int = 42

    def at(self, scale: float) -> Workload:
        """`scale` times as many rows: the same rates over `scale` times as many hours, up to
        `MAX_HOURS`; beyond, that many hours at higher rates (writing thousands of hourly commits
        would take most of an hour here)."""
        hours = max(1, round(self.hours * scale))
        if hours <= MAX_HOURS:
            return replace(self, hours=hours)
        rate = hours / MAX_HOURS
        return replace(
            self,
            hours=MAX_HOURS,
            persons_per_hour=round(self.persons_per_hour * rate),
            auctions_per_hour=round(self.auctions_per_hour * rate),
            bids_per_hour=round(self.bids_per_hour * rate),
            tier_changes_per_hour=round(self.tier_changes_per_hour * rate),
        )

    def rows(self) -> dict[str, int]:
        return {
            "persons": self.hours * self.persons_per_hour,
            "auctions": self.hours * self.auctions_per_hour,
            "bids": self.hours * self.bids_per_hour,
            "bidder_tiers": self.hours * self.tier_changes_per_hour,
        }


def _uniform(seed: int, salt: str) -> Column:
    """A pseudo-random number in [0, 1) from the row id."""
    return F.pmod(F.xxhash64(F.col("id"), F.lit(seed), F.lit(salt)), F.lit(1_000_003)) / F.lit(1_000_003.0)


def _event_time(count: int, hours: int) -> Column:
    """Row i of `count` happens at START + i * (hours / count): a fixed rate."""
    step = hours * 3600.0 / count
    return F.timestamp_seconds(F.lit(START.timestamp()) + F.col("id") * F.lit(step))


def _arrival_hour(w: Workload, salt: str, time: str) -> Column:
    """The hour (since START) in which a row is committed: its event, plus a delay; some rows late."""
    delay = -F.log(F.lit(1.0) - _uniform(w.seed, salt + "d")) * F.lit(w.mean_delay_s)
    late = F.when(
        _uniform(w.seed, salt + "l") < F.lit(w.late_fraction),
        F.lit(7200.0) + _uniform(w.seed, salt + "x") * 7200.0,
    )
    arrives = F.unix_timestamp(time) + F.coalesce(late, delay) - F.lit(START.timestamp())
    return F.floor(arrives / F.lit(3600)).cast("int")


def tables(spark: SparkSession, w: Workload) -> dict[str, DataFrame]:
    """The four tables, each with an `_arrival_hour` column saying which commit carries the row."""
    n = w.rows()
    persons = spark.range(n["persons"]).select(
        F.col("id"),
        F.concat(F.lit("person "), F.col("id").cast("string")).alias("name"),
        F.concat(F.lit("p"), F.col("id").cast("string"), F.lit("@example.com")).alias("email_address"),
        F.concat(F.lit("city "), (F.col("id") % 97).cast("string")).alias("city"),
        F.element_at(
            F.array(*[F.lit(s) for s in STATES]),
            (F.floor(_uniform(w.seed, "ps") * len(STATES)) + 1).cast("int"),
        ).alias("state"),
        _event_time(n["persons"], w.hours).alias("date_time"),
    )
    # Sellers are persons who joined in the last ~30 minutes.
    recent_persons = max(1, w.persons_per_hour // 2)
    auction_time = _event_time(n["auctions"], w.hours)
    newest_person = F.floor(F.col("id") * F.lit(n["persons"] / n["auctions"]))
    auctions = spark.range(n["auctions"]).select(
        F.col("id"),
        F.concat(F.lit("item "), F.col("id").cast("string")).alias("item_name"),
        F.lit("a Nexmark auction").alias("description"),
        (F.floor(_uniform(w.seed, "ib") * 1000) + 1).cast("long").alias("initial_bid"),
        (F.floor(_uniform(w.seed, "rs") * 2000) + 1000).cast("long").alias("reserve"),
        auction_time.alias("date_time"),
        (auction_time + F.expr(f"INTERVAL {AUCTION_HOURS} HOURS")).alias("expires"),
        F.greatest(F.lit(0), newest_person - F.floor(_uniform(w.seed, "sl") * recent_persons))
        .cast("long")
        .alias("seller"),
        (F.floor(_uniform(w.seed, "ct") * CATEGORIES) + 10).cast("int").alias("category"),
    )
    # Bids go to auctions opened in the last ~20 minutes (all still running), by recent persons.
    recent_auctions = max(1, w.auctions_per_hour // 3)
    newest_auction = F.floor(F.col("id") * F.lit(n["auctions"] / n["bids"]))
    newest_bidder = F.floor(F.col("id") * F.lit(n["persons"] / n["bids"]))
    bids = spark.range(n["bids"]).select(
        F.col("id").alias("bid_id"),
        F.greatest(F.lit(0), newest_auction - F.floor(_uniform(w.seed, "ba") * recent_auctions))
        .cast("long")
        .alias("auction"),
        F.greatest(F.lit(0), newest_bidder - F.floor(_uniform(w.seed, "bb") * w.persons_per_hour))
        .cast("long")
        .alias("bidder"),
        (F.floor(_uniform(w.seed, "bp") * 10_000) + 1).cast("long").alias("price"),
        F.element_at(
            F.array(*[F.lit(c) for c in ("apple", "google", "facebook", "baidu")]),
            (F.floor(_uniform(w.seed, "bc") * 4) + 1).cast("int"),
        ).alias("channel"),
        F.concat(F.lit("https://example.com/bid/"), F.col("id").cast("string")).alias("url"),
        _event_time(n["bids"], w.hours).alias("date_time"),
        F.col("id"),
    )
    # Tier changes of existing persons: a versioned table (changelog form), valid from its time.
    newest_tiered = F.floor(F.col("id") * F.lit(n["persons"] / n["bidder_tiers"]))
    tiers = spark.range(n["bidder_tiers"]).select(
        F.greatest(F.lit(0), newest_tiered - F.floor(_uniform(w.seed, "tp") * w.persons_per_hour))
        .cast("long")
        .alias("person_id"),
        F.element_at(
            F.array(*[F.lit(t) for t in ("bronze", "silver", "gold")]),
            (F.floor(_uniform(w.seed, "tt") * 3) + 1).cast("int"),
        ).alias("tier"),
        _event_time(n["bidder_tiers"], w.hours).alias("valid_from"),
        F.col("id"),
    )
    frames = {"persons": persons, "auctions": auctions, "bids": bids, "bidder_tiers": tiers}
    times = {
        "persons": "date_time",
        "auctions": "date_time",
        "bids": "date_time",
        "bidder_tiers": "valid_from",
    }
    return {
        name: frame.withColumn(ARRIVAL, _arrival_hour(w, name, times[name])).drop(
            *(["id"] if name in ("bids", "bidder_tiers") else [])
        )
        for name, frame in frames.items()
    }


def end_of_events(w: Workload) -> datetime:
    """Every event happens before this instant; only the end-of-stream rows lie beyond it."""
    return START + timedelta(hours=w.hours)


def _end_of_stream(spark: SparkSession, frame: DataFrame, w: Workload) -> DataFrame:
    """One row per table a day after the last event, with keys (-1) and a category (0) that match
    nothing the queries keep: like a heartbeat, it moves every source's watermark past all events,
    so that every row of the workload is decided by the end of the history."""
    at = end_of_events(w) + timedelta(days=1)
    values = {
        "id": -1,
        "seller": -1,
        "auction": -1,
        "bidder": -1,
        "bid_id": -1,
        "person_id": -1,
        "category": 0,
    }
    return spark.range(1).select(
        *[
            (
                F.lit(at)
                if field.name in ("date_time", "valid_from", "expires")
                else F.lit(values.get(field.name))
            )
            .cast(field.dataType)
            .alias(field.name)
            for field in frame.schema.fields
        ]
    )


def write(spark: SparkSession, root: str, w: Workload) -> dict[str, int]:
    """Write the workload under `root` (replacing it) as one commit per table per arrival hour,
    the tables interleaved, then one end-of-stream commit per table;
    returns the commits per table."""
    shutil.rmtree(root, ignore_errors=True)
    frames = {name: frame.persist() for name, frame in tables(spark, w).items()}
    last = max(frame.agg(F.max(ARRIVAL)).first()[0] for frame in frames.values())
    commits = dict.fromkeys(frames, 0)
    for hour in range(last + 1):
        for name, frame in frames.items():
            rows = frame.where(F.col(ARRIVAL) == hour).drop(ARRIVAL)
            if hour == 0 or not rows.isEmpty():  # hour 0 creates every table, empty or not
                rows.coalesce(1).write.format("delta").mode("append").save(f"{root}/{name}")
                commits[name] += 1
    for name, frame in frames.items():
        _end_of_stream(spark, frame.drop(ARRIVAL), w).write.format("delta").mode("append").save(
            f"{root}/{name}"
        )
        commits[name] += 1
    for frame in frames.values():
        frame.unpersist()
    return commits
