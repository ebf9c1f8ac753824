"""N-way chains end to end: ksqlDB's example shape, in both runners, and the chains refused up front.

ksqlDB's N-way join (the seed's "N-Way Joins"): `FROM A JOIN B ON A.id = B.product_id JOIN C ON
A.id = C.purchased_id`, A a stream, B and C tables; the intermediate result A ⋈ B is a stream, and
each stage obeys the two-way rules. Here B is an append-only changelog and C a table updated in
place; both change between the stream's commits and live runs happen in between, so each stream
row must see both tables as they were when it arrived. The chain's decisions on generated
histories are proven at the kernel's level (tests/test_kernel_chain.py); this checks the wiring.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from conftest import append, at
from harness import FINAL, WRITES, FailAfterEach, delete, live_accounting, read, run_live, upsert, with_output
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType
from reference import LINK_BUCKETS
from seed_sql import KSQLDB_NWAY_SOURCES, KSQLDB_NWAY_STREAM, SQLSTREAM_QUOTE_SOURCES, SQLSTREAM_THREE_WAY
from selenium.webdriver.common.by import By
from test_report import number, open_page, severe, shown

from streamjoin import kernel
from streamjoin.errors import JobError, UnsupportedJobError
from streamjoin.metrics import RunMetrics, to_frame
from streamjoin.plan import bind, describe
from streamjoin.report import build_report
from streamjoin.runners.hooks import after_write
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict
from streamjoin.sql import spec_from_sql

PURCHASES = StructType(
    [StructField("id", IntegerType()), StructField("name", StringType()), StructField("t", TimestampType())]
)
PRODUCTS = StructType(
    [
        StructField("product_id", IntegerType()),
        StructField("product", StringType()),
        StructField("t", TimestampType()),
    ]
)
SHIPPING = StructType([StructField("purchased_id", IntegerType()), StructField("carrier", StringType())])


CHAIN_WRITES = tuple(table for table in WRITES if table != "late")


def nway(root, paths: dict[str, str], how: str, name: str):
    return spec_from_dict(
        {
            "name": name,
            "sources": {
                "A": {"path": paths["A"], "time": "t"},
                "B": {
                    "path": paths["B"],
                    "kind": "table",
                    "key": ["product_id"],
                    "changelog": True,
                    "clock_skew": "0s",
                },
                "C": {"path": paths["C"], "kind": "table", "key": ["purchased_id"], "clock_skew": "0s"},
            },
            "from": "A",
            "joins": [
                {"join": "B", "type": how, "on": "A.id = B.product_id"},
                {"join": "C", "type": how, "on": "A.id = C.purchased_id"},
            ],
            "select": ["A.name AS purchase", "B.product AS product", "C.carrier AS carrier"],
            "output": {"path": f"{root}/out_{name}"},
        }
    )


@pytest.fixture(scope="module")
def chain(spark, tmp_path_factory):
    """Purchases and the two tables committed in turn, live runs of the LEFT chain in between."""
    root = tmp_path_factory.mktemp("chains")
    paths = {name: f"{root}/{name}" for name in "ABC"}
    for name, schema in (("A", PURCHASES), ("B", PRODUCTS), ("C", SHIPPING)):
        spark.createDataFrame([], schema).write.format("delta").save(paths[name])
    specs = {how: nway(root, paths, how, f"nway_{how}") for how in ("inner", "left")}
    runner = LiveRunner(spark, specs["left"], f"{root}/checkpoint")
    # The same chain run live again, its second run failing after each of its writes in turn.
    restarted = with_output(specs["left"], f"{root}/out_restarted")
    # The second run writes no late rows (no table here has late changes).
    hook = FailAfterEach(batch=-2, writes=CHAIN_WRITES)  # batch: the second run's first, set below

    def live_restarted(**options) -> LiveRunner:
        return LiveRunner(spark, restarted, f"{root}/checkpoint_restarted", **options)

    def purchase(rows):
        append(spark, paths["A"], [(i, n, at(s)) for i, n, s in rows], PURCHASES)

    append(spark, paths["B"], [(1, "lamp", at(0))], PRODUCTS)
    upsert(spark, paths["C"], [(1, "post")], SHIPPING, ("purchased_id",))
    purchase([(1, "a1", 2), (2, "a2", 3)])  # a1: lamp by post; a2: no product 2 yet
    append(spark, paths["B"], [(2, "desk", at(4))], PRODUCTS)
    upsert(spark, paths["C"], [(2, "rail")], SHIPPING, ("purchased_id",))
    run_live([runner, live_restarted()])
    purchase([(2, "a3", 6), (None, "a6", 7)])  # a3: desk by rail; a6: NULL key
    upsert(spark, paths["C"], [(1, "air")], SHIPPING, ("purchased_id",))
    purchase([(1, "a4", 8)])  # lamp by air: C as it was when a4 arrived, not when a1 did
    delete(spark, paths["C"], "purchased_id = 2")
    run_live([runner])
    hook.batch = 1 + max(r.batch for r in read(spark, restarted.output.side("metrics")))
    with after_write(hook):
        for table in CHAIN_WRITES:
            with pytest.raises(Exception, match=f"injected failure after writing {table}"):
                live_restarted().run(900)
        live_restarted().run(900)  # the last attempt completes the batch
    purchase([(2, "a5", 10)])  # desk, no shipping any more
    append(spark, paths["B"], [(2, "chair", at(12))], PRODUCTS)  # after a5: not what a5 sees
    run_live([runner, live_restarted()])
    replays = {
        how: replay(spark, with_output(spec, f"{spec.output.location}_replay"), at(0), at(100))
        for how, spec in specs.items()
    }
    return SimpleNamespace(specs=specs, replays=replays, restarted=restarted, fired=hook.fired)


EXPECTED = {
    "left": Counter(
        {
            ("a1", "lamp", "post", at(2)): 1,
            ("a2", None, None, at(3)): 1,
            ("a3", "desk", "rail", at(6)): 1,
            ("a4", "lamp", "air", at(8)): 1,
            ("a5", "desk", None, at(10)): 1,
        }
    ),
}
EXPECTED["inner"] = Counter({row: n for row, n in EXPECTED["left"].items() if None not in row})


def live_links(spark, spec) -> dict[str, list[int]]:
    """A live output's counts per link, summed over its micro-batches: reached, matched, padded, dropped."""
    links = Counter()
    for row in read(spark, spec.output.side("metrics")):
        links.update({(link["link"], b): link[b] for link in json.loads(row.by_link) for b in LINK_BUCKETS})
    return {name: [links[(name, b)] for b in LINK_BUCKETS] for name, _ in links}


