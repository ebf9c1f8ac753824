"""Lookup joins end to end: a real PostgreSQL on loopback, Delta streams, both runners, the journal.

Flink's lookup join (004): orders enriched with the customers of a JDBC table, `ON o.customer_id
= c.id`, each order with the customer as the database holds it when the order is processed. The
database changes between the live runs; the live output shows each order's answer of its time,
and every replay after it writes the same rows from the journal, however the database changed
since. A replay of commits no run has processed asks the database as it is, and says so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from aging import age_table, write_commits
from conftest import append, at
from harness import FailAfterEach, live_accounting, read, source_counts
from postgres import server
from pyspark.sql.types import IntegerType, StructField, StructType, TimestampType
from seed_sql import FLINK_LOOKUP, FLINK_LOOKUP_SOURCES

from streamjoin.errors import JobError
from streamjoin.jobfile import load_job
from streamjoin.plan import bind, describe
from streamjoin.report import build_report
from streamjoin.runners.hooks import after_write
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict
from streamjoin.verify import verify

ORDERS = StructType(
    [
        StructField("order_id", IntegerType()),
        StructField("customer_id", IntegerType()),
        StructField("total", IntegerType()),
        StructField("t", TimestampType()),
    ]
)
# (order_id, customer_id, total, seconds), one commit per list; the database changes before the second.
FIRST = [(101, 1, 10, 10), (102, 3, 20, 20)]
SECOND = [(103, 1, 30, 30), (104, 3, 40, 40), (105, None, 50, 50)]
CUSTOMERS = """
CREATE TABLE customers (id int PRIMARY KEY, name text, country text, zip text);
INSERT INTO customers VALUES (1, 'Ann', 'DE', '10115'), (2, 'Bob', 'FR', '75001');
"""
MOVED = """
UPDATE customers SET country = 'AT', zip = '1010' WHERE id = 1;
INSERT INTO customers VALUES (3, 'Cem', 'FR', '69001');
"""


@pytest.fixture(scope="module")
def database():
    with server() as running:
        yield running


def job(root, name: str, url: str, how: str = "inner", on: str = "orders.customer_id = c.id"):
    return spec_from_dict(
        {
            "name": name,
            "sources": {"orders": {"path": str(root / "orders"), "time": "t"}},
            "from": "orders",
            "joins": [{"lookup": {"url": url, "table": "customers"}, "as": "c", "on": on, "type": how}],
            "select": ["orders.order_id", "c.country", "c.zip"],
            "output": {"path": str(root / f"out_{name}")},
        }
    )


def write(spark, root, rows) -> None:
    append(spark, root / "orders", [(o, c, v, at(s)) for o, c, v, s in rows], ORDERS)


def rows_of(spark, spec) -> Counter:
    return Counter((r.order_id, r.country, r.zip) for r in read(spark, spec.output.location))


def test_a_batch_killed_between_its_writes_records_each_answer_once(spark, tmp_path, database):
    """The journal is one of a live batch's exactly-once writes, the first: a batch that dies right
    after it, then after its output, run again each time while the database has moved on, records
    each answer once and writes each row once, with the answers it recorded."""
    database.sql(f"DROP TABLE IF EXISTS customers; {CUSTOMERS}")
    spec = job(tmp_path, "killed", database.url, "left")
    write(spark, tmp_path, FIRST)
    writes = ("lookups", "output")
    with after_write(FailAfterEach(batch=0, writes=writes)):
        for table in writes:
            with pytest.raises(Exception, match=f"injected failure after writing {table}"):
                LiveRunner(spark, spec, str(tmp_path / "checkpoint")).run(900)
            database.sql(f"DROP TABLE customers; {CUSTOMERS} {MOVED}")  # no answer of the batch's time
        LiveRunner(spark, spec, str(tmp_path / "checkpoint")).run(900)
    assert rows_of(spark, spec) == Counter({(101, "DE", "10115"): 1, (102, None, None): 1})
    journal = read(spark, spec.output.side("lookups"))
    assert sorted((r.version, r.key) for r in journal) == [(0, '{"id":1}'), (0, '{"id":3}')]
    assert len(read(spark, spec.output.side("metrics"))) == 1


def test_each_row_sees_the_database_of_its_time_and_replays_see_the_same(spark, tmp_path, database):
    """LEFT, so that an order whose customer is missing is padded; INNER's decisions over a changing
    database, live and replayed, are test_kernel_lookup.py's."""
    database.sql(f"DROP TABLE IF EXISTS customers; {CUSTOMERS}")
    live = job(tmp_path, "live", database.url, "left")
    write(spark, tmp_path, FIRST)
    runner = LiveRunner(spark, live, str(tmp_path / "checkpoint"))
    runner.run(900)
    database.sql(MOVED)
    write(spark, tmp_path, SECOND)
    runner.run(900)
    expected = Counter(  # 102: customer 3 not yet there, padded; 105's NULL key: rejected
        {(101, "DE", "10115"): 1, (102, None, None): 1, (103, "AT", "1010"): 1, (104, "FR", "69001"): 1}
    )
    assert rows_of(spark, live) == expected
    accounting, batches = live_accounting(spark, live.output.location)
    balance = {"rows_in": 5, "rejected": 1, "late": 0, "joined": 3, "unmatched_emitted": 1,
               "unmatched_dropped": 0, "open": 0, "unsettled": 0}  # fmt: skip
    assert accounting == {"orders": balance}
    looked_up = [r.lookups for r in read(spark, f"{live.output.location}_metrics")]
    assert sorted(looked_up) == [2, 2]  # (commit, key) answers: customers 1 and 3, in each commit
    journal = read(spark, f"{live.output.location}_lookups")
    assert len(journal) == 4 and {r.looked_up_by for r in journal} == {"live"}

    database.sql("DELETE FROM customers; INSERT INTO customers VALUES (1, 'Ann', 'SE', '111 20')")
    checked = verify(spark, live, at(0), at(3600), every="1h", checkpoint=str(tmp_path / "checkpoint"))
    assert checked.equal, checked  # `streamjoin verify` replays from the live run's journal too
    metrics = replay(spark, live, at(0), at(3600), RunOptions(mode="exact"))
    assert rows_of(spark, live) == expected  # the journal's answers, not today's database
    assert source_counts(metrics) == {"orders": balance}
    assert metrics.totals.get("lookups", 0) == 0
    closed = database.url.replace(str(database.port), str(database.port + 1))
    down = job(tmp_path, "live", closed, "left")  # the database down; the same output, so the same journal
    assert source_counts(replay(spark, down, at(0), at(3600), RunOptions(mode="exact"))) == {
        "orders": balance
    }
    assert rows_of(spark, down) == expected  # from the journal alone: no connection needed
    with pytest.raises(
        JobError, match=r"lookup join 'c'.*cannot read customers .*check that the database is up"
    ):
        LiveRunner(
            spark, down, str(tmp_path / "checkpoint")
        )  # live asks for every new commit: refused at once

    fresh = job(tmp_path, "fresh", database.url, "left")  # no run of it processed these commits
    metrics = replay(spark, fresh, at(0), at(3600), RunOptions(mode="exact"))
    today = Counter(
        {(101, "SE", "111 20"): 1, (102, None, None): 1, (103, "SE", "111 20"): 1, (104, None, None): 1}
    )
    assert rows_of(spark, fresh) == today
    assert metrics.totals["lookups"] == 4
    assert "looked up in the database (not yet in the journal) 4" in metrics.summary()
    page = build_report(spark, fresh).read_text()  # the slice's accounting, and what it asked
    assert "<th>looked up (not in the journal)</th>" in page and "data-field='lookups'>4<" in page
    assert (
        replay(spark, fresh, at(0), at(3600), RunOptions(mode="exact")).totals.get("lookups", 0) == 0
    )  # now from its journal
    assert rows_of(spark, fresh) == today
    for how, spec in (("left", live), ("inner", job(tmp_path, "inner", database.url, "inner"))):
        text = describe(bind(spark, spec))
        assert (
            f"1. {how.upper()} JOIN customers at jdbc:postgresql://127.0.0.1:{database.port}/postgres AS c("
            in text
        )
    write(spark, tmp_path, [(106, 2, 60, 60)])  # a commit no run has asked about yet
    down = job(
        tmp_path, "fresh", closed, "left"
    )  # no live run writes it: nothing refuses the replay but the database
    with pytest.raises(
        JobError, match=r"1 key\(s\) of commits the journal .*_lookups does not hold yet.*database is up"
    ):
        replay(spark, down, at(0), at(3600), RunOptions(mode="exact"))


