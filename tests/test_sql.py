"""Jobs written in SQL (streamjoin/sql.py): the seeds' join statements, copied verbatim after their
source declarations, compile to the JoinSpecs the YAML tests use; what a join job cannot be is
refused with the statement's line and column; a `.sql` job file runs.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from conftest import append
from harness import upsert
from seed_sql import (
    FLINK_LOOKUP,
    FLINK_LOOKUP_SOURCES,
    FLINK_ORDERS_PRODUCT,
    FLINK_SOURCES,
    FLINK_TEMPORAL,
    KSQLDB_FULL_OUTER_STAGE,
    KSQLDB_SHIPPED_ORDERS,
    KSQLDB_TABLES,
    LENSES_DEFAULT_KEY,
    LENSES_INNER,
    LENSES_KEYED_SOURCES,
    LENSES_ON_KEY,
    LENSES_SOURCES,
    RISINGWAVE_ASOF,
    RISINGWAVE_INTERVAL,
    RISINGWAVE_SOURCES,
    RISINGWAVE_WINDOW,
)
from test_enrichment_seeds import ASOF_INNER, MARKET, MARKET_DATA, PRICES, STOCK_PRICES

from streamjoin.cli import main
from streamjoin.errors import JobError
from streamjoin.jobfile import load_job
from streamjoin.joins.rows import RowsLink
from streamjoin.joins.temporal import AsofLink
from streamjoin.plan import split_conjuncts
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict
from streamjoin.sql import spec_from_sql


def compiled(declarations: str, query: str, output: str = "joined") -> object:
    """The JoinSpec of `query` (verbatim from a seed) after `declarations`, written to `out`."""
    return spec_from_sql(f"{declarations}\nCREATE STREAM {output} WITH (path='out') AS\n{query}")


KSQLDB_SOURCES = """
CREATE STREAM A WITH (path='A', time='t');
CREATE TABLE B WITH (path='B', key='product_id');
CREATE TABLE C WITH (path='C', key='purchased_id');
"""


def test_ksqldb_nway_statements_compile_to_the_yaml_jobs():
    """The seed's N-way joins: A a stream, B and C tables; then C a stream WITHIN 10 SECONDS."""
    query = """  SELECT *
  FROM A
    JOIN B ON A.id = B.product_id
    JOIN C ON A.id = C.purchased_id;"""
    yaml = {
        "name": "joined",
        "sources": {
            "A": {"path": "A", "time": "t"},
            "B": {"path": "B", "kind": "table", "key": ["product_id"]},
            "C": {"path": "C", "kind": "table", "key": ["purchased_id"]},
        },
        "from": "A",
        "joins": [{"join": "B", "on": "A.id = B.product_id"}, {"join": "C", "on": "A.id = C.purchased_id"}],
        "output": {"path": "out"},
    }
    assert compiled(KSQLDB_SOURCES, query) == spec_from_dict(yaml)
    with_stream = KSQLDB_SOURCES.replace(
        "CREATE TABLE C WITH (path='C', key='purchased_id');", "CREATE STREAM C WITH (path='C', time='t');"
    )
    query = """  SELECT *
  FROM A
    JOIN B ON A.id = B.product_id
    JOIN C WITHIN 10 SECONDS ON A.id = C.purchased_id;"""
    yaml["sources"]["C"] = {"path": "C", "time": "t"}
    yaml["joins"][1]["within"] = "10s"
    assert compiled(with_stream, query) == spec_from_dict(yaml)


def test_ksqldb_within_before_and_after_and_a_grace_period():
    """`WITHIN (1 HOUR, 2 HOURS)`: the right row up to an hour before the left and two after;
    aliases name the sources in the statement only."""
    spec = compiled(
        "CREATE STREAM orders WITH (path='o', time='t'); CREATE STREAM shipments WITH (path='s', time='t');",
        "SELECT o.id AS order_id, s.id AS shipment_id FROM orders o LEFT OUTER JOIN shipments s "
        "WITHIN (1 HOUR, 2 HOURS) GRACE PERIOD 15 MINUTES ON o.id = s.order_id WHERE o.amount BETWEEN 1 AND 5",
    )
    (join,) = spec.joins
    assert (join.type, join.on, str(join.bounds.lower), str(join.bounds.upper), str(join.grace)) == (
        "left",
        "orders.id = shipments.order_id",
        "-1 day, 23:00:00",
        "2:00:00",
        "0:15:00",
    )
    assert spec.select == ("orders.id AS order_id", "shipments.id AS shipment_id")
    assert spec.where == "orders.amount BETWEEN 1 AND 5"


INTERVAL_SOURCES = (
    "CREATE STREAM Orders WITH (path='o', time='order_time');\n"
    "CREATE STREAM Shipments WITH (path='s', time='ship_time');"
)


def test_flinks_interval_join_compiles_to_bounds():
    """Flink's example verbatim: a comma join whose WHERE holds the key and a BETWEEN on the two
    time columns: shipments up to four hours after the order."""
    query = """SELECT *
FROM Orders o, Shipments s
WHERE o.id = s.order_id
AND o.order_time BETWEEN s.ship_time - INTERVAL '4' HOUR AND s.ship_time"""
    yaml = {
        "name": "joined",
        "sources": {
            "Orders": {"path": "o", "time": "order_time"},
            "Shipments": {"path": "s", "time": "ship_time"},
        },
        "from": "Orders",
        "joins": [{"join": "Shipments", "on": "Orders.id = Shipments.order_id", "between": ["0s", "4h"]}],
        "output": {"path": "out"},
    }
    assert compiled(INTERVAL_SOURCES, query) == spec_from_dict(yaml)


@pytest.mark.parametrize(
    ("condition", "lower", "upper"),
    [  # Flink's valid interval conditions (ltime: the order's, rtime: the shipment's), RisingWave's
        ("o.order_time = s.ship_time", "0:00:00", "0:00:00"),
        (
            "o.order_time >= s.ship_time AND o.order_time < s.ship_time + INTERVAL '10' MINUTE",
            "-1 day, 23:50:00.000001",
            "0:00:00",
        ),
        (
            "o.order_time BETWEEN s.ship_time - INTERVAL '10' SECOND AND s.ship_time + INTERVAL '5' SECOND",
            "-1 day, 23:59:55",
            "0:00:10",
        ),
        (
            "o.order_time between s.ship_time and s.ship_time + INTERVAL '1 minute'",
            "-1 day, 23:59:00",
            "0:00:00",
        ),
    ],
)
def test_interval_conditions_become_the_bounds(condition, lower, upper):
    spec = compiled(
        INTERVAL_SOURCES, f"SELECT * FROM Orders o JOIN Shipments s ON o.id = s.order_id AND {condition}"
    )
    (join,) = spec.joins
    assert (join.on, str(join.bounds.lower), str(join.bounds.upper)) == (
        "Orders.id = Shipments.order_id",
        lower,
        upper,
    )


