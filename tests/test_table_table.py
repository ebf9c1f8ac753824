"""Table-table joins (ksqlDB primary-key and foreign-key semantics), in both runners.

1. ksqlDB's primary-key semantics table (INNER, LEFT, OUTER, with output tombstones) and its
   foreign-key table (INNER, LEFT), each reproduced as the sequence of result changes, replayed,
   and live (runs between the commits) for OUTER and foreign-key LEFT, plus the final result table.
2. A live batch killed after writing its changes is redone without duplicate changes.
3. Many-to-many joins are refused with a message.

Random upserts and deletes are decided at the kernel's level (test_kernel_table_table.py); this
file checks the wiring: Delta's change feed, the live runner's MERGE into the result table, the
replay's overwrite.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import append
from harness import EVERYTHING, FailOnce, concurrently, run_live, with_output
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from streamjoin import delta_io
from streamjoin.errors import UnsupportedJobError
from streamjoin.kernel import family
from streamjoin.plan import bind
from streamjoin.runners.hooks import after_write
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict

DATA = json.loads((Path(__file__).parent / "data" / "ksqldb_table_table.json").read_text())
KV = StructType([StructField("k", StringType()), StructField("v", StringType())])
LEFT_FK = StructType(
    [StructField("id", StringType()), StructField("fk", StringType()), StructField("n", IntegerType())]
)
RIGHT_FK = StructType([StructField("pk", StringType()), StructField("n", IntegerType())])


def table_job(
    root,
    name: str,
    left: str,
    right: str,
    left_key: str,
    right_key: str,
    how: str,
    on: str,
    select: list[str],
):
    return spec_from_dict(
        {
            "name": name,
            "sources": {
                "l": {
                    "path": left,
                    "kind": "table",
                    "key": [left_key],
                    "changelog": True,
                    "clock_skew": "0s",
                },
                "r": {
                    "path": right,
                    "kind": "table",
                    "key": [right_key],
                    "changelog": True,
                    "clock_skew": "0s",
                },
            },
            "from": "l",
            "joins": [{"join": "r", "type": how, "on": on}],
            "select": select,
            "output": {"path": f"{root}/{name}"},
        }
    )


def change_log(spark, spec) -> list:
    """The job's result changes in the order they happened: (source, version, op, row as dict)."""
    if not delta_io.exists(spark, spec.output.side("changes")):
        return []
    rows = spark.read.format("delta").load(spec.output.side("changes")).collect()
    rows.sort(
        key=lambda r: (
            r.event_time,
            r.change_source,
            r.change_version,
            json.dumps(r.asDict(recursive=True), default=str),
        )
    )
    return [(r.change_source, r.change_version, r.op, r.asDict(recursive=True)) for r in rows]


def result_table(spark, spec) -> set:
    if not delta_io.exists(spark, spec.output.location):
        return set()  # no change was ever written
    columns = [c for c in spark.read.format("delta").load(spec.output.location).columns if c != "event_time"]
    return {
        json.dumps(r.asDict(recursive=True), sort_keys=True)
        for r in spark.read.format("delta").load(spec.output.location).select(*columns).collect()
    }


def write_events(spark, paths, events, row, runners=(), runs=()) -> dict[tuple[int, int], int]:
    """Each event one commit; live runs after the events in `runs`; (side, version) -> seed timestamp."""
    versions, at_version = {0: 0, 1: 0}, {}
    for index, event in enumerate(events):
        side = 0 if event[1] == "l" else 1
        append(
            spark, paths[side], [row(event)], KV if len(event) == 3 else (LEFT_FK if side == 0 else RIGHT_FK)
        )
        versions[side] += 1
        at_version[(side, versions[side])] = event[0]
        if index in runs:
            run_live(runners)
    return at_version


def build(spark, root, events, specs, row, runs, live: str):
    """The seed's events as commits; the `live` join type run live after the events in `runs` and
    at the end; every join type replayed. (Each type's live batches are decided on generated
    histories at the kernel's level, test_kernel_table_table.py.)"""
    paths = {0: f"{root}/left", 1: f"{root}/right"}
    schema = KV if len(events[0]) == 3 else None
    for side in (0, 1):
        frame_schema = schema or (LEFT_FK if side == 0 else RIGHT_FK)
        spark.createDataFrame([], frame_schema).write.format("delta").save(paths[side])
    specs = {how: make(paths) for how, make in specs.items()}
    runners = [LiveRunner(spark, specs[live], f"{root}/checkpoint_{specs[live].name}")]
    at_version = write_events(spark, paths, events, row, runners, runs)
    run_live(runners)
    replays = concurrently(
        {
            how: (lambda s=s: replay(spark, with_output(s, f"{s.output.location}_replay"), *EVERYTHING))
            for how, s in specs.items()
        }
    )
    return SimpleNamespace(specs=specs, at_version=at_version, replays=replays, live=live)


# ============================================================================ 1. primary key


