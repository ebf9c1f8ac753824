"""The table-table join's result changes at the kernel's level, against a plain-Python reference.

Random upserts and deletes of two changelogs keyed alike (a primary-key join, INNER, LEFT, FULL);
tests/kernel_harness.py lays `STACK` examples end to end as one history. The reference recomputes,
after every commit in arrival order, the result row of each key the commit touched: an `upsert`
when it appears or its values change, a `delete` when it disappears. A replay of everything must
write exactly those changes and the final result table; live batches cut after random commits,
each emitting what settled after the previous batch's bound, must write them too, once.

Chains of three tables (ksqlDB's N-way table joins): l JOIN r ON l.k = r.k (primary key) JOIN s
ON r.v = s.k (a key taken from r's value: s changes touch every result row whose r row points at
them at that moment), each INNER or LEFT, against a reference that recomputes every result row
after every commit.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_harness import (
    SETTINGS,
    LaidTables,
    at_random,
    lay_tables_end_to_end,
    result_table,
    tables_step,
)
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from streamjoin import kernel
from streamjoin.errors import UnsupportedJobError
from streamjoin.plan import bind
from streamjoin.spec import spec_from_dict

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_EXAMPLES", "1"))  # histories of STACK examples
STACK = 60
KV = StructType([StructField("k", StringType()), StructField("v", StringType())])


@pytest.fixture(scope="module")
def paths(spark, tmp_path_factory):
    """Two empty changelogs: the plan binds against their schemas; no row is ever written."""
    root = tmp_path_factory.mktemp("kernel_table_table")
    for side in ("left", "right", "third"):
        spark.createDataFrame([], KV).write.format("delta").save(f"{root}/{side}")
    return root


def plan_for(spark, root, how: str):
    table = {"kind": "table", "key": ["k"], "changelog": True, "clock_skew": "0s"}
    return bind(
        spark,
        spec_from_dict(
            {
                "name": "tt",
                "sources": {"l": {"path": f"{root}/left", **table}, "r": {"path": f"{root}/right", **table}},
                "from": "l",
                "joins": [{"join": "r", "type": how, "on": "l.k = r.k"}],
                "select": ["l.v AS lv", "r.v AS rv"],
                "output": {"path": f"{root}/out"},
            }
        ),
    )


@st.composite
def table_commits(draw):
    """Commits (side, rows (key, value | None)): None deletes the key; one change per key and commit."""
    commits = []
    for _ in range(draw(st.integers(1, 7))):
        side = draw(st.sampled_from((0, 1)))
        keys = draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=3, unique=True))
        rows = [
            (k, None if draw(st.integers(0, 3)) == 0 else f"{'lr'[side]}{draw(st.integers(0, 9))}")
            for k in keys
        ]
        commits.append((side, rows))
    return commits


def reference(laid: LaidTables, how: str) -> tuple[Counter, set]:
    """(result changes (key, op, lv, rv, source, version), final result rows (key, lv, rv))."""
    tables: tuple[dict, dict] = ({}, {})
    result: dict[str, tuple] = {}
    changes: Counter = Counter()
    for side, version, rows in laid.commits:
        apply_commit(tables[side], rows)
        for key in {k for k, _ in rows}:
            lv, rv = tables[0].get(key), tables[1].get(key)
            exists = {
                "inner": lv is not None and rv is not None,
                "left": lv is not None,
                "full": lv is not None or rv is not None,
            }[how]
            now = (lv, rv) if exists else None
            if now is not None and now != result.get(key):
                changes[(key, "upsert", lv, rv, side, version)] += 1
                result[key] = now
            elif now is None and key in result:
                changes[(key, "delete", None, None, side, version)] += 1
                del result[key]
    return changes, {(key, *values) for key, values in result.items()}


def apply_commit(table: dict, rows: list[tuple[str, str | None]]) -> None:
    """One commit's changes to its table: a value sets the key, None deletes it."""
    for key, value in rows:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value


def written(output, *values: str) -> Counter:
    """The result changes a step wrote: (key, op, each of `values`, source, version)."""
    rows = output.select(
        F.col("result_key.k").alias("k"), "op", *values, "change_source", "change_version"
    ).collect()
    return Counter(tuple(r) for r in rows)


def versions_upto(laid: LaidTables, end: int) -> dict[int, int]:
    """Each table's newest version among the commits up to index `end` (0: none yet)."""
    return {
        side: max((v for s, v, _ in laid.commits[: end + 1] if s == side), default=0) for side in laid.rows
    }