def test_bare_time_column_names_bound_a_comma_join():
    """Flink prints its interval conditions with bare names (`ltime = rtime`): each is the time
    column of one of the two streams, so a comma join's WHERE gives the bounds as qualified ones do."""
    sources = "CREATE STREAM l WITH (path='l', time='ltime');\nCREATE STREAM r WITH (path='r', time='rtime');"
    for condition, bounds in (
        ("ltime = rtime", ("0:00:00", "0:00:00")),
        ("ltime >= rtime AND ltime < rtime + INTERVAL '10' MINUTE", ("-1 day, 23:50:00.000001", "0:00:00")),
        (
            "ltime BETWEEN rtime - INTERVAL '10' SECOND AND rtime + INTERVAL '5' SECOND",
            ("-1 day, 23:59:55", "0:00:10"),
        ),
    ):
        spec = compiled(sources, f"SELECT * FROM l, r WHERE l.id = r.id AND {condition}")
        (join,) = spec.joins
        assert (join.on, str(join.bounds.lower), str(join.bounds.upper), spec.where) == (
            "l.id = r.id",
            *bounds,
            None,
        )


def test_a_time_condition_bounding_one_side_only_is_refused():
    with pytest.raises(JobError, match="bounds it on one side only; an interval join needs both"):
        compiled(
            INTERVAL_SOURCES,
            "SELECT * FROM Orders o JOIN Shipments s ON o.id = s.order_id AND s.ship_time >= o.order_time",
        )


SQLSTREAM_SOURCES = (
    "CREATE STREAM order_quantity WITH (path='oq', time='t');\n"
    "CREATE STREAM stock_price WITH (path='sp', time='t');"
)


@pytest.mark.parametrize(
    ("query", "within"),
    [
        (  # SQLstream's stocks example, verbatim: both sides keep a minute of rows
            "SELECT STREAM rowtime, sp.ticker, oq.quantity, sp.ending_price FROM stocks.order_quantity OVER "
            "(RANGE INTERVAL '1' MINUTE PRECEDING) AS oq   JOIN stocks.stock_price OVER (RANGE INTERVAL '1' "
            "MINUTE PRECEDING) AS sp   ON (oq.ticker = sp.ticker);",
            ("-1 day, 23:59:00", "0:01:00"),
        ),
        (  # no OVER on the orders: each order meets the prices of the minute before it
            "SELECT STREAM oq.quantity FROM order_quantity AS oq JOIN stock_price OVER (RANGE INTERVAL '1' "
            "MINUTE PRECEDING) AS sp ON oq.ticker = sp.ticker",
            ("-1 day, 23:59:00", "0:00:00"),
        ),
    ],
)
def test_sqlstream_windows_become_the_bounds(query, within):
    """Each side's RANGE window keeps its rows that long: right.time - left.time lies in [-the right
    window, the left window]; ROWTIME is the output time every job writes."""
    spec = compiled(SQLSTREAM_SOURCES, query)
    (join,) = spec.joins
    assert (join.on, str(join.bounds.lower), str(join.bounds.upper)) == (
        "order_quantity.ticker = stock_price.ticker",
        *within,
    )
    assert "rowtime" not in " ".join(spec.select).lower()
    with pytest.raises(JobError, match=r"the window OVER \(ROWS UNBOUNDED PRECEDING\) is not supported"):
        compiled(
            SQLSTREAM_SOURCES,
            query.replace("RANGE INTERVAL '1' MINUTE PRECEDING", "ROWS UNBOUNDED PRECEDING"),
        )


def test_sqlstreams_rows_windows_count_the_latest_rows():
    """SQLstream's ROWS example as printed (5 PRECEDING AND CURRENT ROW: six rows each side)."""
    query = """SELECT STREAM rowtime, sp.ticker, oq.quantity, sp.ending_price
  FROM order_quantity OVER (ROWS BETWEEN 5 PRECEDING AND CURRENT ROW) AS oq
  JOIN stock_price OVER (ROWS BETWEEN 5 PRECEDING AND CURRENT ROW) AS sp
  ON (oq.ticker = sp.ticker);"""
    (join,) = compiled(SQLSTREAM_SOURCES, query).joins
    assert (join.rows, type(join), join.on) == (  # a ROWS link, with no time bounds
        (("order_quantity", 6), ("stock_price", 6)),
        RowsLink,
        "order_quantity.ticker = stock_price.ticker",
    )
    one_side = query.replace(
        "order_quantity OVER (ROWS BETWEEN 5 PRECEDING AND CURRENT ROW)", "order_quantity"
    )
    assert compiled(
        SQLSTREAM_SOURCES, one_side.replace("BETWEEN 5 PRECEDING AND CURRENT ROW", "2 PRECEDING")
    ).joins[0].rows == (("stock_price", 3),)
    assert compiled(
        SQLSTREAM_SOURCES, one_side.replace("BETWEEN 5 PRECEDING AND CURRENT ROW", "CURRENT ROW")
    ).joins[0].rows == (("stock_price", 1),)
    mixed = query.replace(
        "ROWS BETWEEN 5 PRECEDING AND CURRENT ROW) AS sp", "RANGE INTERVAL '1' MINUTE PRECEDING) AS sp"
    )
    with pytest.raises(JobError, match="ROWS windows take one join whose windows all count rows"):
        compiled(SQLSTREAM_SOURCES, mixed)


def test_using_natural_and_cross_joins():
    declarations = "CREATE STREAM a WITH (path='a', time='t'); CREATE STREAM b WITH (path='b', time='t');"
    using = compiled(declarations, "SELECT * FROM a JOIN b WITHIN 1 MINUTE USING (k, v)").joins[0]
    natural = compiled(declarations, "SELECT * FROM a NATURAL LEFT JOIN b WITHIN 1 MINUTE").joins[0]
    cross = compiled(declarations, "SELECT * FROM a CROSS JOIN b WITHIN 1 MINUTE").joins[0]
    assert (using.using, natural.natural, natural.type, cross.type) == (("k", "v"), True, "left", "cross")


