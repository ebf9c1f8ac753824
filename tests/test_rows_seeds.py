"""ROWS-window joins end to end on Delta tables, in both runners, and the jobs they refuse.

SQLstream's stocks (002) per key, docs/design-window-joins.md's Example 2.5: orders LEFT JOIN the
two latest prices of their ticker (`rows: {stock_price: 2}`). Two prices in one commit are
ordered by content; a newer price pushes the oldest out of its ticker's window; an order of a
ticker without prices is padded as it arrives. Live (run between the commits) = replay.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from aging import age_table, write_commits
from conftest import append, at
from harness import live_accounting, read, source_counts
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType

from streamjoin import delta_io
from streamjoin.errors import JobError
from streamjoin.plan import bind, describe
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict
from streamjoin.sql import spec_from_sql

FIVE = 5 * 3600  # 05:00:00 on the test clock
PRICES = StructType(
    [
        StructField("ticker", StringType()),
        StructField("ending_price", IntegerType()),
        StructField("t", TimestampType()),
    ]
)
ORDERS = StructType(
    [
        StructField("ticker", StringType()),
        StructField("quantity", IntegerType()),
        StructField("t", TimestampType()),
    ]
)
# (source, rows (ticker, value, 05:MM:SS seconds)), one commit each; the last a heartbeat.
COMMITS = [
    ("stock_price", [("IBM", 80, 130), ("IBM", 75, 130)]),
    ("order_quantity", [("IBM", 750, 132)]),
    ("stock_price", [("IBM", 100, 190)]),
    ("stock_price", [("MSFT", 100, 195)]),
    ("order_quantity", [("IBM", 1000, 191), ("GOOGL", 1000, 195)]),
    ("stock_price", [(None, None, 196)]),
]
LIVE_AFTER = (2, len(COMMITS) - 1)  # the order of commit 2 settles once prices commit after it
# (ticker, quantity, price, event time seconds after 05:00)
EXPECTED = Counter(
    {
        ("IBM", 750, 75, 132): 1,
        ("IBM", 750, 80, 132): 1,
        ("IBM", 1000, 80, 191): 1,
        ("IBM", 1000, 100, 191): 1,
        ("GOOGL", 1000, None, 195): 1,
    }
)
ACCOUNTING = {
    "order_quantity": {"rows_in": 3, "rejected": 0, "late": 0, "joined": 2, "unmatched_emitted": 1, "unmatched_dropped": 0, "open": 0, "unsettled": 0},
    "stock_price": {"rows_in": 5, "rejected": 1, "late": 0, "joined": 3, "unmatched_emitted": 0, "unmatched_dropped": 0, "open": 1, "unsettled": 0},
}  # fmt: skip


def spec(root, runner: str, **join):
    return spec_from_dict(
        {
            "name": f"stocks_rows_{runner}",
            "sources": {
                name: {"path": str(root / name), "time": "t"} for name in ("order_quantity", "stock_price")
            },
            "from": "order_quantity",
            "joins": [
                {
                    "join": "stock_price",
                    "type": "left",
                    "on": "order_quantity.ticker = stock_price.ticker",
                    "rows": {"stock_price": 2},
                    **join,
                }
            ],
            "select": [
                "order_quantity.ticker",
                "order_quantity.quantity",
                "stock_price.ending_price AS price",
            ],
            "output": {"path": str(root / f"out_{runner}")},
        }
    )


def joined(rows) -> Counter:
    return Counter(
        (r.ticker, r.quantity, r.price, int((r.event_time - at(FIVE)).total_seconds())) for r in rows
    )


def created_empty(spark, root, schemas: dict) -> None:
    """Both sources created without rows before any commit of COMMITS: the job starts there
    (the latest of its sources' first versions), so every commit arrives after the start, in the
    order written, rather than as history arriving at once (docs/semantics.md)."""
    for name in ("stock_price", "order_quantity"):
        append(spark, root / name, [], schemas[name])


def test_the_latest_rows_per_key_live_and_replayed(spark, tmp_path):
    created_empty(spark, tmp_path, {"stock_price": PRICES, "order_quantity": ORDERS})
    live = spec(tmp_path, "live")
    runner, written = None, {}
    for index, (source, rows) in enumerate(COMMITS):
        schema = PRICES if source == "stock_price" else ORDERS
        append(spark, tmp_path / source, [(k, v, at(FIVE + s)) for k, v, s in rows], schema)
        if index in LIVE_AFTER:
            runner = runner or LiveRunner(spark, live, str(tmp_path / "checkpoint"))
            runner.run(900)
            written[index] = joined(read(spark, live.output.location))
    # After commit 3 the order has met both IBM prices of commit 1 (75 first: content order).
    assert written[LIVE_AFTER[0]] == {("IBM", 750, 75, 132): 1, ("IBM", 750, 80, 132): 1}
    assert written[LIVE_AFTER[1]] == EXPECTED
    accounting, _ = live_accounting(spark, live.output.location)
    assert accounting == ACCOUNTING
    replayed = spec(tmp_path, "replay")
    metrics = replay(spark, replayed, at(0), at(FIVE + 3600), RunOptions(mode="exact"))
    assert joined(read(spark, replayed.output.location)) == EXPECTED
    assert source_counts(metrics) == ACCOUNTING
    text = describe(bind(spark, replayed))
    assert "ROWS windows: per key, the 2 latest stock_price rows" in text


def test_a_condition_spelling_the_key_in_another_case_binds_to_the_tables_spelling(spark, tmp_path):
    """SQLstream's `ON (oq.ticker = sp.ticker)` over tables whose column is `TICKER`: Spark and the
    seed systems resolve names without regard to case, so the job joins on `TICKER`, live and
    replayed, and writes the rows the same job spelt as its tables does."""
    upper = {
        name: StructType([StructField(f.name.upper(), f.dataType) for f in schema.fields])
        for name, schema in (("stock_price", PRICES), ("order_quantity", ORDERS))
    }
    created_empty(spark, tmp_path, upper)
    for source, rows in COMMITS:
        append(spark, tmp_path / source, [(k, v, at(FIVE + s)) for k, v, s in rows], upper[source])

    def job(runner: str):
        return spec_from_sql(
            f"""CREATE STREAM order_quantity WITH (path='{tmp_path / "order_quantity"}', time='T');
CREATE STREAM stock_price WITH (path='{tmp_path / "stock_price"}', time='T');
CREATE STREAM joined WITH (path='{tmp_path / f"out_{runner}"}') AS
SELECT STREAM oq.ticker AS ticker, oq.quantity AS quantity, sp.ending_price AS price
  FROM order_quantity AS oq
  LEFT JOIN stock_price OVER (ROWS 1 PRECEDING) AS sp
  ON (oq.ticker = sp.ticker);"""
        )

    live = job("live")
    assert describe(bind(spark, live)).count("order_quantity.TICKER = stock_price.TICKER") >= 1
    LiveRunner(spark, live, str(tmp_path / "checkpoint")).run()
    assert joined(read(spark, live.output.location)) == EXPECTED
    replayed = job("replay")
    replay(spark, replayed, at(0), at(FIVE + 3600), RunOptions(mode="exact"))
    assert joined(read(spark, replayed.output.location)) == EXPECTED


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ({"rows": {"stock_price": 0}}, "must be a whole number of rows, 1 or more"),
        ({"rows": {"stock_price": 2}, "within": "1m"}, "give either 'rows'"),
        ({"rows": {"stock_price": 2}, "grace": "1m"}, "remove 'grace'"),
        ({"rows": {"stock_price": 2}, "emit": "eager"}, "remove 'emit'"),
        ({"rows": []}, "should map a source of the join to a number of rows"),
    ],
)
def test_rows_settings_are_refused_before_any_data_moves(tmp_path, join, message):
    with pytest.raises(JobError, match=message):
        spec(tmp_path, "refused", **join)


def test_rows_naming_no_side_of_the_join_is_refused(spark, tmp_path):
    for source, rows in COMMITS[:2]:
        append(
            spark,
            tmp_path / source,
            [(k, v, at(s)) for k, v, s in rows],
            PRICES if source == "stock_price" else ORDERS,
        )
    with pytest.raises(JobError, match="rows names 'prices', which is not a side of this join"):
        bind(spark, spec(tmp_path, "refused", rows={"prices": 2}))


def test_rows_windows_on_forty_day_old_tables_before_and_after_their_aging(spark, tmp_path):
    """A ROWS replay reads its streams whole, not a slice's margins: on sources committed from 40
    days back (row tracking, default retention) a job starting 4 days ago runs live; after the
    tables are OPTIMIZEd, VACUUMed and their logs cut to 5 days (their early change feed gone),
    the replay of everything still writes the live rows."""
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None)

    def commits(days, rows):
        return [(now + timedelta(days=d), [(k, v, now + timedelta(days=d, minutes=-m)) for k, v, m in rows(n)])
                for n, d in enumerate(days)]  # fmt: skip

    tracked = {"delta.enableRowTracking": "true", "delta.enableChangeDataFeed": "true"}
    prices = commits(
        [-40, -30, -10, -3, -2, -1.5, -0.5], lambda n: [("IBM", 70 + n, 1), ("MSFT", 200 + n, 2)]
    )
    orders = commits([-39, -20, -3.5, -2.5, -1], lambda n: [("IBM", 10 * (n + 1), 3), ("GOOGL", n, 4)])
    ddl = {"stock_price": "ticker string, ending_price int, t timestamp",
           "order_quantity": "ticker string, quantity int, t timestamp"}  # fmt: skip
    for name, written in (("stock_price", prices), ("order_quantity", orders)):
        write_commits(spark, str(tmp_path / name), written, ddl[name], tracked)
    job = replace(spec(tmp_path, "aged"), start_at=(now - timedelta(days=4)).isoformat() + "Z")
    LiveRunner(spark, job, str(tmp_path / "checkpoint")).run()
    live = Counter((r.ticker, r.quantity, r.price) for r in read(spark, job.output.location))
    # History (every row up to the start) sits at each source's start position, orders (source 0)
    # before prices: the orders of days -39 and -20 see no price. Later IBM orders see the two
    # latest IBM prices before them (history 70 to 72, then 73 on day -3, 74, 75); GOOGL none. The
    # prices of day -0.5 settle the orders of day -1.
    pads = Counter({("IBM", 10, None): 1, ("IBM", 20, None): 1, **{("GOOGL", n, None): 1 for n in range(5)}})
    pairs = [
        ("IBM", 30, 72),
        ("IBM", 30, 71),
        ("IBM", 40, 73),
        ("IBM", 40, 72),
        ("IBM", 50, 75),
        ("IBM", 50, 74),
    ]
    assert live == pads + Counter(pairs)
    for name in ("stock_price", "order_quantity"):
        age_table(spark, str(tmp_path / name), log_retention="interval 5 days")
        assert delta_io.oldest_retained(spark, str(tmp_path / name)).version > 0, (
            "the early log is still there"
        )
    replay(spark, job, now - timedelta(days=60), now + timedelta(days=1), RunOptions(mode="exact"))
    assert Counter((r.ticker, r.quantity, r.price) for r in read(spark, job.output.location)) == live
