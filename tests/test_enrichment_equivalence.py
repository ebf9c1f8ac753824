"""Property tests of the enrichment joins: live equals the exact replay equals a plain-Python
reference (tests/reference.py), slices add up to the whole, and every row is accounted for.

- Event-time temporal join of a stream with an append-only changelog (random keys, out-of-order
  versions, late versions, tombstones, NULL keys and times), in exact and complete mode.
- ASOF join of a stream with a table updated in place by MERGE and DELETE (random upserts and
  deletes), with and without a clock skew that keeps the newest rows waiting.

Each example writes real Delta commits and runs Spark for real, so each test draws few examples
(STREAMJOIN_PROPERTY_EXAMPLES raises it).
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import pytest
from conftest import append, at
from harness import (
    EVERYTHING,
    FINAL,
    PROPERTY_SETTINGS,
    SCHEMA,
    create_tables,
    delete,
    live_accounting,
    positions,
    read_output,
    read_side,
    upsert,
    with_output,
    write_commit,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType
from reference import STREAM_BUCKETS, TABLE_BUCKETS, Change, Event, asof_reference, temporal_reference

from streamjoin import delta_io
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict


def enrichment_job(root, paths, how: str, table: dict, join: dict):
    return spec_from_dict(
        {
            "name": "enrich",
            "sources": {
                "l": {"path": paths[0], "time": "t"},
                "r": {"path": paths[1], "kind": "table", **table},
            },
            "from": "l",
            "joins": [{"join": "r", "type": how, **join}],
            "select": ["l.id AS lid", "r.id AS rid"],
            "output": {"path": f"{root}/out"},
        }
    )


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


@st.composite
def temporal_scenarios(draw):
    """Commits [(side, rows)]: stream rows (id, key, seconds | None, v); changelog rows
    (id | None, key, seconds | None, v | None), id and v None for a tombstone; and a grace."""
    commits, n = [], 0
    for c in range(draw(st.integers(3, 6))):
        side = draw(st.sampled_from((0, 1, 1)))
        rows, keys = [], set()
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            key = draw(st.sampled_from(("a", "b", "c", "a", None) if side == 0 else ("a", "b", "c", None)))
            if side == 1 and key in keys:
                continue  # one change per key and commit: their order would be the content's
            keys.add(key)
            t = None if draw(st.integers(0, 12)) == 0 else 3 * c + draw(st.integers(-6, 5))
            if side == 1 and draw(st.integers(0, 4)) == 0:
                rows.append((None, key, t, None))  # tombstone
            else:
                rows.append((f"{'lr'[side]}{n}", key, t, draw(st.integers(0, 2))))
        commits.append((side, rows))
    return commits, draw(st.sampled_from((0, 2, 5)))


@pytest.mark.parametrize("how", ("left", "inner"))
@settings(**PROPERTY_SETTINGS)
@given(data=st.data())
def test_event_time_temporal_live_replay_reference(spark, tmp_path_factory, how, data):
    commits, grace = data.draw(temporal_scenarios(), label="commits, grace")
    triggers = data.draw(
        st.sets(st.integers(0, len(commits) - 2), max_size=2), label="live runs after commits"
    )
    cut = data.draw(st.integers(-4, 3 * len(commits) + 4), label="slice boundary (seconds)")
    root = tmp_path_factory.mktemp("temporal")
    paths = create_tables(spark, root)
    spec = enrichment_job(
        root,
        paths,
        how,
        {"key": ["k"], "time": "t", "changelog": True},
        {"on": "l.k = r.k", "as_of": "event_time", "grace": f"{grace}s"},
    )
    runner = LiveRunner(spark, spec, f"{root}/checkpoint")
    written, versions = [], {0: 0, 1: 0}
    for i, (side, rows) in enumerate(commits):
        write_commit(spark, paths[side], rows)
        versions[side] += 1
        written.append((side, versions[side], rows))
        if i in triggers:
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
    exact = with_output(spec, f"{root}/exact")
    whole = replay(spark, exact, *EVERYTHING)
    expected, s_counts, t_counts = temporal_reference(stream, table, grace, how)
    assert read_output(spark, exact.output.path) == expected, "exact replay differs from the reference"
    assert whole.balanced() and replay_counts(whole) == (s_counts, t_counts)
    assert read_output(spark, spec.output.path) == expected, "live output differs from the exact replay"
    for side in ("late", "rejected"):
        assert read_side(spark, spec.output.side(side)) == read_side(spark, exact.output.side(side)), side
    check_live(spark, spec, s_counts)

    complete = with_output(spec, f"{root}/complete")
    everything = replay(spark, complete, *EVERYTHING, mode="complete")
    expected_complete, s_complete, t_complete = temporal_reference(stream, table, grace, how, "complete")
    assert read_output(spark, complete.output.path) == expected_complete
    assert replay_counts(everything) == (s_complete, t_complete)
    check_slices(spark, spec, root, cut, whole)


# ============================================================================ ASOF


@st.composite
def asof_scenarios(draw):
    """Commits [(side, rows, deletes)]: stream rows (id, key, seconds | None, v); table upserts
    (id, key, seconds, v) by primary key (key, seconds); deletes of existing primary keys."""
    commits, n, present = [], 0, set()
    for c in range(draw(st.integers(3, 6))):
        side = draw(st.sampled_from((0, 1)))
        if side == 1 and present and draw(st.integers(0, 3)) == 0:
            victim = draw(st.sampled_from(sorted(present)))
            present.discard(victim)
            commits.append((1, [], [victim]))
            continue
        rows, keys = [], set()
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            key = draw(st.sampled_from(("a", "b", "a", None) if side == 0 else ("a", "b")))
            t = None if side == 0 and draw(st.integers(0, 12)) == 0 else 3 * c + draw(st.integers(-6, 5))
            if side == 1:
                if (key, t) in keys:
                    continue
                keys.add((key, t))
                present.add((key, t))
            rows.append((f"{'lr'[side]}{n}", key, t, draw(st.integers(0, 2))))
        commits.append((side, rows, []))
    if all(side == 1 for side, _, _ in commits):
        commits.append((0, [(f"l{n + 1}", "a", 3 * len(commits), 0)], []))
    return commits


@pytest.mark.parametrize("how, skew", (("left", 0), ("inner", 3600)))
@settings(**PROPERTY_SETTINGS)
@given(data=st.data())
def test_asof_live_replay_reference(spark, tmp_path_factory, how, skew, data):
    commits = data.draw(asof_scenarios(), label="commits")
    triggers = data.draw(
        st.sets(st.integers(0, len(commits) - 2), max_size=2), label="live runs after commits"
    )
    cut = data.draw(st.integers(-4, 3 * len(commits) + 4), label="slice boundary (seconds)")
    root = tmp_path_factory.mktemp("asof")
    paths = create_tables(spark, root)
    spec = enrichment_job(
        root,
        paths,
        how,
        {"key": ["k", "t"], "clock_skew": f"{skew}s"},
        {"on": "l.k = r.k AND r.t <= l.t", "asof": True},
    )
    runner = LiveRunner(spark, spec, f"{root}/checkpoint")
    written, table_writes, version = [], [], {0: 0, 1: 0}
    for i, (side, rows, deletes) in enumerate(commits):
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
        if i in triggers:
            runner.run()
    runner.run()

    stream = stream_events(spark, paths, written)
    found = positions(spark, paths[1], 1)
    table = [
        Change(i, (k, t), t, found[v], deleted=gone) for v, rows, gone in table_writes for i, k, t, _ in rows
    ]
    exact = with_output(spec, f"{root}/exact")
    whole = replay(spark, exact, *EVERYTHING)
    expected, counts = asof_reference(stream, table, how, skew * 1_000_000)
    assert read_output(spark, exact.output.path) == expected, "exact replay differs from the reference"
    assert whole.balanced() and replay_counts(whole)[0] == counts
    assert read_output(spark, spec.output.path) == expected, "live output differs from the exact replay"
    check_live(spark, spec, counts)
    check_slices(spark, spec, root, cut, whole)


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
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(runner.run, 60) for runner in runners.values()]
        names = {f"streamjoin_{spec.name}_{runner.app_id[-8:]}" for runner in runners.values()}
        deadline = time.monotonic() + 120
        while not names <= {q.name for q in spark.streams.active} and time.monotonic() < deadline:
            time.sleep(0.2)  # both queries up
        assert names <= {q.name for q in spark.streams.active}, "the two live queries did not start"
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
        for future in running:
            future.result()
    for (
        runner
    ) in runners.values():  # then, from the same checkpoints, whatever the last interval had not reached
        LiveRunner(spark, runner.spec, runner.checkpoint).run(300)
    replayed = with_output(spec, f"{tmp_path}/replay")
    replay(spark, replayed, at(-10), at(100))

    expected = {}
    for r in (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(orders)
        .collect()
    ):
        version = delta_io.version_at(spark, rates, r._commit_timestamp)
        snapshot = {x.currency: x.rate for x in delta_io.read_snapshot(spark, rates, version).collect()}
        expected[r.order_id] = snapshot[r.currency]
    assert len(expected) == 16 and len(set(expected.values())) >= 8  # the rates did move under the orders
    for name, location in (
        ("fast", f"{tmp_path}/fast"),
        ("slow", f"{tmp_path}/slow"),
        ("replay", f"{tmp_path}/replay"),
    ):
        got = {r.order_id: r.rate for r in spark.read.format("delta").load(location).collect()}
        assert got == expected, name
        assert spark.read.format("delta").load(location).count() == 16, name