def test_flinks_event_time_temporal_join_compiles_to_the_yaml_job():
    """Flink's declarations and query: the primary key is the table's key, each WATERMARK its time
    column, and their delay (15 s) the grace of the join between them."""
    declarations = FLINK_SOURCES.format(orders="orders", rates="rates", changelog=", changelog=true")
    yaml = {
        "name": "joined",
        "sources": {
            "orders": {"path": "orders", "time": "order_time"},
            "currency_rates": {
                "path": "rates",
                "kind": "table",
                "key": ["currency"],
                "time": "update_time",
                "changelog": True,
            },
        },
        "from": "orders",
        "joins": [
            {
                "join": "currency_rates",
                "type": "left",
                "on": "orders.currency = currency_rates.currency",
                "as_of": "event_time",
                "grace": "15s",
            }
        ],
        "select": ["order_id", "price", "orders.currency", "conversion_rate", "order_time"],
        "output": {"path": "out"},
    }
    query = FLINK_TEMPORAL
    assert compiled(declarations, query) == spec_from_dict(yaml)
    proctime = compiled(
        declarations,
        query.replace("FOR SYSTEM_TIME AS OF orders.order_time", "FOR SYSTEM_TIME AS OF PROCTIME()"),
    )
    assert proctime.joins[0].as_of == "arrival"


def test_flinks_create_table_with_a_watermark_and_no_primary_key_is_a_stream():
    """Flink's seed declares `orders` with CREATE TABLE, a WATERMARK and no PRIMARY KEY: its
    append-only table, a stream here; `currency_rates`, with both, is its versioned table. Given a
    PRIMARY KEY, `orders` is a table, and the temporal join of two tables is refused."""
    declarations = FLINK_SOURCES.format(orders="orders", rates="rates", changelog=", changelog=true")
    spec = compiled(declarations, FLINK_TEMPORAL)
    assert [(s.name, s.kind) for s in spec.sources] == [("orders", "stream"), ("currency_rates", "table")]
    keyed = declarations.replace(
        "order_time  TIMESTAMP(3),", "order_time  TIMESTAMP(3), PRIMARY KEY(order_id),"
    )
    with pytest.raises(JobError, match="FOR SYSTEM_TIME AS OF and ASOF apply to stream-table joins only"):
        compiled(keyed, FLINK_TEMPORAL)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("update_time - INTERVAL '15' SECOND", "update_time + INTERVAL '15' SECOND"),
            "line 13, column 19: the watermark update_time + INTERVAL '15' SECOND is not supported: write "
            "WATERMARK FOR update_time AS update_time - INTERVAL '<n>' <unit>",
        ),
        (
            ("path='rates'", "path='rates', key='rate'"),
            "line 9, column 14: the column list gives key ['currency'] and WITH (...) gives 'rate'; give one",
        ),
        (
            ("path='orders'", "path='orders', time='placed'"),
            "line 7, column 19: the column list gives time 'order_time' and WITH (...) gives 'placed'; give one",
        ),
    ],
)
def test_declared_columns_that_say_otherwise_are_refused(change, message):
    declarations = FLINK_SOURCES.format(orders="orders", rates="rates", changelog="").replace(*change)
    with pytest.raises(JobError, match=re.escape(message)):
        compiled(declarations, FLINK_TEMPORAL)


def test_a_join_waits_for_the_slowest_declared_watermark_unless_given_a_grace_period():
    """Flink and RisingWave hold a join back by its inputs' watermarks: without GRACE PERIOD, a
    join's grace is the largest delay declared by its source and the sources before it."""
    a = "CREATE STREAM a (k STRING, t TIMESTAMP, WATERMARK FOR t AS t - INTERVAL '5' SECOND) WITH (path='a');"
    b = "CREATE STREAM b (k STRING, t TIMESTAMP, WATERMARK FOR t AS t - INTERVAL '1' MINUTE) WITH (path='b');"
    c = "CREATE STREAM c (k STRING, t TIMESTAMP, WATERMARK FOR t AS t) WITH (path='c');"
    chain = compiled(
        f"{a}\n{b}\n{c}",
        "SELECT * FROM a JOIN b WITHIN 1 HOUR ON a.k = b.k JOIN c WITHIN 1 HOUR ON a.k = c.k",
    )
    assert [j.grace for j in chain.joins] == [timedelta(minutes=1), timedelta(minutes=1)]
    assert compiled(f"{c}\n{a}", "SELECT * FROM c JOIN a WITHIN 1 HOUR ON c.k = a.k").joins[
        0
    ].grace == timedelta(seconds=5)
    given = compiled(f"{a}\n{c}", "SELECT * FROM a JOIN c WITHIN 1 HOUR GRACE PERIOD 2 SECONDS ON a.k = c.k")
    assert given.joins[0].grace == timedelta(seconds=2)
    key = compiled(
        "CREATE TABLE u (k STRING PRIMARY KEY, v STRING) WITH (path='u');\n" + a,
        "SELECT * FROM a JOIN u ON a.k = u.k",
    )
    assert key.source("u").key == ("k",)


def test_risingwaves_asof_join_compiles_to_the_yaml_job():
    yaml = {
        "name": "joined",
        "sources": {
            "stock_prices": {"path": "p", "time": "stock_time"},
            "market_data": {
                "path": "m",
                "kind": "table",
                "key": ["stock_name", "market_time"],
                "clock_skew": "0s",
            },
        },
        "from": "stock_prices",
        "joins": [
            {
                "join": "market_data",
                "asof": True,
                "on": "stock_prices.stock_name = market_data.stock_name AND market_data.market_time <= stock_prices.stock_time",
            }
        ],
        "select": [
            "stock_prices.stock_name",
            "stock_prices.stock_time",
            "stock_prices.price",
            "market_data.sentiment",
        ],
        "output": {"path": "out"},
    }
    declarations = RISINGWAVE_SOURCES.format(prices="p", market="m")
    assert compiled(declarations, RISINGWAVE_ASOF) == spec_from_dict(yaml)
    left = compiled(declarations, RISINGWAVE_ASOF.replace("ASOF JOIN", "ASOF LEFT JOIN"))
    assert (left.joins[0].type, isinstance(left.joins[0], AsofLink)) == ("left", True)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "SELECT a.k, COUNT(*) FROM a JOIN b WITHIN 1 HOUR ON a.k = b.k GROUP BY a.k",
            "line 4, column 72: GROUP BY (an aggregation) is not supported",
        ),
        (
            "SELECT a.k, MAX(b.v) FROM a JOIN b WITHIN 1 HOUR ON a.k = b.k",
            "line 4, column 13: MAX(b.v) is an aggregation, which is not supported",
        ),
        (
            "SELECT * FROM a JOIN (SELECT * FROM b) b2 WITHIN 1 HOUR ON a.k = b2.k",
            "line 4, column 30: subqueries are not supported",
        ),
        (
            "SELECT * FROM a JOIN c WITHIN 1 HOUR ON a.k = c.k",
            "line 4, column 22: 'c' is not declared; declare it first with CREATE STREAM c",
        ),
        ("SELECT * FROM a JOIN b WITHIN ON a.k = b.k", "expected a duration such as 10 SECONDS or 1 HOUR"),
        ("SELECT * FROM a", "the query joins nothing: add JOIN <source> ON"),
    ],
)
def test_what_a_join_job_cannot_be_is_refused_with_its_position(query, message):
    declarations = "CREATE STREAM a WITH (path='a', time='t');\nCREATE STREAM b WITH (path='b', time='t');"
    with pytest.raises(JobError) as error:
        compiled(declarations, query)
    assert message in str(error.value)


