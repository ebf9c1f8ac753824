"""Interval joins against the seeds' own tables, in both runners, and the job errors they must refuse.

1. ksqlDB's "Semantics of Stream-Stream Joins" table (WITHIN 15 s, grace 5 s): INNER, LEFT and
   FULL results row for row, by the replay runner (exact mode) and by the live runner run
   available-now a few times between the commits.
2. SQLstream's stocks example (1-minute RANGE windows on both sides, endpoints included) as
   `within: 1m`: its INNER rows in both runners, and its LEFT, RIGHT and FULL listings, which show
   eager emission, with `emit: eager` (FULL live too, in both commit orders).
3. Interval jobs that cannot run fail before any data moves, saying what to change.

Golden data: tests/data/ksqldb_stream_stream.json and tests/data/sqlstream_stocks.json hold the
seeds' input and output tables as printed (plus the corrections the seed's own data imply).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import append, at
from harness import concurrently, live_accounting, read, run_live, source_counts
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType
from seed_sql import SQLSTREAM_LEFT, SQLSTREAM_STOCKS_SOURCES

from streamjoin.errors import JobError
from streamjoin.plan import bind
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict
from streamjoin.sql import spec_from_sql

DATA = Path(__file__).parent / "data"
KSQL = json.loads((DATA / "ksqldb_stream_stream.json").read_text())
STOCKS = json.loads((DATA / "sqlstream_stocks.json").read_text())

# ============================================================================ 1. ksqlDB

KV = StructType(
    [StructField("k", StringType()), StructField("v", StringType()), StructField("t", TimestampType())]
)
KSQL_TYPES = ("inner", "left", "full")
# Live end to end: the join type that pads both sides. The live runner's decisions for every join
# type are proven against the reference at the kernel level (test_kernel_interval.py); the seed's
# rows for each type are checked here in the replay, and live = replay for FULL.
KSQL_LIVE = "full"

# Why two trailing rows. ksqlDB writes [null, f] at timestamp 100, when its stream time reaches
# exactly 100: it closes f's window once stream time - grace >= 80 + 15, inclusive. Our rule is
# strict: a padded right row is written once the watermark (largest settled event time - grace)
# is strictly above r.t - lower = 95, so G at 100 (watermark exactly 95) is not enough; the first
# event beyond 100 is. Second, rows are processed only up to the frontier (the oldest of the
# sources' newest commits), so G, the last commit of the seed (left), is settled only when the
# right side commits after it, and that right commit only when the left commits again. Hence one
# right row at 101 (settles G, watermark 96 > 95, so [null, f] comes out) and one left row at 102
# (settles the right one and itself waits, `unsettled`). Both carry key 'z': they never join and
# their own windows stay open, so they add no output row.
TRAILING = [(101, "r", "tail"), (102, "l", "tail")]
KSQL_EVENTS = [(s, side, v, None if v is None else "k") for s, side, v in KSQL["events"]] + [
    (s, side, v, "z") for s, side, v in TRAILING
]
# Live runs after these events (indexes into KSQL_EVENTS): b@6, E@40, the last trailing row.
KSQL_RUNS = (5, 15, len(KSQL_EVENTS) - 1)

# Where every input row ends (the same in both runners). Left: 3 NULL records, A-D joined, E and F
# unmatched, G still open (its window ends at 115), the trailing row at 102 unsettled. Right:
# 4 NULL records, a-d joined, f unmatched, the trailing row at 101 open.
_L = {"rows_in": 11, "rejected": 3, "late": 0, "joined": 4, "open": 1, "unsettled": 1}
_R = {"rows_in": 10, "rejected": 4, "late": 0, "joined": 4, "open": 1, "unsettled": 0}
KSQL_ACCOUNTING = {
    "inner": {
        "l": {**_L, "unmatched_emitted": 0, "unmatched_dropped": 2},
        "r": {**_R, "unmatched_emitted": 0, "unmatched_dropped": 1},
    },
    "left": {
        "l": {**_L, "unmatched_emitted": 2, "unmatched_dropped": 0},
        "r": {**_R, "unmatched_emitted": 0, "unmatched_dropped": 1},
    },
    "full": {
        "l": {**_L, "unmatched_emitted": 2, "unmatched_dropped": 0},
        "r": {**_R, "unmatched_emitted": 1, "unmatched_dropped": 0},
    },
}


def ksql_spec(root: Path, join_type: str, runner: str):
    return spec_from_dict(
        {
            "name": f"ksql_{join_type}_{runner}",
            "sources": {
                "l": {"path": str(root / "l"), "time": "t"},
                "r": {"path": str(root / "r"), "time": "t"},
            },
            "from": "l",
            "joins": [
                {
                    "join": "r",
                    "type": join_type,
                    "on": "l.k = r.k",
                    "within": KSQL["within"],
                    "grace": KSQL["grace"],
                }
            ],
            "select": ["l.v AS lv", "r.v AS rv"],
            "output": {"path": str(root / f"out_{join_type}_{runner}")},
        }
    )


def ksql_pairs(rows) -> Counter:
    return Counter((r.lv, r.rv) for r in rows)


def ksql_expected(join_type: str, upto: int | None = None) -> Counter:
    """The seed's rows for a join type, as (left, right) pairs; `upto`: those triggered at or before it."""
    return Counter((lv, rv) for when, lv, rv in KSQL["expected"][join_type] if upto is None or when <= upto)


