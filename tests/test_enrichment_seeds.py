"""Enrichment joins against the seeds' own examples, and the jobs they must refuse.

Every example is replayed; each kind of enrichment runs live in one of them, between its commits:
ksqlDB's LEFT join (both table forms), Flink's LEFT temporal join (both forms), RisingWave's ASOF
and its ASOF LEFT over the table's history. Live batches of every kind, INNER and LEFT, are
decided on generated histories at the kernel's level (test_kernel_enrichment.py), and live =
replay = reference end to end in test_enrichment_equivalence.py.

1. ksqlDB's "Semantics of Stream-Table Joins" table (INNER, LEFT), the table kept in both physical
   forms (an append-only changelog with NULL-value tombstones, and a Delta table updated in place
   by MERGE and DELETE); the live runner runs between the commits, so each stream row must see the
   table as it was when the row arrived, not as it is when the run happens.
2. Lenses' customers/orders example (INNER, LEFT) and its late customer.
3. Flink's currency-rates example (event-time temporal join, FOR SYSTEM_TIME AS OF order_time), the
   rates kept in both physical forms and arriving out of order.
4. RisingWave's ASOF example (ASOF and ASOF LEFT) and its process-time temporal join.
5. Enrichment jobs that cannot run fail before any data moves, saying what to change.

Golden data: tests/data/ksqldb_stream_table.json holds ksqlDB's table as printed; the other seeds'
tables are small enough to sit below, as printed in the seeds.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
from aging import vacuum
from conftest import append, at
from harness import FINAL, concurrently, delete, live_accounting, read, run_live, upsert, with_output
from pyspark.sql.types import (
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from seed_sql import (
    FLINK_SOURCES,
    FLINK_TEMPORAL,
    LENSES_INNER,
    LENSES_LEFT,
    LENSES_RIGHT,
    LENSES_SOURCES,
    RISINGWAVE_ASOF,
    RISINGWAVE_PROCTIME,
    RISINGWAVE_PROCTIME_COMMA,
    RISINGWAVE_SALES_SOURCES,
    RISINGWAVE_SOURCES,
)

from streamjoin import delta_io
from streamjoin.errors import HistoryNotRetainedError, JobError
from streamjoin.plan import bind
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict
from streamjoin.sql import spec_from_sql

DATA = Path(__file__).parent / "data"
KSQL = json.loads((DATA / "ksqldb_stream_table.json").read_text())
WITH_TABLES = FINAL + ("applied",)


def job(root, name: str, sources: dict, start: str, join: dict, select: list[str]) -> object:
    return spec_from_dict(
        {
            "name": name,
            "sources": sources,
            "from": start,
            "joins": [join],
            "select": select,
            "output": {"path": f"{root}/out_{name}"},
        }
    )


def outputs(spark, spec, *columns: str) -> Counter:
    return Counter(tuple(r[c] for c in columns) for r in read(spark, spec.output.location))


def replayed(spark, spec, start: datetime, end: datetime):
    """Replay the job into an output of its own (beside the live one); (that job, its metrics)."""
    target = with_output(spec, f"{spec.output.location}_replay")
    return target, replay(spark, target, start, end)


def check_live_accounting(spark, spec) -> dict:
    """Every live batch balances and carries what the one before left; the run's totals."""
    accounting, batches = live_accounting(spark, spec.output.location, WITH_TABLES)
    assert batches >= 1
    return accounting


# ============================================================================ 1. ksqlDB

KV = StructType(
    [StructField("k", StringType()), StructField("v", StringType()), StructField("t", TimestampType())]
)
FORMS = ("changelog", "in_place")
KSQL_RUNS = (5, 9, len(KSQL["events"]) - 1)  # live runs after b@6, after c@10, at the end