def test_a_job_file_holds_declarations_and_one_query():
    with pytest.raises(JobError, match="exactly one query"):
        spec_from_sql("CREATE STREAM a WITH (path='a', time='t');")
    with pytest.raises(JobError, match="CREATE STREAM / CREATE TABLE statements only"):
        spec_from_sql("CREATE STREAM a WITH (path='a', time='t'); DROP TABLE a;")
    with pytest.raises(JobError, match="unknown setting 'colour'; settings are path, table, time"):
        spec_from_sql(
            "CREATE STREAM a WITH (path='a', colour='red'); CREATE STREAM b WITH (path='b');"
            "CREATE STREAM o WITH (path='o') AS SELECT * FROM a JOIN b WITHIN 1 HOUR ON a.k = b.k"
        )


def test_a_sql_job_file_replays_risingwaves_example(spark, tmp_path, capsys):
    """The same file `streamjoin replay` would take: RisingWave's ASOF statement over its tables
    gives the rows the seed prints; `explain` prints the job it became as YAML, which loads to the
    same job."""
    prices, market = str(tmp_path / "stock_prices"), str(tmp_path / "market_data")
    upsert(spark, market, MARKET_DATA, MARKET, ("stock_name", "market_time"))
    append(spark, prices, STOCK_PRICES, PRICES)
    job = tmp_path / "asof.sql"
    job.write_text(
        RISINGWAVE_SOURCES.format(prices=prices, market=market)
        + f"CREATE STREAM asof_sql WITH (path='{tmp_path}/out') AS\n{RISINGWAVE_ASOF}\n"
    )
    spec = load_job(job)
    replay(spark, spec, datetime(2024, 9, 24), datetime(2024, 9, 25))
    rows = spark.read.format("delta").load(f"{tmp_path}/out").collect()
    assert Counter((r.stock_name, r.stock_time, r.price, r.sentiment) for r in rows) == Counter(ASOF_INNER)
    assert main(["explain", str(job)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("the SQL job as YAML (the same job; either file runs):\n")
    shown = yaml.safe_load(printed.split("\n", 1)[1].split("\n\n", 1)[0])
    assert shown["joins"] == [
        {
            "join": "market_data",
            "asof": True,
            "on": "stock_prices.stock_name = market_data.stock_name AND market_data.market_time <= stock_prices.stock_time",
        }
    ]
    assert spec_from_dict(shown) == spec
    assert "1. INNER JOIN market_data [asof]" in printed


TYPO_JOB = """-- clicks and the view before them
CREATE STREAM clicks WITH (path='clicks', time='ts');
CREATE STREAM views WITH (path='views', time='ts');

CREATE STREAM attributed WITH (path='out') AS
SELECT c.ad_id,
       v.pgae AS landing,
       upper(c.ad_id) AS ad
FROM clicks AS c
JOIN views AS v WITHIN 1 HOUR GRACE PERIOD 10 MINUTES ON c.ad_id = v.ad_id;
"""


def test_a_column_typo_is_reported_at_its_line_and_column_in_the_users_words(spark, tmp_path, capsys):
    """Issue 81, item 7: a select column, a bare name and a join condition's column that do not
    resolve are each reported at their line and column in the job file, as written there (aliases
    kept), not at "line 1 pos 0" of the expression the job compiled to."""
    for name in ("clicks", "views"):
        append(
            spark,
            tmp_path / name,
            [("a1", "home", datetime(2024, 5, 1))],
            "ad_id string, page string, ts timestamp",
        )
    job = tmp_path / "typo.sql"
    where = f"job 'attributed', {job}: line"
    for text, error in (
        (
            TYPO_JOB,
            f"{where} 7, column 8, in the select list: v.pgae names no column of source 'views' ({tmp_path}/views); "
            "its columns are ad_id, page, ts",
        ),
        (
            TYPO_JOB.replace("v.pgae", "pgae"),
            f"{where} 7, column 8, in the select list: no source has a column pgae; did you mean ",
        ),
        (
            TYPO_JOB.replace("v.pgae", "v.page").replace("= v.ad_id", "= v.adid"),
            f"{where} 10, column 68, in the condition of the join with 'views': v.adid names no column of source "
            f"'views' ({tmp_path}/views); its columns are ad_id, page, ts",
        ),
    ):
        job.write_text(text)
        assert main(["--root", str(tmp_path), "validate-job", str(job)]) == 2
        printed = capsys.readouterr().err.splitlines()[-1]
        assert printed.startswith(f"streamjoin: error: {error}"), printed
        assert "line 1 pos 0" not in printed and "views.p" not in printed
    job.write_text(TYPO_JOB.replace("v.pgae", "pgae"))
    assert main(["--root", str(tmp_path), "validate-job", str(job)]) == 2
    # Spark's suggestions, by the aliases the query gives the sources
    assert re.search(r"did you mean [^?]*\bv\.page\b[^?]*\?$", capsys.readouterr().err.strip())


def test_a_residual_with_and_inside_stays_whole():
    """The SQL side of test_spec's residual replays: the condition reaches the job whole, and the
    plan splits it by its parsed tree (BETWEEN ... AND, CASE WHEN ... AND are one term each)."""
    declarations = "CREATE STREAM a WITH (path='a', time='t'); CREATE STREAM b WITH (path='b', time='t');"
    for residual in ("b.v BETWEEN 1 AND 2", "CASE WHEN a.v = 1 AND b.v = 2 THEN TRUE ELSE FALSE END"):
        (join,) = compiled(
            declarations, f"SELECT * FROM a JOIN b WITHIN 1 MINUTE ON a.k = b.k AND {residual}"
        ).joins
        assert join.on == f"a.k = b.k AND {residual}"
        assert split_conjuncts(join.on) == ["a.k = b.k", residual]


def test_the_job_checks_point_at_the_statement():
    """What the YAML checks refuse (here ksqlDB's FULL OUTER stream-table stage) is said with the
    place of the join in the SQL, and what is supported."""
    declarations = "CREATE STREAM a WITH (path='a', time='t'); CREATE TABLE t WITH (path='t', key='k');"
    with pytest.raises(JobError) as error:
        compiled(declarations, "SELECT *\nFROM a\n  FULL OUTER JOIN t ON a.k = t.k")
    assert str(error.value).startswith(
        "line 5, column 19: job 'joined', join with 't': a FULL join of a stream with a table is refused"
    )
    assert str(error.value).endswith("Supported: inner, left")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "SELECT * FROM t JOIN a ON t.k = a.k",
            "line 4, column 22: job 'joined', join with 'a': an INNER join of a table with a stream is refused: a "
            "table cannot drive a stream: put the stream first (stream JOIN table)",
        ),
        (
            "SELECT * FROM a JOIN b ON a.k = b.k",
            "line 4, column 22: job 'joined', join with 'b': a stream-stream join needs time bounds, or its state "
            "would grow with all history; write WITHIN 1 HOUR after the joined stream, WITHIN (1 HOUR, 2 HOURS)",
        ),
        (
            "SELECT * FROM a JOIN t WITHIN 1 HOUR ON a.k = t.k",
            "line 4, column 22: job 'joined', join with 't': WITHIN, OVER windows and interval conditions apply to "
            "stream-stream joins only; remove them from this stream-table join",
        ),
        (
            "SELECT * FROM a CROSS JOIN b",
            "line 4, column 28: job 'joined', join with 'b': a CROSS join of two streams needs time bounds, or every "
            "row would pair with every row of the other stream forever; write CROSS JOIN r WITHIN 1 MINUTE, or OVER "
            "(RANGE INTERVAL '1' MINUTE PRECEDING) on both sides",
        ),
        (
            "SELECT * FROM a ASOF JOIN b WITHIN 1 HOUR ON a.k = b.k AND b.t <= a.t",
            "line 4, column 27: job 'joined', join with 'b': ASOF between two streams is not supported yet "
            "(RisingWave's ASOF JOIN of two append-only relations); declare 'b' as a table (CREATE TABLE ... WITH "
            "(path='...', key='...', time='...')) and join it with ASOF JOIN ... FOR SYSTEM_TIME AS OF <the stream's "
            "time column> for RisingWave's result, the nearest row over its whole history, final once its watermark "
            "has passed; without FOR SYSTEM_TIME AS OF each stream row",
        ),
        (  # without WITHIN: the same advice, not an interval join's (its inequality bounds no interval)
            "SELECT * FROM a ASOF JOIN b ON a.k = b.k AND b.t <= a.t",
            "line 4, column 27: job 'joined', join with 'b': ASOF between two streams is not supported yet "
            "(RisingWave's ASOF JOIN of two append-only relations); declare 'b' as a table (CREATE TABLE ... WITH "
            "(path='...', key='...', time='...')) and join it with ASOF JOIN ... FOR SYSTEM_TIME AS OF <the stream's "
            "time column>",
        ),
        (
            "SELECT * FROM t JOIN u FOR SYSTEM_TIME AS OF PROCTIME() ON t.k = u.k",
            "line 4, column 22: job 'joined', join with 'u': FOR SYSTEM_TIME AS OF and ASOF apply to stream-table "
            "joins only; remove them",
        ),
    ],
)
def test_the_job_checks_say_what_to_write_in_the_statement(query, message):
    """The job checks' advice, given for a SQL job, is in the statement's words (`WITHIN 1 HOUR`,
    not `within: 1h`), at the join's place."""
    used = {
        "a": "CREATE STREAM a WITH (path='a', time='t');",
        "b": "CREATE STREAM b WITH (path='b', time='t');",
    }
    used["t"] = "CREATE TABLE t WITH (path='t', key='k');"
    used["u"] = "CREATE TABLE u WITH (path='u', key='k');"
    named = set(re.findall(r"(?:FROM|JOIN) (\w+)", query)) & set(used)
    with pytest.raises(JobError) as error:
        compiled("\n".join(used[n] for n in sorted(named)), query)
    assert str(error.value).startswith(message)