def ksql_expected_times(join_type: str) -> Counter:
    """(output event time, left, right): a joined row is at the later input's time, which is the
    timestamp of the record that triggers it in ksqlDB's table; a padded row is at its own time
    (ksqlDB lists it later, when its window closes)."""
    own = {v: s for s, _, v in KSQL["events"] if v is not None}
    return Counter(
        (at(when) if lv is not None and rv is not None else at(own[lv if lv is not None else rv]), lv, rv)
        for when, lv, rv in KSQL["expected"][join_type]
    )


def check_ksql_rejected(spark, output: str) -> None:
    rejected = read(spark, f"{output}_rejected")
    assert Counter((r.source, r.reason) for r in rejected) == {("l", "null_key"): 3, ("r", "null_key"): 4}
    assert sorted(r.event_time for r in rejected) == [at(s) for s in (1, 2, 7, 8, 11, 12, 13)]


@pytest.fixture(scope="module")
def ksql(spark, tmp_path_factory):
    """The seed's records, one Delta commit each in timestamp order; live runs of the FULL join
    after b@6, after E@40 and after the trailing rows, with what each run had written by then."""
    root = tmp_path_factory.mktemp("ksqldb")
    live = ksql_spec(root, KSQL_LIVE, "live")
    runner, written = None, {}
    for index, (second, side, value, key) in enumerate(KSQL_EVENTS):
        append(spark, root / side, [(key, value, at(second))], KV)
        if index in KSQL_RUNS:
            runner = runner or LiveRunner(spark, live, str(root / f"checkpoint_{KSQL_LIVE}"))
            runner.run(900)
            written[index] = ksql_pairs(read(spark, live.output.location))
    return SimpleNamespace(root=root, live=live, written=written)


def test_ksqldb_table_live(spark, ksql):
    join_type = KSQL_LIVE
    out = ksql.live.output.location
    rows = read(spark, out)
    assert ksql_pairs(rows) == ksql_expected(join_type)
    assert len(rows) == {"inner": 16, "left": 18, "full": 19}[join_type]
    assert Counter((r.event_time, r.lv, r.rv) for r in rows) == ksql_expected_times(join_type)
    # While it ran: after b@6 the frontier is B@5 (b waits for the left side), after E@40 it is
    # d@14 (D and E wait): exactly ksqlDB's rows up to timestamps 5 and 14, no padded row yet.
    assert ksql.written[KSQL_RUNS[0]] == ksql_expected(join_type, upto=5) == {("A", "a"): 1, ("B", "a"): 1}
    assert ksql.written[KSQL_RUNS[1]] == ksql_expected(join_type, upto=14)
    assert sum(ksql.written[KSQL_RUNS[1]].values()) == 12
    check_ksql_rejected(spark, out)
    accounting, batches = live_accounting(spark, out)
    assert batches >= len(KSQL_RUNS)
    assert accounting == KSQL_ACCOUNTING[join_type]