def test_a_lookup_job_on_a_forty_day_old_table_before_and_after_its_aging(spark, tmp_path, database):
    """Orders committed from 40 days back (row tracking, default retention), a job starting 4 days
    ago: the live run records its answers; then the database changes and the table is OPTIMIZEd,
    VACUUMed and its log cut to 5 days; a replay of everything writes the live rows again, from
    the journal (rows keep their commit versions through OPTIMIZE), asking the database nothing."""
    database.sql(f"DROP TABLE IF EXISTS customers; {CUSTOMERS}")
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None)
    days = [-40, -30, -20, -5, -4.5, -3, -2, -1]
    commits = [
        (
            now + timedelta(days=d),
            [(n * 10 + i, i % 4, n, now + timedelta(days=d, minutes=-i)) for i in range(3)],
        )
        for n, d in enumerate(days)
    ]
    path = str(tmp_path / "orders")
    write_commits(
        spark, path, commits, "order_id int, customer_id int, total int, t timestamp",
        {"delta.enableRowTracking": "true", "delta.enableChangeDataFeed": "true"},
    )  # fmt: skip
    spec = replace(
        job(tmp_path, "aged", database.url, "left"), start_at=(now - timedelta(days=4)).isoformat() + "Z"
    )
    LiveRunner(spark, spec, str(tmp_path / "checkpoint")).run()
    live = rows_of(spark, spec)
    answers = {0: (None, None), 1: ("DE", "10115"), 2: ("FR", "75001")}  # customer 0 is in no table
    assert live == Counter({(n * 10 + i, *answers[i]): 1 for n in range(len(days)) for i in range(3)})
    database.sql(MOVED)
    age_table(spark, path, log_retention="interval 5 days")
    metrics = replay(spark, spec, now - timedelta(days=60), now + timedelta(days=1), RunOptions(mode="exact"))
    assert rows_of(spark, spec) == live
    assert metrics.totals.get("lookups", 0) == 0


