"""The enrichment joins end to end: live equals the exact replay equals the plain-Python reference
(tests/reference.py) on real Delta commits, slices add up to the whole, every row is accounted for.

One fixed example per family (its coverage asserted): an event-time temporal join with a changelog,
and an ASOF join with a table changed in place by MERGE and DELETE. Their decisions are tested on
hundreds of generated examples at the kernel's level (test_kernel_enrichment.py); this file checks
the wiring: Delta's change feed, the live runner's batches and state, the replay's slices. Then
processing-time joins while two live runners with different triggers run.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from conftest import append, at
from harness import (
    EVERYTHING,
    FINAL,
    SCHEMA,
    create_tables,
    delete,
    enrichment_job,
    live_accounting,
    positions,
    read_output,
    read_side,
    upsert,
    with_output,
    write_commit,
)
from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType, TimestampType
from reference import STREAM_BUCKETS, TABLE_BUCKETS, Change, Event, asof_reference, temporal_reference

from streamjoin import delta_io
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict


def stream_events(spark, paths, written) -> list[Event]:
    found = positions(spark, paths[0], 0)
    return [
        Event(0, i, k, t, found[version], v)
        for side, version, rows in written
        if side == 0
        for i, k, t, v in rows
    ]


def replay_counts(metrics) -> tuple[dict[str, int], dict[str, int]]:
    stream, table = asdict(metrics.sources["l"]), asdict(metrics.sources["r"])
    return {b: stream[b] for b in STREAM_BUCKETS}, {b: table[b] for b in TABLE_BUCKETS}


def check_live(spark, spec, expected_stream: dict[str, int]) -> None:
    accounting, _ = live_accounting(spark, spec.output.location, FINAL + ("applied",))
    assert {b: accounting["l"][b] for b in STREAM_BUCKETS} == expected_stream
    assert accounting["l"]["unsettled"] == 0


def check_slices(spark, spec, root, cut: int, whole) -> None:
    """[a, b) and [b, c) replayed separately write what [a, c) wrote, and their counts add up."""
    a, c = EVERYTHING
    sliced = with_output(spec, f"{root}/sliced")
    parts = [replay(spark, sliced, a, at(cut)), replay(spark, sliced, at(cut), c)]
    assert read_output(spark, sliced.output.path) == read_output(
        spark, with_output(spec, f"{root}/exact").output.path
    )
    for side in ("late", "rejected"):
        assert read_side(spark, sliced.output.side(side)) == read_side(spark, f"{root}/exact_{side}"), side
    for source in ("l", "r"):
        total = Counter()
        for part in parts:
            assert part.balanced()
            total.update(asdict(part.sources[source]))
        assert {k: total[k] for k in asdict(whole.sources[source])} == asdict(whole.sources[source]), source


# ============================================================================ event-time temporal

# A LEFT event-time temporal join (grace 2s) with a changelog: out-of-order versions, a late version
# (r5), a tombstone (b at 5), NULL keys and times on both sides, and a row still open at the end
# (l8). Commits (side, rows (id, key, seconds | None, v)); a tombstone has id and v NULL.
TEMPORAL = [
    (1, [("r1", "a", 0, 1), ("r2", "b", 1, 1)]),
    (0, [("l1", "a", 3, 0), ("l2", "b", 2, 0), ("l3", None, 3, 0)]),
    (1, [("r3", "a", 6, 2), (None, "b", 5, None), ("r4", "c", None, 1)]),
    (1, [("r5", "a", 2, 3), ("r6", "c", 4, 1)]),
    (0, [("l4", "a", 7, 0), ("l5", "b", 6, 0), ("l6", "c", 5, 0), ("l7", "a", None, 0)]),
    (1, [("r7", "a", 9, 4)]),
    (0, [("l8", "a", 8, 0), ("l9", "c", 6, 0)]),
]


def test_event_time_temporal_live_replay_reference(spark, tmp_path):
    """Live (runs after commits 2 and 4, then to the end) equals the exact replay equals the
    reference; complete mode applies the late version; two slices add up to the whole."""
    paths = create_tables(spark, tmp_path)
    spec = enrichment_job(
        tmp_path,
        paths,
        "left",
        {"key": ["k"], "time": "t", "changelog": True},
        {"on": "l.k = r.k", "as_of": "event_time", "grace": "2s"},
    )
    runner = LiveRunner(spark, spec, f"{tmp_path}/checkpoint")
    written, versions = [], {0: 0, 1: 0}
    for i, (side, rows) in enumerate(TEMPORAL):
        write_commit(spark, paths[side], rows)
        versions[side] += 1
        written.append((side, versions[side], rows))
        if i in (2, 4):
            runner.run()
    runner.run()

    stream = stream_events(spark, paths, written)
    found = positions(spark, paths[1], 1)
    table = [
        Change(i, (k,), t, found[version], deleted=i is None)
        for side, version, rows in written
        if side == 1
        for i, k, t, _ in rows
    ]
    expected, s_counts, t_counts = temporal_reference(stream, table, 2, "left")
    assert min(t_counts["late"], t_counts["rejected"], s_counts["open"], s_counts["rejected"]) >= 1
    assert s_counts["unmatched_emitted"] >= 1 and s_counts["joined"] >= 3  # the fixed data covers it all
    exact = with_output(spec, f"{tmp_path}/exact")
    whole = replay(spark, exact, *EVERYTHING)
    assert read_output(spark, exact.output.path) == expected, "exact replay differs from the reference"
    assert whole.balanced() and replay_counts(whole) == (s_counts, t_counts)
    assert read_output(spark, spec.output.path) == expected, "live output differs from the exact replay"
    for side in ("late", "rejected"):
        assert read_side(spark, spec.output.side(side)) == read_side(spark, exact.output.side(side)), side
    check_live(spark, spec, s_counts)

    complete = with_output(spec, f"{tmp_path}/complete")
    everything = replay(spark, complete, *EVERYTHING, options=RunOptions(mode="complete"))
    expected_complete, s_complete, t_complete = temporal_reference(stream, table, 2, "left", "complete")
    assert expected_complete != expected  # the late version counts in complete mode
    assert read_output(spark, complete.output.path) == expected_complete
    assert replay_counts(everything) == (s_complete, t_complete)
    check_slices(spark, spec, tmp_path, 5, whole)


# ============================================================================ ASOF

# An INNER ASOF join (r.t <= l.t) with a table keyed by (k, t) changed in place by MERGE and DELETE,
# with a clock skew of an hour: l2 finds no row, l4 sees (a, 0) deleted and (a, 2) added, l5 the
# update of (b, 1), and l7 (after the table's last commit) is still open. Commits (side, rows,
# deletes): stream rows (id, key, seconds | None, v), table upserts (id, key, seconds, v).
ASOF = [
    (1, [("r1", "a", 0, 0), ("r2", "a", 4, 0), ("r3", "b", 1, 0)], []),
    (0, [("l1", "a", 3, 0), ("l2", "b", 0, 0), ("l3", None, 3, 0)], []),
    (1, [], [("a", 0)]),
    (1, [("r4", "b", 1, 1), ("r5", "a", 2, 0)], []),
    (0, [("l4", "a", 3, 0), ("l5", "b", 5, 0), ("l6", "a", None, 0)], []),
    (1, [("r6", "c", 0, 0)], []),
    (0, [("l7", "a", 9, 0)], []),
]


def test_asof_live_replay_reference(spark, tmp_path):
    """Live (runs after commits 1 and 3, then to the end) equals the exact replay equals the
    reference, and two slices add up to the whole."""
    paths = create_tables(spark, tmp_path)
    spec = enrichment_job(
        tmp_path,
        paths,
        "inner",
        {"key": ["k", "t"], "clock_skew": "3600s"},
        {"on": "l.k = r.k AND r.t <= l.t", "asof": True},
    )
    runner = LiveRunner(spark, spec, f"{tmp_path}/checkpoint")
    written, table_writes, version = [], [], {0: 0, 1: 0}
    for i, (side, rows, deletes) in enumerate(ASOF):
        version[side] += 1
        if side == 0:
            write_commit(spark, paths[0], rows)
            written.append((0, version[0], rows))
        elif deletes:
            ((key, t),) = deletes
            delete(spark, paths[1], f"k = '{key}' AND t = TIMESTAMP '{at(t)}'")
            table_writes.append((version[1], [(None, key, t, None)], True))
        else:
            upsert(spark, paths[1], [(i_, k, at(t), v) for i_, k, t, v in rows], SCHEMA, ("k", "t"))
            table_writes.append((version[1], rows, False))
        if i in (1, 3):
            runner.run()
    runner.run()

    stream = stream_events(spark, paths, written)
    found = positions(spark, paths[1], 1)
    table = [
        Change(i, (k, t), t, found[v], deleted=gone) for v, rows, gone in table_writes for i, k, t, _ in rows
    ]
    expected, counts = asof_reference(stream, table, "inner", 3600 * 1_000_000)
    assert counts["joined"] >= 3 and min(counts["unmatched_dropped"], counts["open"], counts["rejected"]) >= 1
    exact = with_output(spec, f"{tmp_path}/exact")
    whole = replay(spark, exact, *EVERYTHING)
    assert read_output(spark, exact.output.path) == expected, "exact replay differs from the reference"
    assert whole.balanced() and replay_counts(whole)[0] == counts
    assert read_output(spark, spec.output.path) == expected, "live output differs from the exact replay"
    check_live(spark, spec, counts)
    check_slices(spark, spec, tmp_path, 4, whole)


# ============================================================================ a DELETE in event time

RATES_AT = StructType(
    [StructField("k", StringType()), StructField("v", IntegerType()), StructField("t", TimestampType())]
)
ORDERS_AT = StructType(
    [StructField("id", StringType()), StructField("k", StringType()), StructField("t", TimestampType())]
)


def test_a_delete_neither_moves_the_watermark_nor_is_late_in_either_form(spark, tmp_path):
    """Issue 15's rates: a=1 (version time 5 s), b=7 (6 s), b deleted, a=2 (8 s), then an order for
    a at 10 s and one for b at 7 s, LEFT, as of event time. The DELETE is committed now, years after
    those event times: in place it takes the table's event-time clock (6 s), so a=2 is on time and
    the order joins it; as a changelog the tombstone carries its time (6 s). Both forms, both runners,
    the same rows."""
    orders = f"{tmp_path}/orders"
    spark.createDataFrame([], ORDERS_AT).write.format("delta").save(orders)
    results = {}
    for form in ("in_place", "changelog"):
        rates = f"{tmp_path}/rates_{form}"
        table = {"path": rates, "kind": "table", "key": ["k"], "time": "t", "changelog": form == "changelog"}
        spec = spec_from_dict(
            {
                "name": f"rated_{form}",
                "sources": {"orders": {"path": orders, "time": "t"}, "rates": table},
                "from": "orders",
                "joins": [
                    {
                        "join": "rates",
                        "type": "left",
                        "on": "orders.k = rates.k",
                        "as_of": "event_time",
                        "grace": "2s",
                    }
                ],
                "select": ["orders.id AS id", "rates.v AS v"],
                "output": {"path": f"{tmp_path}/out_{form}"},
            }
        )

        def write(rows, rates=rates, form=form):
            if form == "in_place":
                upsert(spark, rates, rows, RATES_AT, ("k",))
            else:
                append(spark, rates, rows, RATES_AT)

        write([("a", 1, at(5)), ("b", 7, at(6))])
        if form == "in_place":
            delete(spark, rates, "k = 'b'")
        else:
            write([("b", None, at(6))])  # a tombstone: its value is NULL
        runner = LiveRunner(spark, spec, f"{tmp_path}/checkpoint_{form}")
        write([("a", 2, at(8))])
        if form == "in_place":  # one orders table for both jobs
            append(spark, orders, [("o1", "a", at(10)), ("o2", "b", at(7))], ORDERS_AT)
        runner.run()
        write([("a", 3, at(20))])  # moves the table's watermark past the orders
        runner.run()
        replayed = with_output(spec, f"{tmp_path}/replay_{form}")
        metrics = replay(spark, replayed, *EVERYTHING)
        assert metrics.sources["rates"].late == 0, form
        live = {r.id: r.v for r in spark.read.format("delta").load(spec.output.location).collect()}
        assert live == {
            r.id: r.v for r in spark.read.format("delta").load(replayed.output.location).collect()
        }
        results[form] = live
    assert results["in_place"] == results["changelog"] == {"o1": 2, "o2": None}


# ============================================================================ processing time, while it runs

RATE_ORDERS = StructType(
    [
        StructField("order_id", StringType()),
        StructField("currency", StringType()),
        StructField("t", TimestampType()),
    ]
)
RATES = StructType([StructField("currency", StringType()), StructField("rate", DoubleType())])


def test_processing_time_is_deterministic_whatever_the_triggers(spark, tmp_path):
    """Orders and a rates table updated in place take turns committing while two live runners
    with different trigger intervals run; both, and the replay, join each order with the rates
    version current at the order's commit, as Delta time travel to that instant shows."""
    orders, rates = str(tmp_path / "orders"), str(tmp_path / "rates")
    spark.createDataFrame([], RATE_ORDERS).write.format("delta").save(orders)
    upsert(spark, rates, [("EUR", 1.0), ("USD", 0.9)], RATES, ("currency",))
    spec = spec_from_dict(
        {
            "name": "rated",
            "sources": {
                "orders": {"path": orders, "time": "t"},
                "rates": {"path": rates, "kind": "table", "key": ["currency"]},
            },
            "from": "orders",
            "joins": [{"join": "rates", "type": "left", "on": "orders.currency = rates.currency"}],
            "select": ["order_id", "rate"],
            "output": {"path": f"{tmp_path}/fast"},
        }
    )
    runners = {
        "fast": LiveRunner(spark, spec, f"{tmp_path}/ck_fast", trigger="processing-time:1s"),
        "slow": LiveRunner(
            spark, with_output(spec, f"{tmp_path}/slow"), f"{tmp_path}/ck_slow", trigger="processing-time:4s"
        ),
    }
    written = threading.Event()  # the runners stop once every commit is in (the runs below finish them)
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(runner.run, 120, written.is_set) for runner in runners.values()]
        names = {f"streamjoin_{spec.name}_{runner.app_id[-8:]}" for runner in runners.values()}
        deadline = time.monotonic() + 120

        def active() -> set[str]:  # each runner's query runs in the runner's own session
            return {q.name for runner in runners.values() for q in runner.spark.streams.active}

        while not names <= active() and time.monotonic() < deadline:
            time.sleep(0.2)  # both queries up
        assert names <= active(), "the two live queries did not start"
        for n in range(8):
            append(spark, orders, [(f"o{n}a", "EUR", at(n)), (f"o{n}b", "USD", at(n))], RATE_ORDERS)
            upsert(
                spark,
                rates,
                [("EUR", 1.0 + (n + 1) / 100), ("USD", 0.9 - (n + 1) / 100)],
                RATES,
                ("currency",),
            )
            time.sleep(0.5 * (n % 3))
        written.set()
        for future in running:
            future.result()
    for (
        runner
    ) in runners.values():  # then, from the same checkpoints, whatever the last interval had not reached
        LiveRunner(spark, runner.spec, runner.checkpoint).run(300)
    replayed = with_output(spec, f"{tmp_path}/replay")
    replay(spark, replayed, at(-10), at(100))

    expected, snapshots = {}, {}  # the rates table's snapshots by version, each read once
    for r in (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(orders)
        .collect()
    ):
        version = delta_io.version_at(spark, rates, r._commit_timestamp)
        if version not in snapshots:
            rows = delta_io.read_snapshot(spark, rates, version).collect()
            snapshots[version] = {x.currency: x.rate for x in rows}
        expected[r.order_id] = snapshots[version][r.currency]
    assert len(expected) == 16 and len(set(expected.values())) >= 8  # the rates did move under the orders
    for name, location in (
        ("fast", f"{tmp_path}/fast"),
        ("slow", f"{tmp_path}/slow"),
        ("replay", f"{tmp_path}/replay"),
    ):
        got = {r.order_id: r.rate for r in spark.read.format("delta").load(location).collect()}
        assert got == expected, name
        assert spark.read.format("delta").load(location).count() == 16, name