def test_lenses_sliding_window_and_its_views():
    """Lenses' sliding-window join verbatim (WITHIN after the joined stream and after the query;
    `5s` as Lenses writes durations), its views (WITH v AS (SELECT TABLE|STREAM * FROM s)) read a
    source as a table or a stream under the view's name, INSERT INTO writes the declared output."""
    declarations = """
CREATE STREAM customers WITH (path='c', time='t');
CREATE STREAM orders WITH (path='o', time='t');
CREATE STREAM result WITH (path='out');
"""
    window = """SELECT STREAM
     customers.name
    , orders.item
FROM
    customers LEFT JOIN orders WITHIN 5s
        ON customers.id = orders.customer_id
WITHIN 5s;"""
    yaml = {
        "name": "result",
        "sources": {"customers": {"path": "c", "time": "t"}, "orders": {"path": "o", "time": "t"}},
        "from": "customers",
        "joins": [
            {"join": "orders", "type": "left", "on": "customers.id = orders.customer_id", "within": "5s"}
        ],
        "select": ["customers.name", "orders.item"],
        "output": {"path": "out"},
    }
    assert spec_from_sql(f"{declarations}INSERT INTO result\n{window}") == spec_from_dict(yaml)
    assert compiled(
        declarations.replace("CREATE STREAM result WITH (path='out');", ""), window, "result"
    ) == (spec_from_dict(yaml))
    with pytest.raises(JobError, match="the join and the query give different WITHIN windows; give one"):
        spec_from_sql(f"{declarations}INSERT INTO result\n{window.replace('WITHIN 5s;', 'WITHIN 10s;')}")
    with pytest.raises(JobError, match=re.escape("INSERT INTO results: declare the output first")):
        spec_from_sql(f"{declarations}INSERT INTO results\n{window}")
    views = LENSES_SOURCES.format(customers="c", orders="o", output="out") + LENSES_INNER
    spec = spec_from_sql(views)
    assert [(s.name, s.kind, s.path) for s in spec.sources] == [
        ("customersTable", "table", "c"),
        ("ordersStream", "stream", "o"),
    ]


def test_lenses_joins_of_more_than_two_sources_are_written_as_one_query():
    """Lenses chains joins through a view that joins (WITH customerOrders AS (SELECT ... JOIN ...));
    a job writes the chain in one query instead, and is told so."""
    statement = LENSES_SOURCES.format(customers="c", orders="o", output="out") + LENSES_INNER.replace(
        "(SELECT TABLE * FROM customers)",
        "(SELECT TABLE * FROM customers INNER JOIN orders ON orders.customer_id = customers.id)",
    )
    with pytest.raises(JobError) as error:
        spec_from_sql(statement)
    assert (
        "a WITH that joins (Lenses' way to join more than two sources) is not supported yet: write the joins in "
        "one query, FROM a JOIN b ON ... JOIN c ON ... (an N-way chain)" in str(error.value)
    )
    assert str(error.value).startswith("job: line 5, column")