@pytest.fixture(scope="module")
def ksql(spark, tmp_path_factory):
    """The seed's events as commits, one per record, in timestamp order; live runs in between."""
    root = tmp_path_factory.mktemp("ksql_stream_table")
    paths = {"stream": f"{root}/stream", "changelog": f"{root}/changelog", "in_place": f"{root}/in_place"}
    for path in paths.values():
        spark.createDataFrame([], KV).write.format("delta").save(path)
    specs = {}
    for form in FORMS:
        table = {"path": paths[form], "kind": "table", "key": ["k"], "time": "t", "clock_skew": "0s"}
        if form == "changelog":
            table["changelog"] = True
        for how in ("inner", "left"):
            specs[(form, how)] = job(
                root,
                f"{form}_{how}",
                {"s": {"path": paths["stream"], "time": "t"}, "rates": table},
                "s",
                {"join": "rates", "type": how, "on": "s.k = rates.k"},
                ["s.v AS lv", "rates.v AS rv"],
            )
    # Live end to end: LEFT in both forms (INNER's rows are LEFT's matched ones; the live runner's
    # INNER decisions are proven at the kernel level, test_kernel_enrichment.py); replays: all four.
    runners = [
        LiveRunner(spark, spec, f"{root}/checkpoint_{spec.name}")
        for (_, how), spec in specs.items()
        if how == "left"
    ]
    for index, (second, side, value) in enumerate(KSQL["events"]):
        if side == "l":  # a NULL record: NULL key and value (rejected, counted)
            append(spark, paths["stream"], [(None if value is None else "k", value, at(second))], KV)
        else:
            append(spark, paths["changelog"], [("k", value, at(second))], KV)  # NULL value: tombstone
            if value is None:
                delete(spark, paths["in_place"], "k = 'k'")
            else:
                upsert(spark, paths["in_place"], [("k", value, at(second))], KV, ("k",))
        if index in KSQL_RUNS:
            run_live(runners)
    replays = concurrently(
        {key: (lambda s=spec: replayed(spark, s, at(0), at(100))) for key, spec in specs.items()}
    )
    return SimpleNamespace(specs=specs, replays=replays)


def ksql_expected(how: str) -> Counter:
    return Counter((lv, rv, at(second)) for second, lv, rv in KSQL["expected"][how])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("how", ("inner", "left"))
def test_ksqldb_stream_table_semantics_both_runners(spark, ksql, form, how):
    spec = ksql.specs[(form, how)]
    unmatched = {"inner": "unmatched_dropped", "left": "unmatched_emitted"}[how]
    jobs = [ksql.replays[(form, how)][0]]
    if how == "left":  # run live too
        jobs.append(spec)
        live = outputs(spark, spec, "lv", "rv", "event_time")
        assert live == ksql_expected(how)
        accounting = check_live_accounting(spark, spec)
        # Stream: 4 values and 5 NULL records. Table: 6 changes (4 values, 2 tombstones; the in-place
        # DELETE at 2 finds no row, so that form records 5).
        assert accounting["s"]["rows_in"] == 9 and accounting["s"]["rejected"] == 5
        assert accounting["s"]["joined"] == 2 and accounting["s"][unmatched] == 2
        assert (
            accounting["rates"]["applied"]
            == accounting["rates"]["rows_in"]
            == (6 if form == "changelog" else 5)
        )

    target, metrics = ksql.replays[(form, how)]
    assert outputs(spark, target, "lv", "rv", "event_time") == ksql_expected(how)
    assert (
        metrics.balanced()
        and metrics.sources["s"].joined == 2
        and getattr(metrics.sources["s"], unmatched) == 2
    )
    for job_ in jobs:  # the NULL records, once each, in each runner's side table
        assert Counter(r.reason for r in read(spark, job_.output.side("rejected"))) == Counter(
            {"null_key": 5}
        )


# ============================================================================ 2. Lenses

CUSTOMERS = StructType([StructField("id", IntegerType()), StructField("name", StringType())])
ORDERS = StructType(
    [
        StructField("customer_id", IntegerType()),
        StructField("item", StringType()),
        StructField("t", TimestampType()),
    ]
)


def lenses_job(root, customers: str, orders: str, how: str, name: str):
    return job(
        root,
        name,
        {  # in the order of the seed's views
            "customersTable": {"path": customers, "kind": "table", "key": ["id"], "clock_skew": "0s"},
            "ordersStream": {"path": orders, "time": "t"},
        },
        "ordersStream",
        {"join": "customersTable", "type": how, "on": "customersTable.id = ordersStream.customer_id"},
        ["customersTable.name", "ordersStream.item"],
    )


def lenses_statement(root, customers: str, orders: str, statement: str, name: str):
    """A Lenses statement as the seed prints it (its views and INSERT INTO), writing to `name`."""
    declarations = LENSES_SOURCES.format(customers=customers, orders=orders, output=f"{root}/out_{name}")
    return spec_from_sql((declarations + statement).replace("result", name))