def rows(spark, location: str) -> Counter:
    return Counter((r.purchase, r.product, r.carrier, r.event_time) for r in read(spark, location))


def test_ksqldb_nway_stream_table_table_live_equals_replay(spark, chain):
    specs, replays = chain.specs, chain.replays
    live = specs["left"]
    assert rows(spark, live.output.location) == EXPECTED["left"]
    accounting, batches = live_accounting(spark, live.output.location, FINAL + ("applied",))
    assert batches >= 3
    assert accounting["A"] == {
        "rows_in": 6, "rejected": 1, "late": 0, "joined": 3, "unmatched_emitted": 2, "unmatched_dropped": 0,
        "applied": 0, "open": 0, "unsettled": 0,
    }  # fmt: skip
    assert live_links(spark, live) == {
        "1. LEFT JOIN B": [5, 4, 1, 0],  # reached, matched, padded, dropped: a2 has no product
        "2. LEFT JOIN C": [5, 3, 2, 0],  # a2 and a5 have no shipping
    }
    assert accounting["B"]["applied"] == accounting["B"]["rows_in"] == 3
    assert accounting["C"]["applied"] == accounting["C"]["rows_in"] == 4  # 3 upserts and a delete
    for how, metrics in replays.items():
        assert rows(spark, f"{specs[how].output.location}_replay") == EXPECTED[how], how
        a = metrics.sources["A"]
        assert metrics.balanced() and a.joined == 3 and a.rejected == 1
        assert (a.unmatched_emitted, a.unmatched_dropped) == ((2, 0) if how == "left" else (0, 2))
        inner = [(5, 4, 0, 1), (4, 3, 0, 1)]  # a2 dropped at B, a5 at C
        left = [(5, 4, 1, 0), (5, 3, 2, 0)]
        assert [(k.reached, k.matched, k.padded, k.dropped) for k in metrics.links] == (
            left if how == "left" else inner
        )