@pytest.fixture(scope="module")
def ksql_replays(spark, ksql):
    """Exact replays of [0 s, 200 s) of the three join types over the final tables (run at once)."""
    specs = {t: ksql_spec(ksql.root, t, "replay") for t in KSQL_TYPES}
    metrics = concurrently(
        {
            t: (lambda s=s: replay(spark, s, at(0), at(200), RunOptions(mode="exact")))
            for t, s in specs.items()
        }
    )
    return {t: (specs[t], metrics[t]) for t in KSQL_TYPES}


@pytest.mark.parametrize("join_type", KSQL_TYPES)
def test_ksqldb_table_replay_exact(spark, ksql, ksql_replays, join_type):
    spec, metrics = ksql_replays[join_type]
    assert metrics.balanced()
    assert source_counts(metrics) == KSQL_ACCOUNTING[join_type]
    assert metrics.total("carried_in") == 0
    assert metrics.rows_out == len(KSQL["expected"][join_type])
    rows = read(spark, spec.output.location)
    assert ksql_pairs(rows) == ksql_expected(join_type)
    assert Counter((r.event_time, r.lv, r.rv) for r in rows) == ksql_expected_times(join_type)
    check_ksql_rejected(spark, spec.output.location)
    if join_type == KSQL_LIVE:  # contract 2: the live runner's output, run three times between the commits
        live = read(spark, ksql.live.output.location)
        assert Counter((r.event_time, r.lv, r.rv) for r in live) == Counter(
            (r.event_time, r.lv, r.rv) for r in rows
        )


# ============================================================================ 2. SQLstream

OQ = StructType(
    [
        StructField("rowtime", TimestampType()),
        StructField("quantity", IntegerType()),
        StructField("ticker", StringType()),
    ]
)
SP = StructType(
    [
        StructField("rowtime", TimestampType()),
        StructField("ending_price", IntegerType()),
        StructField("ticker", StringType()),
    ]
)
WINDOW = (datetime(2019, 3, 30, 5, 0), datetime(2019, 3, 30, 5, 4))  # the replayed slice
CLOCK = "05:03:20"  # the joined stream clock when the seed prints its LEFT, RIGHT and FULL listings
TAIL = ("05:10:00", 0, "TAIL")

# Arrival order, one Delta commit per entry, rows named by (rowtime, ticker). Each stream arrives in
# rowtime order; across streams, as the seed tells it: order_quantity runs ahead to 05:03:30 while
# the joined clock stays at 05:03:20, then stock_price's 05:03:25 row, then the INSERT at 05:03:30.
# That 05:03:25 row is 5 s behind the largest event time already arrived, so grace is 10s: no row
# is late, and every row of the example joins.
# The trailing order at 05:10 (ticker TAIL) is there for the frontier: without a commit on
# order_quantity after the INSERT, stock_price's last two commits would wait (`unsettled`), as
# SQLstream's output waits for the slower stream's clock. It stays unsettled itself and lies
# outside the replayed slice, so it adds no row.
# Eager emission decides a row once the joined clock (the largest settled rowtime) has passed its
# rowtime, as SQLstream decides per rowtime millisecond: rows of equal rowtime meet whichever
# stream committed first. Plan A commits the 05:02:10 price before the 05:02:10 order, plan B the
# order first; every listing comes out the same under both.
PLAN_A = [
    ("sp", [("05:02:10", "IBM")]),
    ("oq", [("05:02:10", "IBM")]),
    ("sp", [("05:03:10", "IBM")]),
    ("oq", [("05:03:10", "IBM"), ("05:03:15", "GOOGL")]),
    ("sp", [("05:03:15", "MSFT"), ("05:03:20", "GOOGL")]),
    ("oq", [("05:03:20", "GOOGL"), ("05:03:20", "IBM"), ("05:03:28", "MSFT"), ("05:03:30", "MSFT")]),
    ("sp", [("05:03:25", "MSFT")]),
    ("sp", [("05:03:30", "IBM")]),  # the seed's INSERT INTO ... VALUES ('05:03:30', 'IBM', 200)
    ("oq", [("05:10:00", "TAIL")]),
]
PLAN_B = [PLAN_A[1], PLAN_A[0]] + PLAN_A[2:]
STOCKS_RUNS = (4, len(PLAN_A) - 1)  # live runs after the 5th commit (joined clock 05:03:15) and the last