def test_lenses_customers_and_orders(spark, tmp_path):
    """Lenses' statements (views, INSERT INTO), replayed, give the seed's rows; its RIGHT JOIN of
    the table with the stream is the mirror of the LEFT JOIN, and runs as that. (Live runs of
    this family between commits: the ksqlDB fixture above, and test_kernel_enrichment.py's
    generated histories.)"""
    customers, orders = str(tmp_path / "customers"), str(tmp_path / "orders")
    upsert(spark, customers, [(1, "John"), (2, "Frank")], CUSTOMERS, ("id",))
    append(spark, orders, [(1, "Computer", at(1)), (1, "Mouse", at(2)), (3, "Keyboard", at(3))], ORDERS)
    statements = {"inner": LENSES_INNER, "left": LENSES_LEFT}
    specs = {
        how: lenses_statement(tmp_path, customers, orders, statements[how], f"lenses_{how}")
        for how in statements
    }
    for how, spec in specs.items():
        assert spec == lenses_job(tmp_path, customers, orders, how, f"lenses_{how}")
    right = lenses_statement(tmp_path, customers, orders, LENSES_RIGHT, "lenses_left")
    assert right == specs["left"]
    expected = {
        "inner": Counter({("John", "Computer"): 1, ("John", "Mouse"): 1}),
        "left": Counter({("John", "Computer"): 1, ("John", "Mouse"): 1, (None, "Keyboard"): 1}),
    }
    replays = concurrently(
        {how: (lambda s=spec: replay(spark, s, at(0), at(10))) for how, spec in specs.items()}
    )
    for how, spec in specs.items():
        assert outputs(spark, spec, "name", "item") == expected[how]
        assert replays[how].balanced()
    assert replays["inner"].sources["ordersStream"].unmatched_dropped == 1
    assert replays["left"].sources["ordersStream"].unmatched_emitted == 1


def test_lenses_late_customer(spark, tmp_path):
    """The Keyboard order for customer 2 arrives before customer 2 does. The order is enriched
    with the table as it was when the order arrived: NULL. Table changes never trigger output
    (ksqlDB; Lenses' page prints an extra [John, Keyboard], docs/semantics.md says why not), but
    an order arriving after John does join him. The replay decides by the commits' order, as a
    live run between them would (the ksqlDB fixture runs live between such commits)."""
    customers, orders = str(tmp_path / "customers"), str(tmp_path / "orders")
    upsert(spark, customers, [(1, "Frank")], CUSTOMERS, ("id",))
    append(spark, orders, [(1, "Computer", at(0)), (2, "Keyboard", at(1))], ORDERS)
    upsert(spark, customers, [(2, "John")], CUSTOMERS, ("id",))
    append(spark, orders, [(2, "Mouse", at(10))], ORDERS)
    spec = lenses_job(tmp_path, customers, orders, "left", "late_customer")
    metrics = replay(spark, spec, at(-10), at(100))
    expected = Counter({("Frank", "Computer"): 1, (None, "Keyboard"): 1, ("John", "Mouse"): 1})
    assert outputs(spark, spec, "name", "item") == expected
    assert (
        metrics.sources["ordersStream"].joined == 2 and metrics.sources["ordersStream"].unmatched_emitted == 1
    )


# ============================================================================ 3. Flink

FLINK_ORDERS = StructType(
    [
        StructField("order_id", StringType()),
        StructField("price", DecimalType(32, 2)),
        StructField("currency", StringType()),
        StructField("order_time", TimestampType()),
    ]
)
RATES = StructType(
    [
        StructField("currency", StringType()),
        StructField("conversion_rate", DecimalType(32, 2)),
        StructField("update_time", TimestampType()),
    ]
)


def hm(clock: str) -> datetime:
    hours, minutes = map(int, clock.split(":"))
    return datetime(2024, 1, 1, hours, minutes)