def test_explain_shows_every_link(spark, chain):
    specs = chain.specs
    text = describe(bind(spark, specs["inner"]))
    assert "1. INNER JOIN B [stream-table] ON A.id = B.product_id" in text
    assert "2. INNER JOIN C [stream-table] ON A.id = C.purchased_id" in text


SHIPMENTS = StructType(
    [
        StructField("purchased_id", IntegerType()),
        StructField("carrier", StringType()),
        StructField("t", TimestampType()),
    ]
)


def nway_stream(root, paths: dict[str, str], name: str, **second) -> dict:
    """ksqlDB's second form, as the seed prints it: `FROM A JOIN B ON A.id = B.product_id JOIN C
    WITHIN 10 SECONDS ON A.id = C.purchased_id`, C a stream, with a grace of 2 s (the seed's
    default of 24 hours would close no window here). B waits for its next commit (a long clock
    skew), so purchases wait at B across live runs."""
    return {
        "name": name,
        "sources": {
            "A": {"path": paths["A"], "time": "t"},
            "B": {
                "path": paths["B"],
                "kind": "table",
                "key": ["product_id"],
                "changelog": True,
                "clock_skew": "1h",
            },
            "C": {"path": paths["S"], "time": "t"},
        },
        "from": "A",
        "joins": [
            {"join": "B", "on": "A.id = B.product_id"},
            {"join": "C", "on": "A.id = C.purchased_id", "within": "10s", "grace": "2s", **second},
        ],
        "output": {"path": f"{root}/out_{name}"},
    }


@pytest.fixture(scope="module")
def stream_chain(spark, tmp_path_factory):
    """Purchases A, products B and shipments C committed in turn, live runs in between; then replayed."""
    root = tmp_path_factory.mktemp("stream_chain")
    paths = {"A": f"{root}/A", "B": f"{root}/B", "S": f"{root}/S"}
    for name, schema in (("A", PURCHASES), ("B", PRODUCTS), ("S", SHIPMENTS)):
        spark.createDataFrame([], schema).write.format("delta").save(paths[name])
    # The seed's statement is the job that runs; `nway_stream` is its YAML twin.
    declarations = KSQLDB_NWAY_SOURCES.format(A=paths["A"], B=paths["B"], C=paths["S"])
    spec = spec_from_sql(
        f"{declarations}CREATE STREAM nway_stream WITH (path='{root}/out_nway_stream') AS\n{KSQLDB_NWAY_STREAM}"
    )
    twin = spec_from_dict(nway_stream(root, paths, "nway_stream"))
    runner = LiveRunner(spark, spec, f"{root}/checkpoint")

    def commit(name, rows, schema):
        append(spark, paths[name], [(*row[:-1], at(row[-1])) for row in rows], schema)

    commit("B", [(1, "lamp", 0), (2, "desk", 0)], PRODUCTS)
    commit("A", [(1, "a1", 2), (2, "a2", 3)], PURCHASES)  # both wait for B's next commit
    commit("S", [(1, "post", 5), (2, "rail", 8)], SHIPMENTS)
    commit("S", [(9, "boat", 40)], SHIPMENTS)  # the clock passes rail's window while a2 waits at B
    commit("A", [(3, "a3", 41)], PURCHASES)  # no product 3: dropped at B
    run_live([runner])
    commit("B", [(3, "chair", 4)], PRODUCTS)  # a1, a2, a3 decided (B as they arrived): a2 meets rail
    run_live([runner])
    commit("A", [(1, "a4", 44), (None, "a5", 45)], PURCHASES)  # a5: NULL key, rejected
    commit("S", [(1, "air", 48)], SHIPMENTS)
    commit("B", [(5, "sofa", 45)], PRODUCTS)
    commit("A", [(7, "a7", 60)], PURCHASES)  # left waiting at B
    commit("S", [(7, "van", 62)], SHIPMENTS)  # settles a7 (and waits itself, the newest commit)
    run_live([runner])
    replayed = replay(spark, with_output(spec, f"{spec.output.location}_replay"), at(0), at(100))
    return SimpleNamespace(spec=spec, twin=twin, paths=paths, root=root, replayed=replayed)