def test_every_sql_example_of_the_job_spec_compiles():
    """docs/job-spec.md's SQL examples are jobs as they stand: one per family, and the chain."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "job-spec.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", text, re.S)
    assert len(blocks) >= 8
    families = set()
    for block in blocks:
        spec = spec_from_sql(block)
        for join in spec.joins:
            if join.makes_rows:
                families.add(("lateral", join.type))
                continue
            kinds = (spec.source(spec.start).kind, spec.source(join.source).kind)
            families.add(
                (*kinds, join.type == "cross", getattr(join, "as_of", None), isinstance(join, AsofLink))
            )
    assert families >= {
        ("stream", "stream", False, None, False),
        ("stream", "stream", True, None, False),
        ("stream", "table", False, "event_time", False),
        ("stream", "table", False, "arrival", False),
        ("stream", "table", False, None, True),
        ("table", "table", False, None, False),
        ("lateral", "left"),
    }


def test_ksqldbs_first_example_runs_as_printed():
    """ksqlDB's pageviews statement verbatim (EMIT CHANGES, no WITH: the output is a folder named
    after the stream, under the job's root)."""
    statement = """CREATE STREAM pageviews WITH (path='pageviews', time='viewtime');
CREATE TABLE users WITH (path='users', key='userid');
CREATE STREAM pageviews_enriched AS
  SELECT
     users.userid AS userid,
     pageid,
     regionid,
     gender
  FROM pageviews
    LEFT JOIN users ON pageviews.userid = users.userid
  EMIT CHANGES;"""
    spec = spec_from_sql(statement)
    assert (spec.output.path, spec.joins[0].type, spec.select) == (
        "pageviews_enriched",
        "left",
        ("users.userid AS userid", "pageid", "regionid", "gender"),
    )


def test_outer_join_star_columns_and_names_in_double_quotes():
    """ksqlDB's and Lenses' `OUTER JOIN` is FULL (and refused between a stream and a table, as in
    ksqlDB); `o.*` keeps its star under the declared name; a double-quoted token is a name, as in
    standard SQL and SQLstream (strings take single quotes)."""
    streams = "CREATE STREAM a WITH (path='a', time='t');\nCREATE STREAM b WITH (path='b', time='t');"
    full = compiled(streams, "SELECT x.*, b.v FROM a x OUTER JOIN b WITHIN 1 MINUTE ON x.k = b.k")
    assert (full.joins[0].type, full.select) == ("full", ("a.*", "b.v"))
    table = "CREATE STREAM a WITH (path='a', time='t');\nCREATE TABLE u WITH (path='u', key='k');"
    with pytest.raises(JobError, match="a FULL join of a stream with a table is refused"):
        compiled(table, "SELECT * FROM a OUTER JOIN u ON a.k = u.k")
    quoted = compiled(streams, """SELECT "v" FROM a JOIN b WITHIN 1 MINUTE ON a."k" = b.k WHERE b.s = 'x'""")
    assert (quoted.joins[0].on, quoted.select, quoted.where) == ("a.`k` = b.k", ("`v`",), "b.s = 'x'")


def test_lenses_join_without_on_is_on_the_keys():
    """Lenses' two equivalent queries compile to one job; a JOIN without ON where a side declares
    no key is refused, saying what to declare or write."""
    default, on_key = (
        spec_from_sql(f"{LENSES_KEYED_SOURCES}INSERT INTO target\n{query}")
        for query in (LENSES_DEFAULT_KEY, LENSES_ON_KEY)
    )
    assert default == on_key
    assert default.joins[0].on == "customers._key = orders._key"
    unkeyed = LENSES_KEYED_SOURCES.replace(
        "CREATE TABLE orders WITH (path='orders', key='_key')",
        "CREATE STREAM orders WITH (path='orders', time='t')",
    )
    with pytest.raises(JobError) as error:
        spec_from_sql(f"{unkeyed}INSERT INTO target\n{LENSES_DEFAULT_KEY}")
    assert (
        "line 7, column 21: a JOIN without ON joins two sources on their keys (Lenses' _key): declare key on both, "
        "with as many columns (customers: _key, orders: none), or write ON customers.<column> = orders.<column>"
    ) in str(error.value)


def test_a_source_joined_with_itself_needs_an_alias_per_use():
    """SQLstream joins bids with itself: each use becomes a source under its alias, declared as
    bids (tests/test_chains.py runs its statement); without aliases the two uses cannot be told apart."""
    declarations = (
        "CREATE STREAM bids WITH (path='bids', time='t');\nCREATE STREAM asks WITH (path='asks', time='t');"
    )
    spec = compiled(
        declarations,
        "SELECT b1.p, b2.p AS q FROM bids b1 JOIN asks WITHIN 1 MINUTE ON b1.k = asks.k "
        "JOIN bids b2 WITHIN 1 MINUTE ON b2.k = asks.k",
    )
    assert ([s.name for s in spec.sources], spec.start, [j.source for j in spec.joins]) == (
        ["asks", "b1", "b2"],
        "b1",
        ["asks", "b2"],
    )
    with pytest.raises(JobError) as error:
        compiled(declarations, "SELECT * FROM bids JOIN bids WITHIN 1 MINUTE ON bids.k = bids.k")
    assert "bids is joined with itself: give each use of it an alias of its own" in str(error.value)
    assert "job: line 4, column 15: bids is joined" in str(error.value)  # its first use


def test_as_of_names_the_time_column_the_lookup_is_made_at():
    """`FOR SYSTEM_TIME AS OF i.ts` is Flink's named time attribute: after an interval join it is
    that stream's time (`as_of: impressions.ts`), not the pair's output time; the one stream's own
    time column is `event_time`. A column of the table looked up, or of no source before the join,
    is refused at its place; any other column of a stream is left to the plan to check against its
    schema (Flink's processing-time `o.proc_time` is no column of a Delta table)."""
    declarations = """CREATE STREAM impressions WITH (path='i', time='ts');
CREATE STREAM clicks WITH (path='c', time='ts');
CREATE TABLE fx_rates WITH (path='fx', key='currency', time='valid_from', changelog=true);"""
    query = """SELECT i.id, c.id AS click, fx.rate
FROM impressions i
  LEFT JOIN clicks c WITHIN (0 SECONDS, 30 MINUTES) ON i.id = c.impression_id
  LEFT JOIN fx_rates FOR SYSTEM_TIME AS OF i.ts AS fx ON i.currency = fx.currency;"""
    chained = compiled(declarations, query).joins[1]
    assert (chained.as_of, chained.as_of_column) == ("impressions.ts", ("impressions", "ts"))
    assert compiled(declarations, query.replace("AS OF i.ts", "AS OF c.ts")).joins[1].as_of == "clicks.ts"
    alone = query.replace(
        "LEFT JOIN clicks c WITHIN (0 SECONDS, 30 MINUTES) ON i.id = c.impression_id\n", ""
    ).replace("c.id AS click, ", "")
    one_stream = declarations.replace("CREATE STREAM clicks WITH (path='c', time='ts');\n", "")
    assert compiled(one_stream, alone).joins[0].as_of == "event_time"
    assert compiled(one_stream, alone.replace("i.ts", "i.shown_at")).joins[0].as_of == "impressions.shown_at"
    for column, what in (
        ("fx.valid_from", "a column of fx_rates, the table looked up"),
        ("x.ts", "no column of a source before it"),
    ):
        with pytest.raises(JobError) as error:
            compiled(declarations, query.replace("AS OF i.ts", f"AS OF {column}"))
        assert str(error.value).startswith(
            f"job: joined: line 8, column 44: FOR SYSTEM_TIME AS OF {column} is {what}: write FOR SYSTEM_TIME AS "
            "OF <a time column of a stream before the join> (event time: impressions.ts, clicks.ts)"
        )
    campaigns = "CREATE TABLE campaigns WITH (path='k', key='id', time='updated');\n"
    after_a_table = query.replace(
        "  LEFT JOIN fx_rates", "  LEFT JOIN campaigns k ON i.campaign = k.id\n  LEFT JOIN fx_rates"
    ).replace("AS OF i.ts", "AS OF k.updated")
    with pytest.raises(
        JobError, match=re.escape("'campaigns' is a table; its columns say nothing of when")
    ) as error:
        compiled(campaigns + declarations, after_a_table)
    assert "clicks.ts), in FOR SYSTEM_TIME AS OF (the stream's own time column" in str(error.value)