@pytest.fixture(scope="module")
def flink(spark, tmp_path_factory):
    """Orders and rates arrive out of order: the 12:05 rate is committed after both orders, so
    the 12:06 order must wait for it (a processing-time join would give it 1.14)."""
    root = tmp_path_factory.mktemp("flink_rates")
    orders, changelog, in_place = f"{root}/orders", f"{root}/rates_log", f"{root}/rates"
    specs, twins = {}, {}
    for form, path in (("changelog", changelog), ("in_place", in_place)):
        rates = {"path": path, "kind": "table", "key": ["currency"], "time": "update_time"}
        if form == "changelog":
            rates["changelog"] = True
        for how in ("left", "inner"):
            name = f"{form}_{how}"
            # The seed's statement as the job that runs (INNER: its JOIN without LEFT); its YAML twin.
            declarations = FLINK_SOURCES.format(
                orders=orders, rates=path, changelog=", changelog=true" if form == "changelog" else ""
            )
            query = FLINK_TEMPORAL if how == "left" else FLINK_TEMPORAL.replace("LEFT JOIN", "JOIN")
            specs[(form, how)] = spec_from_sql(
                f"{declarations}\nCREATE STREAM {name} WITH (path='{root}/out_{name}') AS\n{query}"
            )
            twins[(form, how)] = job(
                root,
                name,
                {"orders": {"path": orders, "time": "order_time"}, "currency_rates": rates},
                "orders",
                {
                    "join": "currency_rates",
                    "type": how,
                    "on": "orders.currency = currency_rates.currency",
                    "as_of": "event_time",
                    "grace": "15s",
                },
                ["order_id", "price", "orders.currency", "conversion_rate", "order_time"],
            )

    def rate(currency: str, value: str, clock: str) -> None:
        row = [(currency, Decimal(value), hm(clock))]
        append(spark, changelog, row, RATES)
        upsert(spark, in_place, row, RATES, ("currency",))

    rate("EUR", "1.14", "11:50")
    append(spark, orders, [("o_001", Decimal("11.11"), "EUR", hm("12:00"))], FLINK_ORDERS)
    append(spark, orders, [("o_002", Decimal("12.51"), "EUR", hm("12:06"))], FLINK_ORDERS)
    # Live end to end: Flink's LEFT JOIN in both forms; INNER (the same rows here) in the replay.
    live_specs = {key: spec for key, spec in specs.items() if key[1] == "left"}
    runners = [LiveRunner(spark, spec, f"{root}/checkpoint_{spec.name}") for spec in live_specs.values()]
    run_live(runners)
    early = {
        key: read(spark, spec.output.location) if delta_io.exists(spark, spec.output.location) else []
        for key, spec in live_specs.items()
    }
    rate("EUR", "1.10", "12:05")
    rate("EUR", "1.12", "12:30")  # moves the rates' watermark (12:30 - 15 s) past both orders
    run_live(runners)
    live = {key: outputs(spark, spec, "order_id", "conversion_rate") for key, spec in live_specs.items()}
    replays = concurrently(
        {key: (lambda s=spec: replayed(spark, s, hm("11:00"), hm("13:00"))) for key, spec in specs.items()}
    )
    return SimpleNamespace(specs=specs, twins=twins, early=early, live=live, replays=replays)


@pytest.mark.parametrize("form", ("changelog", "in_place"))
@pytest.mark.parametrize("how", ("left", "inner"))
def test_flink_currency_rates(spark, flink, form, how):
    """Flink's own statement, run live and replayed, gives the seed's rows; it is the job its YAML
    twin describes (the watermarks' 15 s delay its grace)."""
    assert flink.specs[(form, how)] == flink.twins[(form, how)]
    expected = Counter({("o_001", Decimal("1.14")): 1, ("o_002", Decimal("1.10")): 1})
    target, metrics = flink.replays[(form, how)]
    written = [target]
    if how == "left":  # run live too
        spec = flink.specs[(form, how)]
        written.append(spec)
        assert flink.early[(form, how)] == []  # both orders waited for the rates' watermark
        assert flink.live[(form, how)] == expected
        accounting = check_live_accounting(spark, spec)
        assert accounting["orders"]["joined"] == 2 and accounting["currency_rates"]["applied"] == 3
    for job_ in written:
        rows = {r.order_id: r for r in read(spark, job_.output.location)}
        assert rows["o_002"].order_time == hm("12:06") and rows["o_002"].event_time == hm("12:06")
    assert outputs(spark, target, "order_id", "conversion_rate") == expected
    assert metrics.sources["orders"].joined == 2 and metrics.sources["currency_rates"].applied == 3