def every_column_rows(spark, location: str) -> Counter:
    """(purchase, product, carrier, event time) of a `SELECT *` output (columns <source>_<column>)."""
    return Counter((r.A_name, r.B_product, r.C_carrier, r.event_time) for r in read(spark, location))


def test_ksqldb_nway_stream_table_stream_live_equals_replay(spark, stream_chain):
    """ksqlDB's statement, the job its YAML twin describes: a row that waits at the table still
    meets its stream partner, whose window the clock passed meanwhile; live (three runs) and the
    replay write the same rows and account for every row."""
    spec = stream_chain.spec
    assert spec == stream_chain.twin
    expected = Counter(
        {("a1", "lamp", "post", at(5)): 1, ("a2", "desk", "rail", at(8)): 1, ("a4", "lamp", "air", at(48)): 1}
    )
    assert every_column_rows(spark, spec.output.location) == expected
    assert every_column_rows(spark, f"{spec.output.location}_replay") == expected
    accounting, batches = live_accounting(spark, spec.output.location)
    assert batches >= 3
    assert accounting["A"] == {
        "rows_in": 6, "rejected": 1, "late": 0, "joined": 3, "unmatched_emitted": 0, "unmatched_dropped": 1,
        "open": 1, "unsettled": 0,
    }  # fmt: skip
    assert live_links(spark, spec) == {
        "1. INNER JOIN B": [4, 4 - 1, 0, 1],  # a1, a2, a3, a4 decided; a3 has no product
        "2. INNER JOIN C": [3, 3, 0, 0],
    }
    metrics = stream_chain.replayed
    assert metrics.balanced() and metrics.sources["A"].joined == 3 and metrics.sources["A"].open == 1
    c = metrics.sources["C"]
    assert (c.rows_in, c.joined, c.unmatched_dropped, c.unsettled) == (5, 3, 1, 1)  # boat closed, van waits


def test_after_a_table_and_a_stream_stage_nothing_more_runs_yet(spark, stream_chain):
    """The stream-stream stage after table stages is the chain's last, keyed, with final emission;
    validate-job and the runners refuse anything else before data moves, naming the join."""
    root, paths = stream_chain.root, stream_chain.paths
    eager = nway_stream(root, paths, "eager", emit="eager")
    further = nway_stream(root, paths, "further")
    further["sources"]["D"] = {"path": paths["B"], "kind": "table", "key": ["product_id"], "changelog": True}
    further["joins"].append({"join": "D", "on": "A.id = D.product_id"})
    for document, message in (
        (eager, r"join 2 \(INNER JOIN C, family interval\) cannot follow the stream-table join"),
        (further, r"join 3 \(INNER JOIN D, family stream-table\) cannot follow the interval join"),
    ):
        with pytest.raises(UnsupportedJobError, match=message):
            kernel.runnable(spark, bind(spark, spec_from_dict(document)))


def test_a_full_outer_stream_table_stage_fails_as_in_ksqldb(tmp_path):
    """ksqlDB: "if any stage in the N-way join resolves to a FULL OUTER join between a stream and a
    table the entire query fails" (A JOIN B WITHIN 10 SECONDS, then FULL OUTER JOIN table C)."""
    document = {
        "name": "nway_full",
        "sources": {
            "A": {"path": "A", "time": "t"},
            "B": {"path": "B", "time": "t"},
            "C": {"path": "C", "kind": "table", "key": ["purchased_id"]},
        },
        "from": "A",
        "joins": [
            {"join": "B", "on": "A.id = B.product_id", "within": "10s"},
            {"join": "C", "type": "full", "on": "A.id = C.purchased_id"},
        ],
        "output": {"path": f"{tmp_path}/out"},
    }
    with pytest.raises(
        JobError,
        match="join with 'C': a FULL join of a stream with a table is refused: a FULL OUTER stream-table join has no sound semantics",
    ):
        spec_from_dict(document)


def test_a_chain_batch_failing_after_each_of_its_writes_is_redone_exactly_once(spark, chain):
    """Killed after every one of its writes in turn (rejected, output, state, metrics), the
    chain's batch is redone from the checkpoint; the output and the accounting are those of the
    run that never failed."""
    assert [table for table, _ in chain.fired] == list(CHAIN_WRITES)
    live = chain.specs["left"].output.location
    assert rows(spark, chain.restarted.output.location) == rows(spark, live) == EXPECTED["left"]
    kept = FINAL + ("applied",)
    assert live_accounting(spark, chain.restarted.output.location, kept) == live_accounting(spark, live, kept)