FLINK_ORDERS = """CREATE STREAM Orders WITH (path='orders', time='t');
CREATE TEMPORARY FUNCTION table_func AS 'table_functions.split_words' LANGUAGE PYTHON;"""


@pytest.mark.parametrize(
    ("query", "join"),
    [
        (
            "SELECT order_id, tag\nFROM Orders CROSS JOIN UNNEST(tags) AS t (tag)",
            {"unnest": "tags", "as": "t", "columns": ["tag"], "type": "inner"},
        ),
        (
            "SELECT order_id, res\nFROM Orders,\nLATERAL TABLE(table_func(order_id)) t(res, pos)",
            {
                "function": "table_functions:split_words",
                "args": ["order_id"],
                "as": "t",
                "columns": ["res", "pos"],
            },
        ),
        (
            "SELECT order_id, res\nFROM Orders\nLEFT OUTER JOIN LATERAL TABLE(table_func(order_id)) t(res, pos)\n  ON TRUE",
            {
                "function": "table_functions:split_words",
                "args": ["order_id"],
                "as": "t",
                "columns": ["res", "pos"],
                "type": "left",
            },
        ),
    ],
)
def test_flinks_unnest_and_table_functions_compile_to_the_yaml_jobs(query, join):
    """Flink's array expansion and its INNER and LEFT table-function joins (004, as printed; the
    function's second column named too), with the function declared by CREATE FUNCTION."""
    spec = compiled(FLINK_ORDERS, query)
    twin = spec_from_dict(
        {
            "name": "joined",
            "sources": {"Orders": {"path": "orders", "time": "t"}},
            "from": "Orders",
            "joins": [join],
            "select": ["order_id", "tag" if "UNNEST" in query else "res"],  # as the query selects them
            "output": {"path": "out"},
        }
    )
    assert spec.joins == twin.joins
    assert spec.select == twin.select


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "SELECT * FROM Orders, LATERAL TABLE(other_func(order_id)) t(res)",
            "other_func is no declared table function; declare it first: CREATE TEMPORARY FUNCTION other_func",
        ),
        (
            "SELECT * FROM Orders RIGHT JOIN LATERAL TABLE(table_func(order_id)) t(res, pos) ON TRUE",
            "is joined INNER (a comma or CROSS JOIN) or LEFT JOIN ... ON TRUE",
        ),
        (
            "SELECT * FROM Orders LEFT JOIN LATERAL TABLE(table_func(order_id)) t(res, pos) ON t.res = 'x'",
            "is joined INNER (a comma or CROSS JOIN) or LEFT JOIN ... ON TRUE",
        ),
        ("SELECT * FROM Orders CROSS JOIN UNNEST(tags)", "name the rows UNNEST(tags) makes"),
    ],
)
def test_lateral_statements_flink_would_not_take_are_refused(query, message):
    with pytest.raises(JobError, match=re.escape(message)):
        compiled(FLINK_ORDERS, query)


def test_flinks_lookup_join_compiles_to_the_yaml_job():
    """004's lookup join as printed: Customers, declared with Flink's JDBC connector, is a database
    table looked up by key; `FOR SYSTEM_TIME AS OF o.proc_time` is when the row is processed."""
    url = "jdbc:postgresql://127.0.0.1:5432/shop"
    spec = compiled(FLINK_LOOKUP_SOURCES.format(orders="orders", url=url), FLINK_LOOKUP)
    twin = spec_from_dict(
        {
            "name": "joined",
            "sources": {"Orders": {"path": "orders", "time": "t"}},
            "from": "Orders",
            "joins": [
                {"lookup": {"url": url, "table": "customers"}, "as": "c", "on": "Orders.customer_id = c.id"}
            ],
            "select": ["Orders.order_id", "Orders.total", "c.country", "c.zip"],
            "output": {"path": "out"},
        }
    )
    assert spec.joins == twin.joins
    assert spec.select == twin.select


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("'table-name' = 'customers'", "'table-name' = 'customers', 'password' = 'x'"),
            "a password does not belong in a job file",
        ),
        (
            ("JOIN Customers", "RIGHT JOIN Customers"),
            "a lookup join of Customers is JOIN or LEFT JOIN ... ON",
        ),
    ],
)
def test_lookup_statements_flink_would_not_take_are_refused(change, message):
    text = FLINK_LOOKUP_SOURCES.format(orders="o", url="jdbc:postgresql://h/db") + FLINK_LOOKUP
    with pytest.raises(JobError, match=re.escape(message)):
        spec_from_sql(
            text.replace(*change).replace("SELECT", "CREATE STREAM out WITH (path='out') AS SELECT", 1)
        )


def test_a_function_declared_in_another_language_is_refused():
    declarations = (
        "CREATE STREAM Orders WITH (path='o', time='t');\nCREATE FUNCTION f AS 'com.acme.F' LANGUAGE JAVA;"
    )
    with pytest.raises(
        JobError, match="declare a Spark Python UDTF as CREATE TEMPORARY FUNCTION f AS 'module.udtf'"
    ):
        compiled(declarations, "SELECT * FROM Orders, LATERAL TABLE(f(x)) t(y)")