def test_as_of_a_named_time_column_looks_the_table_up_at_that_time(spark, tmp_path):
    """Flink's `FOR SYSTEM_TIME AS OF o.promised_at` naming a column other than the stream's time
    (`as_of: orders.promised_at`): each order gets the rate valid at its promised time, and waits
    while that time is above the table's watermark; a NULL promised time matches no rate (LEFT
    pads). Live between the commits and replayed alike; `event_time` gives the order time's rate."""
    orders, rates = f"{tmp_path}/orders", f"{tmp_path}/rates"
    order_schema = StructType(
        [
            StructField("id", StringType()),
            StructField("currency", StringType()),
            StructField("t", TimestampType()),
            StructField("promised_at", TimestampType()),
        ]
    )
    rate_schema = StructType(
        [
            StructField("currency", StringType()),
            StructField("rate", IntegerType()),
            StructField("t", TimestampType()),
        ]
    )
    append(spark, rates, [("EUR", 1, at(0)), ("EUR", 2, at(100)), ("EUR", 3, at(200))], rate_schema)
    append(
        spark,
        orders,
        [("o1", "EUR", at(50), at(150)), ("o2", "EUR", at(120), at(250)), ("o3", "EUR", at(10), None)],
        order_schema,
    )
    sources = {
        "orders": {"path": orders, "time": "t"},
        "rates": {"path": rates, "kind": "table", "key": ["currency"], "time": "t", "changelog": True},
    }

    def enrich(name: str, as_of: str):
        body = {
            "join": "rates",
            "type": "left",
            "on": "orders.currency = rates.currency",
            "as_of": as_of,
            "grace": "0s",
        }
        return job(tmp_path, name, sources, "orders", body, ["orders.id AS id", "rates.rate AS rate"])

    named = enrich("promised", "orders.promised_at")
    runner = LiveRunner(spark, named, f"{tmp_path}/checkpoint")
    runner.run()
    assert outputs(spark, named, "id", "rate") == Counter(
        {("o1", 2): 1, ("o3", None): 1}
    )  # o2 waits: 250 > 200
    append(spark, rates, [("EUR", 4, at(300))], rate_schema)
    runner.run()
    expected = Counter({("o1", 2): 1, ("o2", 3): 1, ("o3", None): 1})
    assert outputs(spark, named, "id", "rate") == expected
    target, metrics = replayed(spark, named, at(0), at(400))
    assert outputs(spark, target, "id", "rate") == expected and metrics.balanced()
    at_event_time = enrich("event_time", "event_time")
    replay(spark, at_event_time, at(0), at(400))
    assert outputs(spark, at_event_time, "id", "rate") == Counter({("o1", 1): 1, ("o2", 2): 1, ("o3", 1): 1})


# ============================================================================ 4. RisingWave ASOF

PRICES = StructType(
    [
        StructField("stock_name", StringType()),
        StructField("stock_time", TimestampType()),
        StructField("price", IntegerType()),
    ]
)
MARKET = StructType(
    [
        StructField("stock_name", StringType()),
        StructField("market_time", TimestampType()),
        StructField("sentiment", DoubleType()),
    ]
)


def day(clock: str) -> datetime:
    hours, minutes = map(int, clock.split(":"))
    return datetime(2024, 9, 24, hours, minutes)


STOCK_PRICES = [
    ("TSLA", day("09:30"), 250),
    ("TSLA", day("10:30"), 252),
    ("TSLA", day("11:30"), 255),
    ("AMZN", day("09:30"), 3300),
    ("AMZN", day("10:30"), 3310),
    ("AMZN", day("11:30"), 3320),
    ("GOOG", day("09:30"), 1400),
    ("GOOG", day("10:30"), 1410),
    ("GOOG", day("11:30"), 1420),
]
MARKET_DATA = [
    ("TSLA", day("09:00"), 0.7),
    ("TSLA", day("10:00"), 0.8),
    ("TSLA", day("11:00"), 0.9),
    ("AMZN", day("09:00"), 0.6),
    ("AMZN", day("10:00"), 0.65),
    ("AMZN", day("11:00"), 0.7),
    ("NVDA", day("09:00"), 0.55),
    ("NVDA", day("10:00"), 0.6),
    ("NVDA", day("11:00"), 0.65),
]
ASOF_INNER = [
    ("TSLA", day("09:30"), 250, 0.7),
    ("TSLA", day("10:30"), 252, 0.8),
    ("TSLA", day("11:30"), 255, 0.9),
    ("AMZN", day("09:30"), 3300, 0.6),
    ("AMZN", day("10:30"), 3310, 0.65),
    ("AMZN", day("11:30"), 3320, 0.7),
]
ASOF_LEFT = ASOF_INNER + [
    ("GOOG", day("09:30"), 1400, None),
    ("GOOG", day("10:30"), 1410, None),
    ("GOOG", day("11:30"), 1420, None),
]