def stocks_rows(side: str) -> dict[tuple[str, str], tuple]:
    rows = (
        STOCKS["order_quantity"] + [list(TAIL)]
        if side == "oq"
        else STOCKS["stock_price"] + [STOCKS["insert"]]
    )
    return {(r[0], r[2]): tuple(r) for r in rows}


def stocks_time(hms: str) -> datetime:
    return datetime.fromisoformat(f"{STOCKS['date']} {hms}")


def stocks_spec(root: Path, join_type: str, emit: str, runner: str):
    join = {"join": "sp", "type": join_type, "on": "oq.ticker = sp.ticker", "within": "1m", "grace": "10s"}
    if join_type == "cross":  # SQLstream's CROSS JOIN of the two RANGE windows: no condition
        del join["on"]
    if emit == "eager":
        join["emit"] = "eager"
    return spec_from_dict(
        {
            "name": f"stocks_{join_type}_{runner}",
            "sources": {
                "oq": {"path": str(root / "oq"), "time": "rowtime"},
                "sp": {"path": str(root / "sp"), "time": "rowtime"},
            },
            "from": "oq",
            "joins": [join],
            "select": ["sp.ticker AS ticker", "oq.quantity AS quantity", "sp.ending_price AS ending_price"],
            "output": {"path": str(root / f"out_{join_type}_{runner}")},
        }
    )


def stocks_out(rows) -> Counter:
    assert all(r.event_time.date() == stocks_time("00:00:00").date() for r in rows)
    return Counter((r.event_time.strftime("%H:%M:%S"), r.ticker, r.quantity, r.ending_price) for r in rows)


def seed_rows(name: str) -> Counter:
    return Counter(tuple(r) for r in STOCKS[name])


def after_insert() -> Counter:
    """The rows the INSERT releases, at the rowtimes the seed's data tables give (see the JSON)."""
    fixed = {tuple(c["seed"]): c["rowtime"] for c in STOCKS["rowtime_corrections"]}
    return Counter((fixed.get(tuple(r), r[0]),) + tuple(r[1:]) for r in STOCKS["inner_after_insert"])


def until(rows: Counter, clock: str) -> Counter:
    return Counter({r: n for r, n in rows.items() if r[0] <= clock})


INNER_ALL = seed_rows("inner_before_insert") + after_insert()
STOCKS_ACCOUNTING = {  # replay of the slice: every row of the example joins (the tail is outside)
    "oq": {
        "rows_in": 7,
        "rejected": 0,
        "late": 0,
        "joined": 7,
        "unmatched_emitted": 0,
        "unmatched_dropped": 0,
        "open": 0,
        "unsettled": 0,
    },
    "sp": {
        "rows_in": 6,
        "rejected": 0,
        "late": 0,
        "joined": 6,
        "unmatched_emitted": 0,
        "unmatched_dropped": 0,
        "open": 0,
        "unsettled": 0,
    },
}
STOCKS_LIVE_ACCOUNTING = {  # live: the same, plus the trailing order, left unsettled
    "oq": {**STOCKS_ACCOUNTING["oq"], "rows_in": 8, "unsettled": 1},
    "sp": STOCKS_ACCOUNTING["sp"],
}
# Run live between the commits: name -> (plan, join type, emission). FULL pads both sides, so its
# live runs hold LEFT's and RIGHT's eager decisions too; each join type's eager emission over
# micro-batches is also decided on generated histories (test_kernel_interval.py).
STOCKS_LIVE = {
    "inner": ("A", "inner", "final"),
    "full": ("A", "full", "eager"),
    "full_order_first": ("B", "full", "eager"),
}