def test_the_page_shows_the_chain_link_by_link(spark, chain, browser, tmp_path):
    """The data-quality page of the live chain: each link's rows, as the metrics table sums them."""
    open_page(browser, build_report(spark, chain.specs["left"], str(tmp_path / "report")))
    assert severe(browser) == []
    for name, counts in {"1. LEFT JOIN B": (5, 4, 1, 0, 5), "2. LEFT JOIN C": (5, 3, 2, 0, 5)}.items():
        row = f"table#links tr[data-link='{name}'][data-runner='live']"
        fields = (*LINK_BUCKETS, "passed")
        assert tuple(number(shown(browser, f"{row} td[data-field='{b}']")) for b in fields) == counts
    assert len(browser.find_elements(By.CSS_SELECTOR, "table#links tbody tr")) == 2


def test_a_metrics_table_written_before_by_link_takes_the_new_column(spark, chain, tmp_path):
    """A job's metrics table from before per-link counts existed (no `by_link` column): the next
    run adds the column, the old rows read it as NULL, and the page still builds."""
    spec = with_output(chain.specs["inner"], f"{tmp_path}/out")
    old = RunMetrics(
        job=spec.name,
        runner="replay",
        mode="exact",
        run_id="old",
        started_at=datetime(2024, 1, 1),
        slice_start=at(0),
        slice_end=at(100),
    )
    to_frame(spark, old).drop("by_link").write.format("delta").save(spec.output.side("metrics"))
    replay(spark, spec, at(0), at(100))
    by_run = {r.run_id: r.by_link for r in read(spark, spec.output.side("metrics"))}
    assert by_run.pop("old") is None
    (new,) = by_run.values()
    assert [link["link"] for link in json.loads(new)] == ["1. INNER JOIN B", "2. INNER JOIN C"]
    page = build_report(spark, spec, str(tmp_path / "report")).read_text()
    assert "<table id='links'>" in page and "data-link='2. INNER JOIN C' data-runner='replay'" in page


# ------------------------------------------------------------------ a table link after a stream-stream join


def interval_then_table(root, paths: dict[str, str], name: str):
    """ksqlDB's `FROM A LEFT JOIN P WITHIN 10 SECONDS ... LEFT JOIN C`, P a stream and C a table."""
    return spec_from_dict(
        {
            "name": name,
            "sources": {
                "A": {"path": paths["A"], "time": "t"},
                "P": {"path": paths["P"], "time": "t"},
                "C": {"path": paths["C"], "kind": "table", "key": ["purchased_id"], "clock_skew": "0s"},
            },
            "from": "A",
            "joins": [
                {"join": "P", "type": "left", "on": "A.id = P.id", "within": "10s", "grace": "0s"},
                {"join": "C", "type": "left", "on": "A.id = C.purchased_id"},
            ],
            "select": ["A.name AS purchase", "P.name AS payment", "C.carrier AS carrier"],
            "output": {"path": f"{root}/out_{name}"},
        }
    )


@pytest.fixture(scope="module")
def interval_chain(spark, tmp_path_factory):
    """Purchases, payments and shipping committed in turn, three live runs in between, then one
    replay of everything. (A chain's batch failing after each of its writes: the `chain` and
    `three_streams` fixtures; the latter's twin, a `Chain` like this one, fails after the writes
    this chain's batches make: output, state, metrics.)"""
    root = tmp_path_factory.mktemp("interval_chain")
    paths = {name: f"{root}/{name}" for name in "APC"}
    for name, schema in (("A", PURCHASES), ("P", PURCHASES), ("C", SHIPPING)):
        spark.createDataFrame([], schema).write.format("delta").save(paths[name])
    spec = interval_then_table(root, paths, "interval_table")
    runner = LiveRunner(spark, spec, f"{root}/checkpoint")

    def commit(source: str, rows):
        append(spark, paths[source], [(i, n, at(s)) for i, n, s in rows], PURCHASES)

    upsert(spark, paths["C"], [(1, "post")], SHIPPING, ("purchased_id",))
    commit("A", [(1, "a1", 0), (2, "a2", 1)])
    commit("P", [(1, "p1", 3)])  # a1 with p1: known at p1's commit, shipped by post then
    upsert(spark, paths["C"], [(2, "rail")], SHIPPING, ("purchased_id",))
    runner.run(900)  # settles the purchases only: payments may still come before p1
    commit("P", [(3, "p3", 30)])  # the clock passes a2's window (1 + 10 s): a2 padded here, by rail
    upsert(
        spark, paths["C"], [(2, "air")], SHIPPING, ("purchased_id",)
    )  # after a2 was known: not its carrier
    commit("A", [(3, "a3", 31)])  # a3 with p3, known at a3's commit: no shipping for 3
    runner.run(900)
    commit("A", [(4, "a4", 45), (None, "a5", 40)])  # a4's window stays open; a5 has no key
    commit("P", [(9, "p9", 50)])  # settles a3 and a4's commit; p9 itself stays unsettled
    runner.run(900)
    replayed = replay(spark, with_output(spec, f"{root}/out_replay"), at(0), at(100))
    return SimpleNamespace(spec=spec, replayed=replayed, root=root)


