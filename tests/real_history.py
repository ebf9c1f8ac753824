"""A production-shaped history for the acceptance tests of backfills over real tables.

An ad platform's click attribution over `DAYS` days that end shortly before now: `impressions`
and `clicks` committed every twelve hours (each commit holding the events of the twelve hours
before it), `campaigns` (a dimension updated in place by a MERGE every night) and `fx_rates` (an
append-only changelog, one commit a day, its rows half an hour older than their commit). Every
table has its change data feed and row tracking on from creation, and is aged as production ages
it while the simulated days pass: OPTIMIZE and VACUUM at Delta's default 168-hour retention each
week, and at the end the log cleaned of entries older than Delta's default 30 days.

VACUUM compares a removed file's removal time with the real clock, so a VACUUM run "on day d" at
the default retention deletes every file removed by then (stricter than production, which keeps
them 168 hours): the weekly maintenance runs after that day's index step, which is all that ever
reads a simulated day's files while they are fresh.

Commits are backdated (tests/aging.py): Delta sees each at its simulated time. Steps that run "on
day d" (the job's index step, as a scheduler would run it) run with Delta's time-travel retention
check off, since Delta compares with the real now: relative to day d, what they read is fresh.

`truth` gives what the attribution job must write, computed from the generator's own records
(each event, each campaign version with its validity, each rate), not from the tables.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aging import (
    ENFORCE_TIME_TRAVEL_RETENTION,
    commit_at,
    session_conf,
    vacuum_default,
    write_commits,
)
from pyspark.sql import SparkSession

from streamjoin.frames import local_frame

DAYS = 33
COMMITS_PER_DAY = 2  # per stream
IMPRESSIONS_PER_COMMIT = 16
CAMPAIGNS_DDL = "campaign string, tier string, updated_at timestamp"
FX_DDL = "currency string, rate double, valid_from timestamp"
DDL = {
    "impressions": "imp_id string, campaign string, currency string, ts timestamp",
    "clicks": "click_id string, imp_id string, ts timestamp",
    "fx_rates": FX_DDL,
}
CAMPAIGNS = ("c0", "c1", "c2", "c3", "c4")
CURRENCIES = ("EUR", "GBP")
TIERS = ("bronze", "silver", "gold")
PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    "delta.enableRowTracking": "true",
    # Delta cleans expired log entries by the real clock, which would drop a simulated day's
    # entries before that day's index step reads them; the log is cleaned once, at the end.
    "delta.enableExpiredLogCleanup": "false",
}


@dataclass
class History:
    """What the generator wrote: the tables' paths, its own records, and the first day."""

    root: str
    day0: datetime  # midnight UTC, naive
    impressions: list[tuple[str, str, str, datetime]] = field(default_factory=list)
    clicks: list[tuple[str, str, datetime]] = field(default_factory=list)
    tiers: dict[str, list[tuple[datetime, str]]] = field(default_factory=dict)  # campaign -> (from, tier)
    rates: dict[str, list[tuple[datetime, float]]] = field(default_factory=dict)  # currency -> (from, rate)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def day(self, d: int, hours: float = 0) -> datetime:
        return self.day0 + timedelta(days=d, hours=hours)


def write(
    spark: SparkSession,
    root: str,
    on_day: Callable[[History, int], None] | None = None,
    on_days: Container[int] = (),
    seed: int = 7,
) -> History:
    """Write the history day by day; `on_day(history, d)` runs at the end of each day d in `on_days`
    (before the weekly OPTIMIZE and VACUUM at 23:45).

    Appends wait until something reads or maintains the tables (a day in `on_days`, the weekly
    maintenance, the end) and are then written one Delta commit each, dated as generated: the same
    commits and times as writing each day's at once, with fewer reloads of each table's state."""
    rng = random.Random(seed)
    day0 = (datetime.now(UTC) - timedelta(days=DAYS + 1)).replace(hour=0, minute=0, second=0, microsecond=0)
    h = History(root, day0.replace(tzinfo=None))
    _create_dimensions(spark, h, rng)
    pending: dict[str, list[tuple[datetime, list]]] = {"impressions": [], "clicks": [], "fx_rates": []}
    clicks_due: list[tuple[str, str, datetime]] = []
    for d in range(DAYS):
        if d:
            _merge_campaigns(spark, h, d, rng)
            pending["fx_rates"].append(_rates(h, d, rng))
        clicks_due = _streams(h, d, rng, clicks_due, pending)
        if d in on_days or d % 7 == 6 or d == DAYS - 1:
            _write_pending(spark, h, pending)
        if on_day is not None and d in on_days:
            with session_conf(spark, {ENFORCE_TIME_TRAVEL_RETENTION: "false"}):
                on_day(h, d)
        if d % 7 == 6:  # the weekly maintenance, after the day's index step
            for name in ("impressions", "clicks", "campaigns", "fx_rates"):
                path = h.path(name)
                commit_at(
                    spark, path, h.day(d, 23.75), lambda path=path: spark.sql(f"OPTIMIZE delta.`{path}`")
                )
                vacuum_default(spark, path)
    return h