@pytest.fixture(scope="module")
def stocks(spark, tmp_path_factory):
    """Both arrival plans committed side by side, live runs (STOCKS_LIVE) after the 5th and the last
    commit, with what each run had written by then."""
    roots = {"A": tmp_path_factory.mktemp("stocks_a"), "B": tmp_path_factory.mktemp("stocks_b")}
    rows = {side: stocks_rows(side) for side in ("oq", "sp")}
    for plan in (PLAN_A, PLAN_B):
        used = [(side, name) for side, names in plan for name in names]
        assert sorted(used) == sorted((side, name) for side in rows for name in rows[side]), (
            "every seed row once"
        )
    live = {name: stocks_spec(roots[plan], t, emit, "live") for name, (plan, t, emit) in STOCKS_LIVE.items()}
    runners, written = None, {}
    for index, (step_a, step_b) in enumerate(zip(PLAN_A, PLAN_B, strict=False)):
        concurrently(
            {
                plan: (
                    lambda root=root, side=side, names=names: append(
                        spark,
                        root / side,
                        [(stocks_time(t), v, ticker) for t, v, ticker in (rows[side][n] for n in names)],
                        OQ if side == "oq" else SP,
                    )
                )
                for plan, root, (side, names) in (("A", roots["A"], step_a), ("B", roots["B"], step_b))
            }
        )
        if index in STOCKS_RUNS:
            if runners is None:
                runners = [
                    LiveRunner(spark, s, str(roots[STOCKS_LIVE[n][0]] / f"checkpoint_{n}"))
                    for n, s in live.items()
                ]
            run_live(runners)
            written[index] = concurrently(
                {n: (lambda s=s: stocks_out(read(spark, s.output.location))) for n, s in live.items()}
            )
    return SimpleNamespace(roots=roots, live=live, written=written)


STOCKS_REPLAYS = {  # name: (plan, join type, emission)
    "inner": ("A", "inner", "final"),
    "left": ("A", "left", "eager"),
    "left_order_first": ("B", "left", "eager"),
    "full": ("A", "full", "eager"),
    "full_order_first": ("B", "full", "eager"),
    "right": ("B", "right", "eager"),
    "right_price_first": ("A", "right", "eager"),
    "cross": ("A", "cross", "final"),
}


@pytest.fixture(scope="module")
def stocks_replays(spark, stocks):
    """Exact replays of 05:00-05:04 over the final tables (run at once): name -> (rows, metrics)."""
    specs = {
        name: stocks_spec(stocks.roots[plan], t, emit, "replay")
        for name, (plan, t, emit) in STOCKS_REPLAYS.items()
    }
    metrics = concurrently(
        {
            name: (lambda s=s: replay(spark, s, *WINDOW, options=RunOptions(mode="exact")))
            for name, s in specs.items()
        }
    )
    return {name: (stocks_out(read(spark, specs[name].output.location)), metrics[name]) for name in specs}


def check_stocks_live_accounting(spark, stocks, name: str) -> None:
    accounting, batches = live_accounting(spark, stocks.live[name].output.location)
    assert batches >= len(STOCKS_RUNS)
    assert accounting == STOCKS_LIVE_ACCOUNTING


def check_stocks_replays(stocks_replays, names: tuple[str, ...], listing: str) -> None:
    """Each replay (one per commit order) writes the seed's listing, then the INSERT's rows."""
    for name in names:
        rows, metrics = stocks_replays[name]
        assert metrics.balanced() and source_counts(metrics) == STOCKS_ACCOUNTING, name
        assert until(rows, CLOCK) == seed_rows(listing), name
        assert rows == seed_rows(listing) + after_insert(), name