INTERVAL_EXPECTED = Counter(
    {("a1", "p1", "post", at(3)): 1, ("a2", None, "rail", at(1)): 1, ("a3", "p3", None, at(31)): 1}
)


def interval_rows(spark, location: str) -> Counter:
    return Counter((r.purchase, r.payment, r.carrier, r.event_time) for r in read(spark, location))


def test_a_table_link_after_a_stream_stream_join_sees_the_table_when_each_row_became_known(
    spark, interval_chain
):
    """A joined pair looks the table up as it was when its later row arrived, a padded row as it
    was when the clock closed its window; live (in three runs) equals the replay, link by link."""
    spec = interval_chain.spec
    assert interval_rows(spark, spec.output.location) == INTERVAL_EXPECTED
    assert interval_rows(spark, f"{interval_chain.root}/out_replay") == INTERVAL_EXPECTED
    accounting, _ = live_accounting(spark, spec.output.location)
    assert accounting["A"] == {
        "rows_in": 5, "rejected": 1, "late": 0, "joined": 2, "unmatched_emitted": 1, "unmatched_dropped": 0,
        "open": 1, "unsettled": 0,
    }  # fmt: skip
    assert accounting["P"] == {
        "rows_in": 3, "rejected": 0, "late": 0, "joined": 2, "unmatched_emitted": 0, "unmatched_dropped": 0,
        "open": 0, "unsettled": 1,
    }  # fmt: skip
    by_link = {
        "1. LEFT JOIN P": [3, 2, 1, 0],
        "2. LEFT JOIN C": [3, 2, 1, 0],
    }  # reached, matched, padded, dropped
    replayed = interval_chain.replayed
    assert live_links(spark, spec) == by_link
    assert replayed.balanced()
    assert [[getattr(k, b) for b in LINK_BUCKETS] for k in replayed.links] == list(by_link.values())
    assert (replayed.sources["A"].joined, replayed.sources["A"].open) == (2, 1)


# ------------------------------------------------------------------ three streams in turn


