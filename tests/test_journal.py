"""Table sources served weeks later, on tables aged the way production ages them.

Two dimensions, 27 days old: `campaigns`, updated in place by a MERGE every fourth day (and a
DELETE), and `rates`, an append-only changelog with a commit every fourth day; both with the change
data feed and row tracking on, compacted (OPTIMIZE) twice as the days pass, and vacuumed at Delta's
default 168-hour retention (tests/aging.py). The job's journal is extended every fourth day from
the job's start, 23 days back, as a scheduled index step would (more often than the retention).

Delta's time-travel check compares a version's commit time with the real clock: to extend the
journal "on day d", the check is switched off for that call only. VACUUM runs once, today: what
weekly VACUUMs would have deleted by day d (files removed, and change files written, more than 7
days before d) is none of what the journal reads that day (the commits of the last 4 days), and
today's VACUUM deletes all of it. Every read the tests assert runs with the check on, as a
backfill today would.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from aging import ENFORCE_TIME_TRAVEL_RETENTION, commit_at, session_conf, vacuum_default, write_commits
from pyspark.sql import functions as F

from streamjoin import changelog, delta_io, journal
from streamjoin.arrival import REJECT, TS, V
from streamjoin.changelog import DELETED
from streamjoin.errors import HistoryNotRetainedError
from streamjoin.frames import local_frame
from streamjoin.index import Entry
from streamjoin.plan import bind
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict
from streamjoin.timeutil import to_micros

NOW = datetime.now(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None)
DAYS = 27  # of history
STEP = 4  # days between the commits of each table, and between the index step's runs
START_DAY = -23  # the job's start, beyond the 7-day file retention
PROPERTIES = {"delta.enableChangeDataFeed": "true", "delta.enableRowTracking": "true"}
CAMPAIGNS = "id string, tier string, budget int"
RATES = "ccy string, t timestamp, rate double"
IMPS = "id string, t timestamp, cid string, ccy string"


def day(n: int, hour: int = 0) -> datetime:
    return NOW + timedelta(days=n, hours=hour)


def micros(when: datetime) -> int:
    return to_micros(when.replace(tzinfo=UTC))


class History:
    """The generator's own truth: per table, each version's commit time and changes."""

    def __init__(self) -> None:
        self.times: dict[str, dict[int, datetime]] = {"campaigns": {}, "rates": {}}
        # campaigns: (version, change_type, row); rates: (version, row)
        self.campaign_changes: list[tuple[int, str, tuple]] = []
        self.campaign_state: dict[int, dict[str, tuple]] = {}
        self.rate_rows: list[tuple[int, tuple]] = []
        self.version_on: dict[str, dict[int, int]] = {"campaigns": {}, "rates": {}}
        self.impressions: list[tuple] = []

    def campaigns_at(self, version: int) -> dict[str, tuple]:
        return self.campaign_state[max(v for v in self.campaign_state if v <= version)]


def job(root: str, campaigns: str, rates: str, impressions: str, output: str = "out"):
    return spec_from_dict(
        {
            "name": "attribution",
            "start_at": (day(START_DAY, 3).isoformat() + "Z"),
            "sources": {
                "imps": {"path": impressions, "time": "t"},
                "campaigns": {"path": campaigns, "kind": "table", "key": ["id"]},
                "rates": {"path": rates, "kind": "table", "key": ["ccy"], "time": "t", "changelog": True},
            },
            "from": "imps",
            "joins": [
                {"join": "campaigns", "type": "left", "on": "imps.cid = campaigns.id", "as_of": "event_time"},
                {"join": "rates", "type": "left", "on": "imps.ccy = rates.ccy", "as_of": "event_time"},
            ],
            "select": ["imps.id AS iid", "campaigns.tier AS tier", "rates.rate AS rate"],
            "output": {"path": f"{root}/{output}"},
        }
    )


@pytest.fixture(scope="module")
def aged(spark, tmp_path_factory):
    """The two aged dimensions (and a small stream), the truth, and the job whose journal was
    extended daily from its start."""
    root = str(tmp_path_factory.mktemp("journal"))
    paths = {name: f"{root}/{name}" for name in ("campaigns", "rates", "imps")}
    truth = History()
    state: dict[str, tuple] = {}

    def merge(n: int, rows: list[tuple]) -> None:
        (version,) = commit_at(
            spark,
            paths["campaigns"],
            day(n, 2),
            lambda: delta_io.upsert(local_frame(spark, rows, CAMPAIGNS), paths["campaigns"], ("id",)),
        )
        for row in rows:
            truth.campaign_changes.append((version, "update_postimage" if row[0] in state else "insert", row))
            state[row[0]] = row
        truth.times["campaigns"][version] = day(n, 2)
        truth.campaign_state[version] = dict(state)
        truth.version_on["campaigns"][n] = version

    def delete(n: int, key: str) -> None:
        (version,) = commit_at(
            spark,
            paths["campaigns"],
            day(n, 3),
            lambda: spark.sql(f"DELETE FROM delta.`{paths['campaigns']}` WHERE id = '{key}'"),
        )
        truth.campaign_changes.append((version, "delete", state.pop(key)))
        truth.times["campaigns"][version] = day(n, 3)
        truth.campaign_state[version] = dict(state)
        truth.version_on["campaigns"][n] = version

    def rates_on(n: int) -> None:
        rows = [("EUR", day(n, 0), 1.0 + n / 100), (("GBP", "JPY")[(n // STEP) % 2], day(n, 0), 2.0 + n / 50)]
        (version,) = write_commits(
            spark, paths["rates"], [(day(n, 1), rows)], RATES, PROPERTIES if n == -DAYS else None
        )
        truth.rate_rows += [(version, row) for row in rows]
        truth.times["rates"][version] = day(n, 1)
        truth.version_on["rates"][n] = version

    first = [(f"c{i}", "gold" if i % 2 else "silver", 100 * i) for i in range(4)]
    (v0,) = write_commits(spark, paths["campaigns"], [(day(-DAYS, 2), first)], CAMPAIGNS, PROPERTIES)
    state.update({row[0]: row for row in first})
    truth.campaign_changes += [(v0, "insert", row) for row in first]
    truth.times["campaigns"][v0] = day(-DAYS, 2)
    truth.campaign_state[v0] = dict(state)
    truth.version_on["campaigns"][-DAYS] = v0
    rates_on(-DAYS)
    write_commits(
        spark,
        paths["imps"],
        [(day(-DAYS, 4), [("i0", day(-DAYS, 4), "c1", "EUR")])],
        IMPS,
        PROPERTIES,  # a stream source served weeks back needs row tracking too
    )
    plan = bind(spark, job(root, paths["campaigns"], paths["rates"], paths["imps"]))
    starts, where = {}, journal.location(plan)
    for n in range(-DAYS + STEP, 0, STEP):
        rates_on(n)
        impression = (f"i{n}", day(n, 4), f"c{(n // 3) % 5}", ("EUR", "GBP", "JPY")[n % 3])
        write_commits(spark, paths["imps"], [(day(n, 4), [impression])], IMPS)
        truth.impressions.append(impression)
        merge(
            n,
            [
                (f"c{n % 5}", ("gold", "silver", "bronze")[n % 3], 10 * (n + DAYS)),
                (f"d{(n + 2) % 7}", "new", n),
            ],
        )
        if n == -15:  # a campaign ends
            delete(n, "c3" if "c3" in state else sorted(state)[0])
        if n in (-19, -7):  # the owners' compaction
            for name in ("campaigns", "rates"):
                commit_at(
                    spark,
                    paths[name],
                    day(n, 5),
                    lambda name=name: spark.sql(f"OPTIMIZE delta.`{paths[name]}`"),
                )
        if n == START_DAY:
            starts = {
                name: Entry(
                    name,
                    truth.version_on[name][n],
                    micros(truth.times[name][truth.version_on[name][n]]),
                    start=True,
                )
                for name in ("campaigns", "rates")
            }
        if n >= START_DAY:  # the scheduled index step, on day n
            targets = {name: delta_io.latest_version(spark, paths[name]) for name in ("campaigns", "rates")}
            with session_conf(spark, {ENFORCE_TIME_TRAVEL_RETENTION: "false"}):
                journal.update(spark, plan, starts, targets)
    for name in ("campaigns", "rates"):
        vacuum_default(spark, paths[name])
    return {"root": root, "paths": paths, "truth": truth, "plan": plan, "starts": starts, "journal": where}


def source_of(plan, name):
    return next(s for s in plan.sources if s.name == name)


def served(frame, columns):
    """The tagged changes as a multiset of (columns..., version, commit time, tombstone)."""
    assert frame.where(F.col(REJECT).isNotNull()).count() == 0
    rows = frame.select(*columns, V, TS, DELETED).collect()
    return Counter(tuple(r) for r in rows)


def test_a_changelog_with_row_tracking_is_served_from_its_newest_snapshot_weeks_back(spark, aged):
    truth, plan = aged["truth"], aged["plan"]
    rates = source_of(plan, "rates")
    start = truth.version_on["rates"][START_DAY]
    start_time = truth.times["rates"][start].replace(tzinfo=UTC)
    with pytest.raises(
        Exception, match="DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION"
    ):
        delta_io.read_snapshot(spark, rates.spec.location, start).count()  # what Delta alone refuses
    assert journal.served_by_rows(spark, rates, start)
    assert journal.coverage(spark, aged["journal"])["rates"].copied is False  # only its commit times
    assert journal.read(spark, aged["journal"], rates, start, start) is None
    upto = truth.version_on["rates"][-11]
    got = served(changelog.read(spark, rates, upto, start, start_time), ["ccy", "t", "rate"])
    expected = Counter(
        (*row, max(v, start), micros(truth.times["rates"][max(v, start)]), False)
        for v, row in truth.rate_rows
        if v <= upto
    )
    assert got == expected
    history = sum(1 for v, _ in truth.rate_rows if v <= start)
    assert 0 < history < sum(1 for v, _ in truth.rate_rows if v <= upto)  # history and later changes


def campaign_truth(truth: History, start: int, upto: int) -> Counter:
    history = [
        (*row, start, micros(truth.times["campaigns"][start]), False)
        for row in truth.campaigns_at(start).values()
    ]
    later = [
        (*row, v, micros(truth.times["campaigns"][v]), kind == "delete")
        for v, kind, row in truth.campaign_changes
        if start < v <= upto
    ]
    return Counter(history + later)


def test_b_a_table_updated_in_place_is_served_from_the_journal_after_delta_forgot_it(spark, aged):
    truth, plan, where = aged["truth"], aged["plan"], aged["journal"]
    campaigns = source_of(plan, "campaigns")
    start = truth.version_on["campaigns"][START_DAY]
    start_time = truth.times["campaigns"][start].replace(tzinfo=UTC)
    columns = ["id", "tier", "budget"]
    for upto_day in (START_DAY, -15, -11):  # versions older than the 7-day retention
        upto = truth.version_on["campaigns"][upto_day]
        with pytest.raises(HistoryNotRetainedError):
            delta_io.read_changes(spark, campaigns.spec.location, upto, upto).count()
        got = served(changelog.read(spark, campaigns, upto, start, start_time, where), columns)
        assert got == campaign_truth(truth, start, upto)
    newest = delta_io.latest_version(spark, campaigns.spec.location)
    got = served(changelog.read(spark, campaigns, newest, start, start_time, where), columns)
    assert got == campaign_truth(truth, start, newest)
    assert any(kind == "delete" for _, kind, _ in truth.campaign_changes)


def test_b_the_journal_serves_versions_appended_twice_once(spark, aged):
    """Two writers that extend the journal at once both append the versions they read; the second
    append (here: the same versions again, another write id) changes nothing a reader sees."""
    truth, plan = aged["truth"], aged["plan"]
    campaigns = source_of(plan, "campaigns")
    where = f"{aged['root']}/copy_journal"
    spark.read.format("delta").load(aged["journal"]).write.format("delta").save(where)
    start, upto = truth.version_on["campaigns"][START_DAY], truth.version_on["campaigns"][-11]
    again = (
        spark.read.format("delta")
        .load(where)
        .where((F.col("source") == "campaigns") & (F.col("version") > start) & (F.col("version") <= upto))
    )
    again.withColumn(journal.WRITE, F.lit("zzz-a-second-writer")).write.format("delta").mode("append").save(
        where
    )
    got = served(
        changelog.read(
            spark, campaigns, upto, start, truth.times["campaigns"][start].replace(tzinfo=UTC), where
        ),
        ["id", "tier", "budget"],
    )
    assert got == campaign_truth(truth, start, upto)


def test_c_a_start_older_than_retention_without_a_journal_is_refused_naming_the_source(spark, aged):
    truth, paths = aged["truth"], aged["paths"]
    plan = bind(spark, job(aged["root"], paths["campaigns"], paths["rates"], paths["imps"], output="fresh"))
    starts = {
        name: Entry(name, truth.version_on[name][START_DAY], micros(day(START_DAY)), start=True)
        for name in ("campaigns", "rates")
    }
    targets = {name: delta_io.latest_version(spark, paths[name]) for name in ("campaigns", "rates")}
    with pytest.raises(HistoryNotRetainedError) as refused:
        journal.update(spark, plan, starts, targets)
    message = str(refused.value)
    assert "'campaigns'" in message and "'rates'" not in message
    assert "streamjoin index JOB" in message and "start the job later" in message.lower()
    assert not delta_io.exists(spark, journal.location(plan))  # refused before anything was written
    with pytest.raises(HistoryNotRetainedError, match="'campaigns'"):
        campaigns = source_of(plan, "campaigns")
        changelog.read(
            spark,
            campaigns,
            targets["campaigns"],
            starts["campaigns"].version,
            day(START_DAY).replace(tzinfo=UTC),
        ).count()


def test_a_backfill_today_enriches_from_both_aged_tables_as_of_each_impression(spark, aged):
    """One replay of the chain job over the aged tables, through the arrival index (whose step
    extends the journal to today): every impression after the start gets the campaign tier and the
    rate valid at its time, from versions Delta no longer serves."""
    truth, paths = aged["truth"], aged["paths"]
    spec = job(aged["root"], paths["campaigns"], paths["rates"], paths["imps"])
    replay(spark, spec, day(START_DAY + 1), day(0), RunOptions(closed=True))
    got = Counter(
        tuple(r)
        for r in spark.read.format("delta").load(spec.output.location).select("iid", "tier", "rate").collect()
    )

    def tier_at(t: datetime, cid: str) -> str | None:
        version = max(v for v, when in truth.times["campaigns"].items() if when <= t)
        row = truth.campaign_state[version].get(cid)
        return None if row is None else row[1]

    expected = Counter()
    for iid, t, cid, ccy in truth.impressions:
        if not day(START_DAY + 1) <= t < day(0):
            continue
        rates = [row for _, row in truth.rate_rows if row[0] == ccy and row[1] <= t]
        expected[(iid, tier_at(t, cid), max(rates, key=lambda r: r[1])[2] if rates else None)] += 1
    assert got == expected
    assert sum(1 for _, tier, rate in expected if tier is not None and rate is not None) >= 3