def test_risingwaves_window_join_compiles_to_the_yaml_job():
    """TUMBLE(s, ts, ...) items: the sources, windowed by ts; grace from their watermarks; the
    window_start equality stays in `on` (the plan takes it as the window join's own)."""
    spec = spec_from_sql(RISINGWAVE_WINDOW)
    twin = spec_from_dict(
        {
            "name": "window_join",
            "sources": {name: {"path": name, "time": "ts"} for name in ("s1", "s2")},
            "from": "s1",
            "joins": [
                {
                    "join": "s2",
                    "on": "s1.id = s2.id AND s1.window_start = s2.window_start",
                    "window": {"tumble": "1m"},
                    "grace": "20s",
                }
            ],
            "select": ["s1.id AS id1", "s1.value AS value1", "s2.id AS id2", "s2.value AS value2"],
            "output": {"path": "window_join"},
        }
    )
    assert spec.joins == twin.joins
    assert [(s.name, s.time) for s in spec.sources] == [(s.name, s.time) for s in twin.sources]
    hop = (
        RISINGWAVE_WINDOW.replace(
            "TUMBLE(s1, ts, interval '1' MINUTE)",
            "HOP(s1, ts, interval '1' MINUTE, interval '3' MINUTE) AS a",
        )
        .replace(
            "TUMBLE(s2, ts, interval '1' MINUTE)", "HOP(s2, ts, interval '1' MINUTE, interval '3' MINUTE)"
        )
        .replace("ON s1.id", "ON a.id")
        .replace("and s1.window_start", "and a.window_start")
    )
    (join,) = spec_from_sql(hop).joins
    assert (join.window.hop, join.window.size) == (timedelta(minutes=1), timedelta(minutes=3))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("TUMBLE(s2, ts, interval '1' MINUTE)", "TUMBLE(s2, ts, interval '2' MINUTE)"),
            "the same window function and size",
        ),
        (("TUMBLE(s2, ts, interval '1' MINUTE)", "s2"), "a window join joins two windowed streams"),
        (
            (
                "TUMBLE(s1, ts, interval '1' MINUTE)",
                "TUMBLE(s1, ts, interval '1' MINUTE, interval '5' SECOND)",
            ),
            "an offset is not supported",
        ),
        (("TUMBLE(s1, ts,", "TUMBLE(s1, id,"), "its declared time column is ts"),
        (("TUMBLE(s1, ts,", "TUMBLE(s9, ts,"), "TUMBLE reads 's9', which is not declared"),
    ],
)
def test_window_functions_that_do_not_make_a_window_join_are_refused(change, message):
    with pytest.raises(JobError, match=re.escape(message)):
        spec_from_sql(RISINGWAVE_WINDOW.replace(*change))


def test_risingwaves_create_source_declares_a_stream_whose_connector_becomes_a_path():
    """RisingWave's `CREATE SOURCE` is an append-only source: a stream (RISINGWAVE_INTERVAL declares
    its two that way); its connector's options, which name no Delta table, are refused with what
    to write instead."""
    spec = spec_from_sql(RISINGWAVE_INTERVAL)
    assert [(s.name, s.kind, s.time) for s in spec.sources] == [
        ("s1", "stream", "ts"),
        ("s2", "stream", "ts"),
    ]
    with pytest.raises(JobError) as error:
        spec_from_sql(RISINGWAVE_INTERVAL.replace("WITH (path='s1')", "WITH (connector = 'datagen')"))
    assert str(error.value) == (
        "job: source 's1': line 2, column 117: a source here is a Delta table: replace the connector and its "
        "options with path='<folder>' (or table='<catalog table>')"
    )


def shape(spec) -> list[tuple]:
    """(joined source, type, bounds in seconds or None, grace in seconds, as_of) per join."""
    return [
        (
            j.source,
            j.type,
            getattr(j, "bounds", None) and (j.bounds.lower.total_seconds(), j.bounds.upper.total_seconds()),
            j.grace.total_seconds(),
            getattr(j, "as_of", None),  # None also for the kinds that have no as_of
        )
        for j in spec.joins
    ]


DAY = 86400.0


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        (
            KSQLDB_SHIPPED_ORDERS,
            [
                ("payments", "inner", (-3600, 3600), DAY, None),
                ("shipments", "inner", (-7200, 7200), DAY, None),
            ],
        ),
        (KSQLDB_TABLES, [("B", "inner", None, DAY, None), ("C", "inner", None, DAY, None)]),
        (KSQLDB_FULL_OUTER_STAGE, "join with 'C': a FULL join of a stream with a table is refused"),
        (FLINK_ORDERS_PRODUCT.format(join="INNER JOIN"), [("Product", "inner", None, DAY, None)]),
        (FLINK_ORDERS_PRODUCT.format(join="LEFT JOIN"), [("Product", "left", None, DAY, None)]),
        (FLINK_ORDERS_PRODUCT.format(join="RIGHT JOIN"), "a RIGHT join of a stream with a table is refused"),
        (
            FLINK_ORDERS_PRODUCT.format(join="FULL OUTER JOIN"),
            "a FULL join of a stream with a table is refused",
        ),
        (RISINGWAVE_INTERVAL, [("s2", "inner", (-60, 0), 20, None)]),
    ],
)
def test_the_seeds_statements_as_printed(statement, expected):
    """ksqlDB's chains of streams and of tables and its refused FULL OUTER stage, Flink's regular
    joins of a stream with a table, RisingWave's interval join (CREATE MATERIALIZED VIEW, grace from
    its sources' watermarks): each statement as its seed prints it, after declarations."""
    if isinstance(expected, str):
        with pytest.raises(JobError, match=re.escape(expected)):
            spec_from_sql(statement)
    else:
        assert shape(spec_from_sql(statement)) == expected


def test_a_statement_sqlglot_cannot_read_is_refused_at_its_line(caplog):
    """A statement sqlglot keeps as raw text (a misspelt SELECT here) is refused at the token that
    is wrong, and sqlglot logs no warning before the message."""
    text = (
        "CREATE STREAM a WITH (path='a', time='t');\nCREATE STREAM b WITH (path='b', time='t');\n\n"
        "CREATE STREAM o WITH (path='o') AS\nSSELECT * FROM a JOIN b WITHIN 1 HOUR ON a.k = b.k;"
    )
    with pytest.raises(JobError) as error:
        spec_from_sql(text)
    assert str(error.value).startswith(
        "job: line 5, column 1 (near 'SSELECT'): the statement \"CREATE STREAM o WITH (path='o') AS\\nSSELECT"
    )
    assert not [record for record in caplog.records if record.name.startswith("sqlglot")]
    # SQLstream's hopping window, OVER (ORDER BY ...), is no window a join takes: the token is named
    window = text.replace(
        "SSELECT * FROM a JOIN",
        "SELECT * FROM a OVER (ORDER BY FLOOR(t TO HOUR)\n  RANGE CURRENT ROW) AS x JOIN",
    )
    with pytest.raises(JobError, match=re.escape("job: line 6, column 9 (near 'CURRENT'): the statement")):
        spec_from_sql(window)