@pytest.fixture(scope="module")
def three_streams(spark, tmp_path_factory):
    """ksqlDB's `FROM A LEFT JOIN B WITHIN 10 SECONDS ... FULL JOIN C WITHIN 10 SECONDS`, three
    streams committed in turn: live in three runs, then one replay of everything."""
    root = tmp_path_factory.mktemp("three_streams")
    paths = {name: f"{root}/{name}" for name in "ABC"}
    for name in "ABC":
        spark.createDataFrame([], PURCHASES).write.format("delta").save(paths[name])
    spec = spec_from_dict(
        {
            "name": "three_streams",
            "sources": {name: {"path": paths[name], "time": "t"} for name in "ABC"},
            "from": "A",
            "joins": [
                {"join": "B", "type": "left", "on": "A.id = B.id", "within": "10s", "grace": "0s"},
                {"join": "C", "type": "full", "on": "A.id = C.id", "within": "10s", "grace": "20s"},
            ],
            "select": ["A.name AS a", "B.name AS b", "C.name AS c"],
            "output": {"path": f"{root}/out"},
        }
    )
    runner = LiveRunner(spark, spec, f"{root}/checkpoint")
    restarted = with_output(spec, f"{root}/out_restarted")
    hook = FailAfterEach(batch=-2, writes=("output", "state", "metrics"))

    def live_restarted(**options) -> LiveRunner:
        return LiveRunner(spark, restarted, f"{root}/checkpoint_restarted", **options)

    def commit(source: str, rows):
        append(spark, paths[source], [(i, n, at(s)) for i, n, s in rows], PURCHASES)

    commit("A", [(1, "a1", 0), (2, "a2", 1)])
    commit("B", [(1, "b1", 3)])  # a1 with b1, known at b1's commit
    commit("C", [(1, "c1", 5), (7, "c7", 2)])  # c1 meets a1 + b1; c7 meets nothing
    run_live([runner, live_restarted()])  # settles A's commit only: B and C may still come before it
    commit("B", [(3, "b3", 30)])  # the clock passes a2's window: a2 padded at join 1, then at join 2
    commit("C", [(2, "c2", 12)])  # A.id = 2 but 11 s after a2: outside join 2's window
    commit("A", [(3, "a3", 31)])  # a3 with b3; no c3
    run_live([runner])
    # The twin's batch writes a1 + b1 + c1 and keeps joined rows and open windows of both joins.
    hook.batch = 1 + max(r.batch for r in read(spark, restarted.output.side("metrics")))
    with after_write(hook):
        for table in hook.writes:
            with pytest.raises(Exception, match=f"injected failure after writing {table}"):
                live_restarted().run(900)
        live_restarted().run(900)  # the last attempt completes the batch
    commit("A", [(4, "a4", 80)])  # closes every window before it; a4's stays open
    commit("B", [(9, "b9", 90)])
    commit("C", [(9, "c9", 95)])
    run_live([runner, live_restarted()])
    replayed = replay(spark, with_output(spec, f"{root}/out_replay"), at(0), at(200))
    return SimpleNamespace(spec=spec, restarted=restarted, replayed=replayed, fired=hook.fired, root=root)


def three_rows(spark, location: str) -> Counter:
    return Counter((r.a, r.b, r.c, r.event_time) for r in read(spark, location))


def test_three_streams_joined_in_turn_live_equal_the_replay_link_by_link(spark, three_streams):
    """Join 2 takes join 1's rows at the positions they became known (a padded a2 too) and pads
    both its sides; live (in three runs) writes what the replay writes, and each link adds up."""
    expected = Counter(
        {
            ("a1", "b1", "c1", at(5)): 1,
            ("a2", None, None, at(1)): 1,  # padded at both joins
            ("a3", "b3", None, at(31)): 1,
            (None, None, "c2", at(12)): 1,
            (None, None, "c7", at(2)): 1,
        }
    )
    spec = three_streams.spec

    assert three_rows(spark, spec.output.location) == expected
    assert three_rows(spark, f"{three_streams.root}/out_replay") == expected
    accounting, _ = live_accounting(spark, spec.output.location)
    assert {
        name: (c["joined"], c["unmatched_emitted"], c["open"], c["unsettled"])
        for name, c in accounting.items()
    } == {
        "A": (2, 1, 1, 0),  # a1, a3 joined; a2 padded; a4 open
        "B": (2, 0, 0, 1),  # b1, b3; b9 unsettled (A's newest commit is older)
        "C": (1, 2, 0, 1),  # c1; c2, c7 padded; c9 unsettled (A's newest commit is older)
    }
    by_link = {
        "1. LEFT JOIN B": [3, 2, 1, 0],
        "2. FULL JOIN C": [3, 1, 2, 0],
    }  # reached, matched, padded, dropped
    replayed = three_streams.replayed
    assert live_links(spark, spec) == by_link
    assert replayed.balanced()
    assert [[getattr(k, b) for b in LINK_BUCKETS] for k in replayed.links] == list(by_link.values())
    assert (
        replayed.links[1].emitted == 5
    )  # the rows join 2 wrote: one pair, two padded A + B rows... and two C rows


QUOTES = StructType(
    [StructField("ticker", StringType()), StructField("n", IntegerType()), StructField("t", TimestampType())]
)