def test_stocks_inner_live(spark, stocks):
    out = stocks.live["inner"].output.location
    assert stocks_out(read(spark, out)) == INNER_ALL
    assert sum(INNER_ALL.values()) == 13
    # After the 5th commit the frontier is the order commit (05:03:10 IBM, 05:03:15 GOOGL): the
    # price commit after it (05:03:15 MSFT, 05:03:20 GOOGL) waits, so only the IBM rows are out.
    assert stocks.written[STOCKS_RUNS[0]]["inner"] == until(INNER_ALL, "05:03:10")
    check_stocks_live_accounting(spark, stocks, "inner")


def test_stocks_inner_replay_exact(stocks, stocks_replays):
    rows, metrics = stocks_replays["inner"]
    assert metrics.balanced() and source_counts(metrics) == STOCKS_ACCOUNTING
    assert until(rows, CLOCK) == seed_rows("inner_before_insert")
    assert rows - until(rows, CLOCK) == after_insert()
    assert rows == INNER_ALL == stocks.written[STOCKS_RUNS[-1]]["inner"]


def test_stocks_left_eager_replayed(stocks_replays):
    """The LEFT listing: GOOGL's 05:03:15 order has no price when the joined clock passes 05:03:15,
    so it is emitted padded then, and joined again when the 05:03:20 GOOGL price arrives (the
    padded order counts as joined)."""
    assert ("05:03:15", None, 1000, None) in seed_rows("left")
    check_stocks_replays(stocks_replays, ("left", "left_order_first"), "left")


def test_stocks_left_statement_from_sql_emits_eagerly_as_sqlstream(spark, stocks, stocks_replays):
    """SQLstream's LEFT statement read from SQL: its OVER (RANGE ...) windows are SQLstream's, whose
    joins pad a row once the stream clock passes its rowtime, so it compiles to eager emission and
    writes the listing with its pad `05:03:15 NULL 1000 NULL`, as its YAML twin does; the same
    join written with ksqlDB's WITHIN keeps final emission."""
    root = stocks.roots["A"]
    declarations = SQLSTREAM_STOCKS_SOURCES.format(oq=root / "oq", sp=root / "sp")
    job = spec_from_sql(
        f"{declarations}CREATE STREAM stocks_left_sql WITH (path='{root}/out_left_sql') AS\n{SQLSTREAM_LEFT}"
    )
    (join,) = job.joins
    assert (join.type, join.emit, join.grace.total_seconds()) == ("left", "eager", 10)
    within = SQLSTREAM_LEFT.replace(" OVER (RANGE INTERVAL '1' MINUTE PRECEDING)", "").replace(
        "AS sp\n", "AS sp WITHIN 1 MINUTE\n"
    )
    assert (
        spec_from_sql(f"{declarations}CREATE STREAM w WITH (path='w') AS\n{within}").joins[0].emit == "final"
    )
    replay(spark, job, *WINDOW, options=RunOptions(mode="exact"))
    rows = stocks_out(read(spark, job.output.location))
    assert ("05:03:15", None, 1000, None) in rows
    assert rows == seed_rows("left") + after_insert() == stocks_replays["left"][0]


def test_stocks_right_eager_replayed(stocks_replays):
    """The RIGHT listing: MSFT's 05:03:15 price has no order until 05:03:28, so it is emitted
    padded once the clock passes 05:03:15 (its own commit takes it to 05:03:20)."""
    check_stocks_replays(stocks_replays, ("right", "right_price_first"), "right")


def test_stocks_full_eager_live_and_replay_in_both_commit_orders(spark, stocks, stocks_replays):
    """The FULL listing as printed, whichever of the two 05:02:10 IBM rows committed first: they
    share a rowtime, so each finds the other before the clock passes 05:02:10 and neither is padded.
    Live after the 5th commit the settled clock is 05:03:15, the GOOGL order's own rowtime: a price
    of that rowtime could still come, so the order waits undecided (its LEFT padding too), and so
    does MSFT's 05:03:15 price (its RIGHT padding): the IBM rows only."""
    expected = seed_rows("full") + after_insert()
    for name in ("full", "full_order_first"):
        assert stocks.written[STOCKS_RUNS[-1]][name] == expected, name
        assert stocks.written[STOCKS_RUNS[0]][name] == until(seed_rows("full"), "05:03:10"), name
        check_stocks_live_accounting(spark, stocks, name)
    check_stocks_replays(stocks_replays, ("full", "full_order_first"), "full")