def test_risingwave_asof(spark, tmp_path):
    """RisingWave's ASOF statement, run live and replayed, and its ASOF LEFT JOIN, replayed, give
    the rows the seed prints. (ASOF LEFT live: test_kernel_enrichment.py's generated histories.)"""
    prices, market = str(tmp_path / "stock_prices"), str(tmp_path / "market_data")
    upsert(spark, market, MARKET_DATA, MARKET, ("stock_name", "market_time"))
    append(spark, prices, STOCK_PRICES, PRICES)
    declarations = RISINGWAVE_SOURCES.format(prices=prices, market=market)
    specs = {
        how: spec_from_sql(
            f"{declarations}\nCREATE STREAM asof_{how} WITH (path='{tmp_path}/out_asof_{how}') AS\n"
            + (RISINGWAVE_ASOF if how == "inner" else RISINGWAVE_ASOF.replace("ASOF JOIN", "ASOF LEFT JOIN"))
        )
        for how in ("inner", "left")
    }
    expected = {"inner": Counter(ASOF_INNER), "left": Counter(ASOF_LEFT)}
    columns = ("stock_name", "stock_time", "price", "sentiment")
    live = LiveRunner(spark, specs["inner"], f"{tmp_path}/ck_inner").run(600)
    assert outputs(spark, specs["inner"], *columns) == expected["inner"]
    assert all(m.balanced() for m in live)
    replays = concurrently(
        {how: (lambda s=spec: replayed(spark, s, day("00:00"), day("23:00"))) for how, spec in specs.items()}
    )
    for how, (target, _) in replays.items():
        assert outputs(spark, target, *columns) == expected[how]
    left, inner = replays["left"][1], replays["inner"][1]
    assert left.sources["stock_prices"].unmatched_emitted == 3 and left.sources["stock_prices"].joined == 6
    assert inner.sources["stock_prices"].unmatched_dropped == 3
    # market_data declares no time column: its versions are its commits, and a replay slice owns (counts)
    # the changes whose commit time it holds; the live run counts each change once.
    assert sum(m.sources["market_data"].applied for m in live) == 9
    assert inner.sources["market_data"].applied == 0


# RisingWave's ASOF JOIN relates two append-only relations, whichever row arrives first. Here the
# market data arrives after the prices, as a second stream would: the arrival rule (asof alone)
# finds nothing, and as_of: event_time (ASOF over the table's history) gives RisingWave's result.
# A price is final once the market data's watermark has passed it (grace 0s: its largest
# market_time), so the 11:30 prices wait live; a replay of the closed history answers them.
ASOF_FOLLOWING_LEFT = [  # md.market_time >= sp.stock_time: the next sentiment after each price
    ("TSLA", day("09:30"), 250, 0.8),
    ("TSLA", day("10:30"), 252, 0.9),
    ("TSLA", day("11:30"), 255, None),
    ("AMZN", day("09:30"), 3300, 0.65),
    ("AMZN", day("10:30"), 3310, 0.7),
    ("AMZN", day("11:30"), 3320, None),
    ("GOOG", day("09:30"), 1400, None),
    ("GOOG", day("10:30"), 1410, None),
    ("GOOG", day("11:30"), 1420, None),
]


def test_risingwave_asof_over_the_history_with_the_market_data_arriving_after_the_prices(spark, tmp_path):
    prices, market = str(tmp_path / "stock_prices"), str(tmp_path / "market_data")
    append(spark, prices, STOCK_PRICES, PRICES)
    for hour in ("09:00", "10:00", "11:00"):  # one commit per hour of market data, after every price
        upsert(
            spark,
            market,
            [r for r in MARKET_DATA if r[1] == day(hour)],
            MARKET,
            ("stock_name", "market_time"),
        )
    sources = {
        "sp": {"path": prices, "time": "stock_time"},
        "md": {"path": market, "kind": "table", "key": ["stock_name", "market_time"], "time": "market_time"},
    }
    columns = ("stock_name", "stock_time", "price", "sentiment")

    def asof_job(name: str, how: str, inequality: str, **join):
        on = f"sp.stock_name = md.stock_name AND {inequality}"
        body = {"join": "md", "type": how, "asof": True, "on": on, "grace": "0s", **join}
        return job(
            tmp_path,
            name,
            sources,
            "sp",
            body,
            ["sp.stock_name", "sp.stock_time", "sp.price", "md.sentiment"],
        )

    preceding = "md.market_time <= sp.stock_time"
    specs = {how: asof_job(f"history_{how}", how, preceding, as_of="event_time") for how in ("inner", "left")}
    # Live for ASOF LEFT; INNER's live batches over the history: test_kernel_enrichment.py.
    live = LiveRunner(spark, specs["left"], f"{tmp_path}/ck_left").run(600)
    answered = {
        how: Counter(r for r in rows if r[1] < day("11:00"))
        for how, rows in (("inner", ASOF_INNER), ("left", ASOF_LEFT))
    }
    assert outputs(spark, specs["left"], *columns) == answered["left"]
    assert all(m.balanced() for m in live)
    assert live[-1].sources["sp"].open == 3  # the 11:30 prices: market data up to 11:30 may still come
    for how, spec in specs.items():
        target, metrics = replayed(spark, spec, day("00:00"), day("23:00"))
        assert outputs(spark, target, *columns) == answered[how]
        assert metrics.sources["sp"].open == 3
        closed = replay(spark, target, day("00:00"), day("23:00"), RunOptions(closed=True))
        assert outputs(spark, target, *columns) == Counter(ASOF_INNER if how == "inner" else ASOF_LEFT), how
        assert closed.balanced() and closed.sources["sp"].open == 0

    arrival = asof_job("arrival_inner", "inner", preceding)
    replay(spark, arrival, day("00:00"), day("23:00"), RunOptions(closed=True))
    assert outputs(spark, arrival, *columns) == Counter()  # no market row had arrived before a price

    following = asof_job("history_following", "left", "md.market_time >= sp.stock_time", as_of="event_time")
    metrics = replay(spark, following, day("00:00"), day("23:00"))
    decided = Counter(r for r in ASOF_FOLLOWING_LEFT if r[3] is not None and r[1] < day("10:30"))
    assert outputs(spark, following, *columns) == decided  # the 11:00 rows are at the watermark
    assert metrics.sources["sp"].open == 9 - sum(decided.values())
    replay(spark, following, day("00:00"), day("23:00"), RunOptions(closed=True))
    assert outputs(spark, following, *columns) == Counter(ASOF_FOLLOWING_LEFT)