def test_the_other_terms_of_the_condition_filter_the_database_rows(spark, tmp_path, database):
    database.sql(f"DROP TABLE IF EXISTS customers; {CUSTOMERS}{MOVED}")
    write(spark, tmp_path, FIRST + SECOND)
    spec = job(tmp_path, "not_fr", database.url, "left", "orders.customer_id = c.id AND c.country <> 'FR'")
    metrics = replay(spark, spec, at(0), at(3600), RunOptions(mode="exact"))
    assert rows_of(spark, spec) == Counter(
        {
            (101, "AT", "1010"): 1,
            (103, "AT", "1010"): 1,
            (102, None, None): 1,
            (104, None, None): 1,
        }
    )
    assert source_counts(metrics)["orders"]["joined"] == 2
    assert source_counts(metrics)["orders"]["unmatched_emitted"] == 2


def test_flinks_statement_runs_as_printed(spark, tmp_path, database):
    """004's lookup join verbatim in a .sql job file, replayed: each order with its customer."""
    database.sql(f"DROP TABLE IF EXISTS customers; {CUSTOMERS}{MOVED}")
    write(spark, tmp_path, FIRST + SECOND)
    sources = FLINK_LOOKUP_SOURCES.format(orders=tmp_path / "orders", url=database.url)
    query = FLINK_LOOKUP.replace(
        "SELECT", f"CREATE STREAM enriched WITH (path='{tmp_path / 'out'}') AS SELECT", 1
    )
    (tmp_path / "enriched.sql").write_text(sources + query)
    spec = load_job(tmp_path / "enriched.sql")
    metrics = replay(spark, spec, at(0), at(3600), RunOptions(mode="exact"))
    got = Counter((r.order_id, r.total, r.country, r.zip) for r in read(spark, spec.output.location))
    moved, cem = ("AT", "1010"), ("FR", "69001")
    assert got == Counter(
        {(101, 10, *moved): 1, (102, 20, *cem): 1, (103, 30, *moved): 1, (104, 40, *cem): 1}
    )
    assert metrics.totals["lookups"] == 2  # one commit, customers 1 and 3