def _streams(
    h: History,
    d: int,
    rng: random.Random,
    clicks_due: list[tuple[str, str, datetime]],
    pending: dict[str, list[tuple[datetime, list]]],
) -> list[tuple[str, str, datetime]]:
    """Day d's stream commits, added to `pending`: at 00:05 and 12:05, each holding the impressions
    of the twelve hours before it and the clicks that happened by then; returns the clicks still
    to come."""
    for k in range(COMMITS_PER_DAY):
        window_end = h.day(d, 24 / COMMITS_PER_DAY * k)
        commit_time = window_end + timedelta(minutes=5)
        imps = []
        for _ in range(IMPRESSIONS_PER_COMMIT):
            n = len(h.impressions) + len(imps) + 1
            t = window_end - timedelta(seconds=rng.randrange(24 * 3600 // COMMITS_PER_DAY))
            imps.append((f"i{n}", rng.choice(CAMPAIGNS), rng.choice(CURRENCIES), t))
            roll = rng.random()
            if roll < 0.5:  # a click within the 30 minutes
                clicks_due.append((f"k{n}", f"i{n}", t + timedelta(seconds=rng.randrange(60, 1500))))
            elif roll < 0.6:  # a click too late to count
                clicks_due.append((f"k{n}", f"i{n}", t + timedelta(minutes=rng.randrange(35, 50))))
        due = [c for c in clicks_due if c[2] < window_end]
        clicks_due = [c for c in clicks_due if c[2] >= window_end]
        h.impressions += imps
        h.clicks += due
        pending["impressions"].append((commit_time, imps))
        pending["clicks"].append((commit_time + timedelta(minutes=1), due))
    return clicks_due


def _write_pending(spark: SparkSession, h: History, pending: dict[str, list[tuple[datetime, list]]]) -> None:
    """Write the appends generated so far, one commit each; the streams' first creates their table."""
    for name, commits in pending.items():
        created = Path(h.path(name), "_delta_log").is_dir()
        write_commits(spark, h.path(name), commits, DDL[name], None if created else PROPERTIES)
        commits.clear()


def _create_dimensions(spark: SparkSession, h: History, rng: random.Random) -> None:
    before = h.day0 - timedelta(days=1)
    rows = [(c, rng.choice(TIERS), before) for c in CAMPAIGNS]
    write_commits(
        spark, h.path("campaigns"), [(h.day0 + timedelta(minutes=10), rows)], CAMPAIGNS_DDL, PROPERTIES
    )
    h.tiers = {c: [(before, tier)] for c, tier, _ in rows}
    rates = [(cur, round(rng.uniform(0.8, 1.3), 4), before) for cur in CURRENCIES]
    write_commits(
        spark,
        h.path("fx_rates"),
        [(h.day0 + timedelta(minutes=30), rates)],
        FX_DDL,
        PROPERTIES | {"delta.appendOnly": "true"},
    )
    h.rates = {cur: [(before, rate)] for cur, rate, _ in rates}


def _merge_campaigns(spark: SparkSession, h: History, d: int, rng: random.Random) -> None:
    """The nightly MERGE at 01:00: one or two campaigns change tier, stamped two minutes earlier."""
    stamp = h.day(d, 1) - timedelta(minutes=2)
    changed = [
        (c, rng.choice([t for t in TIERS if t != h.tiers[c][-1][1]]), stamp)
        for c in rng.sample(CAMPAIGNS, rng.randint(1, 2))
    ]
    for c, tier, _ in changed:
        h.tiers[c].append((stamp, tier))
    updates = local_frame(spark, changed, CAMPAIGNS_DDL)  # a local relation: no Python worker to read it
    path = h.path("campaigns")

    def merge() -> None:
        from delta.tables import DeltaTable

        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(updates.alias("u"), "t.campaign = u.campaign")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    commit_at(spark, path, h.day(d, 1), merge)


def _rates(h: History, d: int, rng: random.Random) -> tuple[datetime, list[tuple]]:
    """Day d's commit of the changelog: a rate per currency valid from midnight, committed at 00:30."""
    rows = [(cur, round(rng.uniform(0.8, 1.3), 4), h.day(d)) for cur in CURRENCIES]
    for cur, rate, valid in rows:
        h.rates[cur].append((valid, rate))
    return h.day(d, 0.5), rows


def _as_of(versions: list[tuple[datetime, object]], t: datetime) -> object:
    valid = [value for start, value in versions if start <= t]
    return valid[-1] if valid else None


def truth(h: History, start: datetime, end: datetime) -> dict[tuple, int]:
    """The rows the attribution job writes with output time in [start, end): per impression, one
    row per click 0 to 30 minutes after it (else one padded row), with the campaign's tier and the
    currency's rate valid at the impression's time: (imp_id, click_id, tier, rate) -> count."""
    clicks: dict[str, list[tuple[str, datetime]]] = {}
    for click_id, imp_id, t in h.clicks:
        clicks.setdefault(imp_id, []).append((click_id, t))
    out: dict[tuple, int] = {}
    for imp_id, campaign, currency, t in h.impressions:
        matched = [
            (k, tc) for k, tc in clicks.get(imp_id, []) if timedelta(0) <= tc - t <= timedelta(minutes=30)
        ]
        tier, rate = _as_of(h.tiers[campaign], t), _as_of(h.rates[currency], t)
        for click_id, output_time in matched or [(None, t)]:
            if start <= max(t, output_time) < end:
                row = (imp_id, click_id, tier, rate)
                out[row] = out.get(row, 0) + 1
    return out