def live_changes(spark, plan, laid: LaidTables, cuts, *values: str) -> Counter:
    """Live batches ending after the commits `cuts` (and the last one), each emitting what settled
    after the previous batch's bound: the changes they wrote, together."""
    got: Counter = Counter()
    seen, bound = dict.fromkeys(laid.rows, -1), None
    for end in sorted({*cuts, len(laid.commits) - 1}):
        upto = versions_upto(laid, end)
        result = tables_step(spark, plan, laid, upto, seen, bound)
        got.update(written(result.output, *values))
        seen, bound = upto, result.watermark if result.watermark is not None else bound
    return got


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_replay_writes_the_reference_changes_and_result(spark, paths, data):
    how = data.draw(st.sampled_from(("inner", "left", "full")), label="join type")
    laid = lay_tables_end_to_end(
        data.draw(at_random(st.lists(table_commits(), min_size=STACK, max_size=STACK)))
    )
    last = versions_upto(laid, len(laid.commits) - 1)
    result = tables_step(spark, plan_for(spark, paths, how), laid, last, {0: -1, 1: -1}, None)
    expected, final = reference(laid, how)
    assert written(result.output, "lv", "rv") == expected
    assert {(r["result_key"]["k"], r["lv"], r["rv"]) for r in result_table(result).collect()} == final
    assert result.counts["l"].applied == sum(len(rows) for s, _, rows in laid.commits if s == 0)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_live_batches_write_each_change_once(spark, paths, data):
    how = data.draw(st.sampled_from(("inner", "left", "full")), label="join type")
    laid = lay_tables_end_to_end(
        data.draw(at_random(st.lists(table_commits(), min_size=STACK, max_size=STACK)))
    )
    cuts = data.draw(st.sets(st.integers(0, len(laid.commits) - 1), min_size=1, max_size=5), label="cuts")
    plan = plan_for(spark, paths, how)
    assert live_changes(spark, plan, laid, cuts, "lv", "rv") == reference(laid, how)[0]


def chain_plan_for(spark, root, first: str, second: str):
    table = {"kind": "table", "key": ["k"], "changelog": True, "clock_skew": "0s"}
    return bind(
        spark,
        spec_from_dict(
            {
                "name": "tt_chain",
                "sources": {
                    "l": {"path": f"{root}/left", **table},
                    "r": {"path": f"{root}/right", **table},
                    "s": {"path": f"{root}/third", **table},
                },
                "from": "l",
                "joins": [
                    {"join": "r", "type": first, "on": "l.k = r.k"},
                    {"join": "s", "type": second, "on": "r.v = s.k"},
                ],
                "select": ["l.v AS lv", "r.v AS rv", "s.v AS sv"],
                "output": {"path": f"{root}/out_chain"},
            }
        ),
    )


@st.composite
def chain_commits(draw):
    """Commits of l, r and s (sides 0, 1, 2): r's values name s's keys."""
    commits = []
    for _ in range(draw(st.integers(1, 8))):
        side = draw(st.sampled_from((0, 1, 2)))
        keys = draw(st.lists(st.sampled_from("abc"), min_size=1, max_size=2, unique=True))
        values = "abc" if side == 1 else [f"{'ls'[side // 2]}{n}" for n in range(3)]
        rows = [(k, None if draw(st.integers(0, 3)) == 0 else draw(st.sampled_from(values))) for k in keys]
        commits.append((side, rows))
    return commits


def chain_reference(laid: LaidTables, first: str, second: str) -> tuple[Counter, set]:
    """(result changes (key, op, lv, rv, sv, source, version), final result rows): every result
    row recomputed after every commit; a change where one appeared, changed or disappeared."""
    tables: tuple[dict, dict, dict] = ({}, {}, {})
    result: dict[str, tuple] = {}
    changes: Counter = Counter()
    for side, version, rows in laid.commits:
        apply_commit(tables[side], rows)
        now = {}
        for key, lv in tables[0].items():
            rv = tables[1].get(key)
            sv = None if rv is None else tables[2].get(rv)
            if (first == "inner" and rv is None) or (second == "inner" and sv is None):
                continue
            now[key] = (lv, rv, sv)
        for key in sorted(set(now) | set(result)):
            if key in now and now[key] != result.get(key):
                changes[(key, "upsert", *now[key], side, version)] += 1
            elif key not in now:
                changes[(key, "delete", None, None, None, side, version)] += 1
        result = now
    return changes, {(key, *values) for key, values in result.items()}


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_a_chain_of_three_tables_replayed_and_live_writes_the_reference_changes(spark, paths, data):
    first = data.draw(st.sampled_from(("inner", "left")), label="l JOIN r")
    second = data.draw(st.sampled_from(("inner", "left")), label="JOIN s")
    laid = lay_tables_end_to_end(
        data.draw(at_random(st.lists(chain_commits(), min_size=STACK, max_size=STACK))),
        tables=3,
        values_are_keys=(1,),
    )
    plan = chain_plan_for(spark, paths, first, second)
    expected, final = chain_reference(laid, first, second)
    last = versions_upto(laid, len(laid.commits) - 1)
    result = tables_step(spark, plan, laid, last, dict.fromkeys(range(3), -1), None)
    assert written(result.output, "lv", "rv", "sv") == expected
    assert {
        (r["result_key"]["k"], r["lv"], r["rv"], r["sv"]) for r in result_table(result).collect()
    } == final
    cuts = data.draw(st.sets(st.integers(0, len(laid.commits) - 1), min_size=1, max_size=4), label="cuts")
    assert live_changes(spark, plan, laid, cuts, "lv", "rv", "sv") == expected


def test_a_full_join_is_a_table_chains_only_join(spark, paths):
    with pytest.raises(
        UnsupportedJobError, match=r"join 2 \(JOIN s\): a FULL table-table join must be the job's only join"
    ):
        kernel.family(chain_plan_for(spark, paths, "left", "full"))
    with pytest.raises(UnsupportedJobError, match="a FULL table-table join must be the job's only join"):
        kernel.family(chain_plan_for(spark, paths, "full", "left"))