def test_a_lookup_join_is_checked_against_the_database(spark, tmp_path, database, monkeypatch):
    database.sql(f"DROP TABLE IF EXISTS customers; {CUSTOMERS}")
    write(spark, tmp_path, FIRST)
    with pytest.raises(JobError, match="needs an equality of a stream column and a column of customers"):
        bind(spark, job(tmp_path, "no_key", database.url, on="orders.customer_id > c.id"))
    with pytest.raises(JobError, match="does not resolve|cannot resolve|UNRESOLVED_COLUMN"):
        bind(spark, job(tmp_path, "typo", database.url, on="orders.customer_id = c.idd"))
    closed = database.url.replace(str(database.port), str(database.port + 1))
    with pytest.raises(
        JobError,
        match=r"cannot read customers at jdbc:postgresql://127\.0\.0\.1:\d+/postgres through JDBC .*check that the database is up",
    ):
        bind(spark, job(tmp_path, "down", closed))
    monkeypatch.delenv("SHOP_PASSWORD", raising=False)
    secret = spec_from_dict(
        {
            "name": "secret",
            "sources": {"orders": {"path": str(tmp_path / "orders"), "time": "t"}},
            "from": "orders",
            "joins": [{"lookup": {"url": database.url, "table": "customers", "password_env": "SHOP_PASSWORD"},
                       "as": "c", "on": "orders.customer_id = c.id"}],
            "output": {"path": str(tmp_path / "out_secret")},
        }
    )  # fmt: skip
    with pytest.raises(JobError, match="the environment variable SHOP_PASSWORD .* is not set"):
        bind(spark, secret)


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ({"type": "right"}, "a lookup join is INNER .* or LEFT"),
        ({"on": None}, "a lookup join needs 'on' with an equality"),
        ({"within": "1m"}, "unknown setting"),
        ({"lookup": {"url": "postgres://x", "table": "customers"}}, "is not a JDBC URL"),
        (
            {"lookup": {"url": "jdbc:postgresql://x/db", "table": "customers", "password": "x"}},
            "unknown setting",
        ),
        (
            {"lookup": {"url": "jdbc:postgresql://x/db", "table": "t", "password_env": "hunter2!"}},
            "must name an environment variable",
        ),
    ],
)
def test_lookup_settings_are_refused_before_any_data_moves(tmp_path, join, message):
    item = {"lookup": {"url": "jdbc:postgresql://127.0.0.1:1/db", "table": "customers"}, "as": "c",
            "on": "orders.customer_id = c.id", **join}  # fmt: skip
    with pytest.raises(JobError, match=message):
        spec_from_dict(
            {
                "name": "refused",
                "sources": {"orders": {"path": "orders", "time": "t"}},
                "from": "orders",
                "joins": [item],
                "output": {"path": "out"},
            }
        )