@pytest.fixture(scope="module")
def pk(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("pk")
    makers = {
        how: (
            lambda paths, how=how: table_job(
                root, f"pk_{how}", paths[0], paths[1], "k", "k", how, "l.k = r.k", ["l.v AS lv", "r.v AS rv"]
            )
        )
        for how in ("inner", "left", "full")
    }
    events = DATA["primary_key"]["events"]
    return build(spark, root, events, makers, lambda e: ("k", e[2]), runs=(5, 10), live="full")


def pk_sequence(spark, spec, at_version) -> list:
    return [
        [at_version[(source, version)], "tombstone"]
        if op == "delete"
        else [at_version[(source, version)], row["lv"], row["rv"]]
        for source, version, op, row in change_log(spark, spec)
    ]


@pytest.mark.parametrize("how", ("inner", "left", "full"))
def test_ksqldb_primary_key_semantics(spark, pk, how):
    """The seed's changes in order and its final row, replayed; live too for the type run live."""
    spec = pk.specs[how]
    expected = DATA["primary_key"]["expected"][how]
    replayed = with_output(spec, f"{spec.output.location}_replay")
    assert pk_sequence(spark, replayed, pk.at_version) == expected
    final = expected[-1]
    table = {json.dumps({"result_key": {"k": "k"}, "lv": final[1], "rv": final[2]}, sort_keys=True)}
    assert result_table(spark, replayed) == table
    if how == pk.live:
        assert pk_sequence(spark, spec, pk.at_version) == expected
        assert result_table(spark, spec) == table
    metrics = pk.replays[how]
    assert metrics.balanced() and metrics.upserts + metrics.deletes == len(expected)
    assert metrics.deletes == sum(1 for e in expected if e[1] == "tombstone")


# ============================================================================ 1. foreign key


@pytest.fixture(scope="module")
def fk(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("fk")
    select = ["l.id AS id", "l.fk AS fk", "l.n AS ln", "r.pk AS rk", "r.n AS rn"]
    makers = {
        how: (
            lambda paths, how=how: table_job(
                root, f"fk_{how}", paths[0], paths[1], "id", "pk", how, "l.fk = r.pk", select
            )
        )
        for how in ("inner", "left")
    }

    def row(event):
        _, side, key, foreign, value = event
        return (key, foreign, value) if side == "l" else (key, value)

    return build(spark, root, DATA["foreign_key"]["events"], makers, row, runs=(4, 9), live="left")


def fk_sequence(spark, spec, at_version) -> list:
    result = []
    for source, version, op, row in change_log(spark, spec):
        when = at_version[(source, version)]
        if op == "delete":
            result.append([when, row["result_key"]["id"], "tombstone"])
        else:
            result.append([when, row["id"], row["fk"], row["ln"], row["rk"], row["rn"]])
    return result


@pytest.mark.parametrize("how", ("inner", "left"))
def test_ksqldb_foreign_key_semantics(spark, fk, how):
    """The seed's changes in order, replayed; live = replay for the type run live."""
    spec = fk.specs[how]
    expected = DATA["foreign_key"]["expected"][how]
    replayed = with_output(spec, f"{spec.output.location}_replay")
    sequence = fk_sequence(spark, replayed, fk.at_version)
    assert sorted(sequence, key=str) == sorted(expected, key=str)
    assert [e[0] for e in sequence] == [e[0] for e in expected]  # in order
    if how == fk.live:
        assert fk_sequence(spark, spec, fk.at_version) == sequence
        assert result_table(spark, spec) == result_table(spark, replayed)
    # Row 8 of the seed: one right change, two result updates.
    assert sum(1 for e in expected if e[0] == 8) == 2


# ============================================================================ 2. restart, 3. refusals


def test_batch_killed_after_writing_changes_is_redone_once(spark, tmp_path):
    paths = {0: f"{tmp_path}/left", 1: f"{tmp_path}/right"}
    for side in (0, 1):
        spark.createDataFrame([], KV).write.format("delta").save(paths[side])
    spec = table_job(
        tmp_path, "restart", paths[0], paths[1], "k", "k", "left", "l.k = r.k", ["l.v AS lv", "r.v AS rv"]
    )
    append(spark, paths[0], [("a", "A"), ("b", "B")], KV)
    LiveRunner(spark, spec, f"{tmp_path}/checkpoint").run()
    append(spark, paths[1], [("a", "x")], KV)
    append(spark, paths[0], [("b", None)], KV)
    hook = FailOnce("changes")
    with pytest.raises(Exception, match="injected failure"), after_write(hook):
        LiveRunner(spark, spec, f"{tmp_path}/checkpoint").run()
    assert hook.fired == 1
    LiveRunner(spark, spec, f"{tmp_path}/checkpoint").run()
    replayed = with_output(spec, f"{tmp_path}/replay")
    replay(spark, replayed, *EVERYTHING)
    assert change_log(spark, spec) == change_log(spark, replayed)
    assert [op for _, _, op, _ in change_log(spark, spec)] == ["upsert", "upsert", "upsert", "delete"]
    assert result_table(spark, spec) == {
        json.dumps({"result_key": {"k": "a"}, "lv": "A", "rv": "x"}, sort_keys=True)
    }
    # The result as of an earlier pair of versions: the left table's first commit, the right empty.
    earlier = with_output(spec, f"{tmp_path}/as_of_first_commit")
    replay(spark, earlier, *EVERYTHING, options=RunOptions(versions={"l": 1, "r": 0}))
    assert result_table(spark, earlier) == {
        json.dumps({"result_key": {"k": k}, "lv": v, "rv": None}, sort_keys=True)
        for k, v in (("a", "A"), ("b", "B"))
    }


def test_many_to_many_is_refused(spark, tmp_path):
    paths = {0: f"{tmp_path}/left", 1: f"{tmp_path}/right"}
    append(spark, paths[0], [("a", "A")], KV)
    append(spark, paths[1], [("a", "x")], KV)
    spec = table_job(tmp_path, "nm", paths[0], paths[1], "k", "k", "inner", "l.v = r.v", ["l.k AS lk"])
    with pytest.raises(UnsupportedJobError) as error:
        family(bind(spark, spec))
    assert "must equate the right table's whole primary key (k)" in str(error.value)
    assert "many-to-many" in str(error.value)


def test_a_chain_of_three_tables_live_equals_replay(spark, tmp_path):
    """orders JOIN customers ON orders.v = customers.k (a foreign key) JOIN regions ON
    customers.v = regions.k (a key from the second table): a region's change reaches the orders
    of the customers in it at that moment. LEFT live in three runs, and replayed as INNER and LEFT."""
    paths = {name: f"{tmp_path}/{name}" for name in ("orders", "customers", "regions")}
    for path in paths.values():
        spark.createDataFrame([], KV).write.format("delta").save(path)
    table = {"kind": "table", "key": ["k"], "changelog": True, "clock_skew": "0s"}

    def job(how: str):
        return spec_from_dict(
            {
                "name": f"tt_chain_{how}",
                "sources": {name: {"path": path, **table} for name, path in paths.items()},
                "from": "orders",
                "joins": [
                    {"join": "customers", "type": how, "on": "orders.v = customers.k"},
                    {"join": "regions", "type": how, "on": "customers.v = regions.k"},
                ],
                "select": ["orders.v AS customer", "customers.v AS region", "regions.v AS name"],
                "output": {"path": f"{tmp_path}/out_{how}"},
            }
        )

    specs = {how: job(how) for how in ("inner", "left")}
    runner = LiveRunner(spark, specs["left"], f"{tmp_path}/checkpoint")
    events = [
        ("regions", "eu", "Europe"),
        ("customers", "c1", "eu"),
        ("orders", "o1", "c1"),
        ("orders", "o2", "c2"),  # no customer c2 yet
        None,
        ("customers", "c2", "us"),
        ("regions", "us", "USA"),  # reaches o2 through c2
        ("regions", "eu", "Europa"),  # reaches o1 through c1
        None,
        ("customers", "c1", "us"),  # o1 moves to us
        ("regions", "us", None),  # a tombstone: both orders lose their region
        None,
    ]
    for event in events:
        if event is None:
            run_live([runner])
        else:
            append(spark, paths[event[0]], [event[1:]], KV)
    replays = {how: with_output(spec, f"{tmp_path}/replay_{how}") for how, spec in specs.items()}
    for spec in replays.values():
        replay(spark, spec, *EVERYTHING)

    def values(log) -> list:
        return [
            (op, row["result_key"]["k"], row["customer"], row["region"], row["name"]) for _, _, op, row in log
        ]

    expected = {
        "left": [
            ("upsert", "o1", "c1", "eu", "Europe"),
            ("upsert", "o2", "c2", None, None),
            ("upsert", "o2", "c2", "us", None),
            ("upsert", "o2", "c2", "us", "USA"),
            ("upsert", "o1", "c1", "eu", "Europa"),
            ("upsert", "o1", "c1", "us", "USA"),
            ("upsert", "o1", "c1", "us", None),
            ("upsert", "o2", "c2", "us", None),
        ],
        "inner": [
            ("upsert", "o1", "c1", "eu", "Europe"),
            ("upsert", "o2", "c2", "us", "USA"),
            ("upsert", "o1", "c1", "eu", "Europa"),
            ("upsert", "o1", "c1", "us", "USA"),
            ("delete", "o1", None, None, None),
            ("delete", "o2", None, None, None),
        ],
    }
    for how, spec in replays.items():
        assert values(change_log(spark, spec)) == expected[how], how
    assert change_log(spark, specs["left"]) == change_log(spark, replays["left"])
    assert result_table(spark, specs["left"]) == result_table(spark, replays["left"])
    assert len(result_table(spark, replays["left"])) == 2 and result_table(spark, replays["inner"]) == set()