def test_sqlstreams_three_way_join_of_bids_with_itself_through_asks(spark, tmp_path):
    """SQLstream's statement as printed (OVER windows on each stream, `b1."ticker"`, bids twice):
    b1 keeps its rows an hour and asks two seconds, so an ask joins b1 within [-2s, 1h] of it; the
    joined row takes no OVER (its current row, at the later of its times), and b2 keeps its rows
    three minutes, so b2 lies within [-3m, 0] of the pair. Live (two runs) writes what the replay
    writes, and both are the rows that rule gives, found by brute force."""
    paths = {"bids": str(tmp_path / "bids"), "asks": str(tmp_path / "asks")}
    spec = spec_from_sql(
        SQLSTREAM_QUOTE_SOURCES.format(**paths)
        + f"CREATE STREAM quotes WITH (path='{tmp_path}/quotes') AS\n{SQLSTREAM_THREE_WAY}"
    )
    assert [(j.source, j.bounds.lower, j.bounds.upper) for j in spec.joins] == [
        ("asks", timedelta(seconds=-2), timedelta(hours=1)),
        ("b2", timedelta(minutes=-3), timedelta(0)),
    ]
    assert spec.source("b1").path == spec.source("b2").path == paths["bids"]
    bids = [("X", 1, 0), ("X", 2, 100), ("Y", 4, 10), ("X", 3, 400), ("Z", 9, 10_000)]
    asks = [("X", 11, 1), ("X", 13, 100), ("X", 14, 399), ("Y", 15, 5_000)]

    def commit(name: str, rows) -> None:
        append(spark, paths[name], [(k, n, at(t)) for k, n, t in rows], QUOTES)

    commit("bids", bids[:3])
    commit("asks", asks[:2])
    runner = LiveRunner(spark, spec, f"{tmp_path}/checkpoint")
    runner.run(900)
    commit("bids", bids[3:4])
    commit("asks", asks[2:])
    commit("bids", bids[4:])  # Z's bid moves the clock past every window but its own
    runner.run(900)
    expected = Counter(
        (b1, a, b2, at(max(tb1, ta, tb2)))
        for k1, b1, tb1 in bids
        for k, a, ta in asks
        for k2, b2, tb2 in bids
        if k1 == k == k2 and -2 <= ta - tb1 <= 3600 and -180 <= tb2 - max(tb1, ta) <= 0
    )
    assert len(expected) == 6  # (1, 11, 1), (1|2, 13, 1|2), (3, 14, 3)

    def written(location: str) -> Counter:
        return Counter((r.b1_n, r.asks_n, r.b2_n, r.event_time) for r in read(spark, location))

    assert written(spec.output.location) == expected
    replayed = replay(spark, with_output(spec, f"{tmp_path}/quotes_replay"), at(0), at(20_000))
    assert written(f"{tmp_path}/quotes_replay") == expected
    assert replayed.balanced() and sum(c.late for c in replayed.sources.values()) == 0


def test_a_batch_of_a_three_stream_chain_failing_after_each_write_is_redone_once(spark, three_streams):
    """Killed after each of its writes in turn, the batch that settles join 1's rows and feeds
    join 2 is redone from the checkpoint (both joins' state, join 1's rows kept for join 2): the
    output and counts are those of the run that never failed."""
    assert [table for table, _ in three_streams.fired] == ["output", "state", "metrics"]
    live, restarted = three_streams.spec, three_streams.restarted
    assert three_rows(spark, restarted.output.location) == three_rows(spark, live.output.location)
    assert live_accounting(spark, restarted.output.location) == live_accounting(spark, live.output.location)
    assert live_links(spark, restarted) == live_links(spark, live)


def test_the_page_shows_the_rows_waiting_at_each_link(spark, stream_chain, browser, tmp_path):
    """a7 waits at B when the last live batch ends: the page says so at link 1, beside what each
    link did over every batch."""
    open_page(browser, build_report(spark, stream_chain.spec, str(tmp_path / "report")))
    assert severe(browser) == []
    for name, counts in {
        "1. INNER JOIN B": (4, 3, 0, 1, 3, 1),
        "2. INNER JOIN C": (3, 3, 0, 0, 3, 0),
    }.items():
        row = f"table#links tr[data-link='{name}'][data-runner='live']"
        fields = (*LINK_BUCKETS, "passed", "open")
        assert tuple(number(shown(browser, f"{row} td[data-field='{b}']")) for b in fields) == counts, name