# ============================================================================ 3. errors


def interval_job(root: Path, **join) -> dict:
    body = {"join": "r", "type": "left", "on": "l.k = r.k", "within": "15s", "grace": "5s"}
    body.update(join)
    body = {k: v for k, v in body.items() if v is not None}
    return {
        "name": "bad_interval",
        "sources": {"l": {"path": str(root / "l"), "time": "t"}, "r": {"path": str(root / "r"), "time": "t"}},
        "from": "l",
        "joins": [body],
        "select": ["l.v AS lv", "r.v AS rv"],
        "output": {"path": str(root / "out")},
    }


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"within": None},
            [
                "join with 'r': a stream-stream join needs time bounds",
                "add 'within: 1h' (|right.time - left.time| <= 1h) or 'between: [-1h, 2h]'",
            ],
        ),
        ({"grace": "-5s"}, ["join with 'r': grace -5s is negative; write a grace of 0s or more"]),
        (
            {"within": None, "between": ["10s", "-5s"]},
            [
                "'between' lower bound 10s is above its upper bound -5s; write [lower, upper] with lower <= upper",
            ],
        ),
    ],
    ids=["no-within", "negative-grace", "between-reversed"],
)
def test_interval_job_refused_by_spec(tmp_path, change, message):
    with pytest.raises(JobError) as error:
        spec_from_dict(interval_job(tmp_path, **change))
    for part in message:
        assert part in str(error.value)
    assert not any(tmp_path.iterdir())  # no source, output or side table touched


def test_interval_condition_without_equality_refused_before_data_moves(spark, tmp_path):
    append(spark, tmp_path / "l", [("k", "A", at(3))], KV)
    append(spark, tmp_path / "r", [("k", "a", at(4))], KV)
    spec = spec_from_dict(interval_job(tmp_path, on="l.t < r.t"))  # structurally fine: within is there
    expected = "job 'bad_interval', join with 'r': the condition has no equality between a column of l and a column of r"
    with pytest.raises(JobError) as error:
        bind(spark, spec)
    assert expected in str(error.value) and "e.g. on: l.id = r.id" in str(error.value)
    with pytest.raises(JobError) as error:
        replay(spark, spec, at(0), at(100), RunOptions(mode="exact"))
    assert expected in str(error.value)
    with pytest.raises(JobError) as error:
        LiveRunner(spark, spec, str(tmp_path / "checkpoint"))
    assert expected in str(error.value)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["l", "r"], written  # no output, side table, metrics or checkpoint


def test_stocks_cross_replay_pairs_every_order_and_price_within_a_minute(stocks_replays):
    """SQLstream's CROSS JOIN of the two one-minute RANGE windows: every order with every price
    whose rowtimes lie at most a minute apart, whatever the ticker, at the later rowtime. (The
    seed's own listing, 23 rows printed at the stream clock 05:03:25, repeats rows and leaves pairs
    out while saying the result is the product of the rows in the windows: docs/semantics.md.)"""
    rows, metrics = stocks_replays["cross"]
    orders = [r for r in stocks_rows("oq").values() if r[2] != "TAIL"]
    prices = list(stocks_rows("sp").values())
    expected = Counter(
        (max(o[0], p[0]), p[2], o[1], p[1])
        for o in orders
        for p in prices
        if abs((stocks_time(p[0]) - stocks_time(o[0])).total_seconds()) <= 60
    )
    assert rows == expected and sum(rows.values()) > len(orders) * 2
    assert metrics.balanced() and metrics.sources["oq"].rejected == 0
    assert metrics.sources["oq"].joined == len(orders) and metrics.sources["sp"].joined == len(prices)