SALES = StructType(
    [
        StructField("transaction_id", IntegerType()),
        StructField("product_id", IntegerType()),
        StructField("quantity", IntegerType()),
        StructField("sale_date", DateType()),
        StructField("process_time", TimestampType()),
    ]
)
PRODUCTS = StructType(
    [
        StructField("id", IntegerType()),
        StructField("product_name", StringType()),
        StructField("price", IntegerType()),
    ]
)


def test_risingwave_process_time_temporal_join(spark, tmp_path):
    """RisingWave's statement as printed (bare column names, FOR SYSTEM_TIME AS OF PROCTIME()),
    with the products changing between the sales as the seed shows them: each sale gets the price
    of its moment, replayed (processing-time joins run live under several triggers in
    test_enrichment_equivalence.py). Its comma form binds to the same join."""
    sales, products = str(tmp_path / "sales"), str(tmp_path / "products")
    declarations = RISINGWAVE_SALES_SOURCES.format(sales=sales, products=products)

    def statement(name: str, query: str):
        return spec_from_sql(
            f"{declarations}CREATE STREAM {name} WITH (path='{tmp_path}/{name}') AS\n{query}"
        )

    spec = statement("wide_sales", RISINGWAVE_PROCTIME)
    sale = {
        1: (1, 101, 3, date(2023, 6, 18), datetime(2023, 6, 18, 10, 15)),
        2: (2, 102, 2, date(2023, 6, 19), datetime(2023, 6, 19, 15, 30)),
        3: (3, 101, 1, date(2023, 6, 20), datetime(2023, 6, 20, 11, 45)),
    }
    upsert(spark, products, [(101, "Product A", 25), (102, "Product B", 15)], PRODUCTS, ("id",))
    append(spark, sales, [sale[1]], SALES)
    upsert(spark, products, [(101, "Product A", 22)], PRODUCTS, ("id",))
    append(spark, sales, [sale[2]], SALES)
    upsert(spark, products, [(102, "Product B", 18)], PRODUCTS, ("id",))
    append(spark, sales, [sale[3]], SALES)
    printed = Counter(
        [
            (1, 101, 3, date(2023, 6, 18), "Product A", 25),
            (2, 102, 2, date(2023, 6, 19), "Product B", 15),
            (3, 101, 1, date(2023, 6, 20), "Product A", 22),
        ]
    )
    columns = ("transaction_id", "product_id", "quantity", "sale_date", "product_name", "price")
    metrics = replay(spark, spec, datetime(2023, 6, 18), datetime(2023, 6, 21))
    assert outputs(spark, spec, *columns) == printed
    assert metrics.balanced() and metrics.sources["sales"].joined == 3
    comma = bind(spark, statement("wide_sales_comma", RISINGWAVE_PROCTIME_COMMA))
    assert [(j.family, j.equi, j.spec.type) for j in comma.joins] == [
        ("stream-table", (("sales.product_id", "products.id"),), "inner")
    ]
    assert comma.select == bind(spark, spec).select


def refused_asof(spark, tmp_path, table: dict, join: dict) -> str:
    """The message binding a one-row ASOF job gives (prices `sp`, market data `md` with `table`)."""
    prices, market = str(tmp_path / "p"), str(tmp_path / "m")
    append(spark, prices, STOCK_PRICES[:1], PRICES)
    append(spark, market, MARKET_DATA[:1], MARKET)
    sources = {"sp": {"path": prices, "time": "stock_time"}, "md": {"path": market, "kind": "table", **table}}
    spec = job(tmp_path, "asof_bad", sources, "sp", {"join": "md", "asof": True, **join}, ["sp.price"])
    with pytest.raises(JobError) as error:
        bind(spark, spec)
    return str(error.value)


def test_asof_over_the_history_orders_by_the_tables_version_time(spark, tmp_path):
    """The watermark that makes an answer final is the version time's: another column is refused."""
    message = refused_asof(
        spark,
        tmp_path,
        {"key": ["stock_name"], "time": "market_time"},
        {"as_of": "event_time", "on": "sp.stock_name = md.stock_name AND md.sentiment <= sp.price"},
    )
    assert "the inequality compares md.sentiment" in message
    assert "compare md.market_time in the inequality, or drop as_of" in message


# ============================================================================ 5. errors


def test_a_condition_naming_no_source_is_refused(spark, tmp_path):
    """A misspelt alias (SQLstream's own examples have some) is named, not taken for a missing equality."""
    message = refused_asof(spark, tmp_path, {"key": ["stock_name"]}, {"on": "xp.stock_name = md.stock_name"})
    assert "the condition names xp.stock_name, but 'xp' is not a source of this join (sp, md)" in message


def test_a_bare_column_two_sources_have_is_refused(spark, tmp_path):
    message = refused_asof(
        spark,
        tmp_path,
        {"key": ["stock_name"]},
        {"on": "stock_name = md.stock_name AND md.market_time <= sp.stock_time"},
    )
    assert "column 'stock_name' is in sp and md; say which, e.g. sp.stock_name" in message


def test_temporal_join_without_a_primary_key_is_refused(tmp_path):
    with pytest.raises(JobError) as error:
        job(
            tmp_path,
            "nokey",
            {"orders": {"path": "o", "time": "order_time"}, "rates": {"path": "r", "kind": "table"}},
            "orders",
            {
                "join": "rates",
                "type": "left",
                "on": "orders.currency = rates.currency",
                "as_of": "event_time",
            },
            ["orders.order_id"],
        )
    message = str(error.value)
    assert "event-time temporal join against table 'rates' needs the table's primary key" in message
    assert "add key: [<column>, ...] to source 'rates'" in message


@pytest.mark.parametrize(
    "condition, found",
    [
        ("sp.stock_name = md.stock_name", "found none"),
        (
            "sp.stock_name = md.stock_name AND md.market_time <= sp.stock_time AND md.sentiment > sp.price",
            "found 2",
        ),
    ],
)
def test_asof_needs_exactly_one_inequality(spark, tmp_path, condition, found):
    message = refused_asof(spark, tmp_path, {"key": ["stock_name", "market_time"]}, {"on": condition})
    assert "an ASOF join needs exactly one inequality" in message
    assert found in message


def test_replay_of_a_vacuumed_table_is_refused_before_data_moves(spark, tmp_path):
    prices, market = str(tmp_path / "p"), str(tmp_path / "m")
    append(spark, prices, STOCK_PRICES[:3], PRICES)
    upsert(spark, market, MARKET_DATA[:3], MARKET, ("stock_name", "market_time"))
    upsert(spark, market, [("TSLA", day("09:00"), 0.1)], MARKET, ("stock_name", "market_time"))
    vacuum(spark, market)
    spec = job(
        tmp_path,
        "vacuumed",
        {
            "sp": {"path": prices, "time": "stock_time"},
            "md": {"path": market, "kind": "table", "key": ["stock_name", "market_time"]},
        },
        "sp",
        {"join": "md", "type": "left", "on": "sp.stock_name = md.stock_name"},
        ["sp.price", "md.sentiment"],
    )
    with pytest.raises(HistoryNotRetainedError) as error:
        replay(spark, spec, day("00:00"), day("23:00"))
    assert str(tmp_path / "m") in str(error.value) and "VACUUM ran at" in str(error.value)
    assert not delta_io.exists(spark, spec.output.location)  # nothing was written
