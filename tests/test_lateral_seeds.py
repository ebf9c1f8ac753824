"""UNNEST and table-function joins end to end on Delta tables, in both runners, and the jobs they refuse.

Flink (004): `SELECT order_id, tag FROM Orders CROSS JOIN UNNEST(tags) AS t (tag)`, one row per
element, a row with an empty or NULL array dropped; the table function joins, INNER (`FROM
Orders, LATERAL TABLE(table_func(...)) t(res)`: a row whose call returns nothing is dropped) and
LEFT (`LEFT JOIN LATERAL TABLE(...) ON TRUE`: kept, padded with NULLs). Live (run between the
commits) = replay, and every input row accounted for.
"""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import append, at
from harness import live_accounting, read, source_counts
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamjoin.errors import JobError
from streamjoin.plan import bind, describe
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict

ORDERS = StructType(
    [
        StructField("order_id", IntegerType()),
        StructField("tags", ArrayType(StringType())),
        StructField("items", ArrayType(StructType([StructField("sku", StringType()), StructField("qty", IntegerType())]))),
        StructField("attrs", MapType(StringType(), IntegerType())),
        StructField("note", StringType()),
        StructField("t", TimestampType()),
    ]
)  # fmt: skip
# (order_id, tags, items, attrs, note, seconds), one commit per list.
COMMITS = [
    [
        (1, ["red", "big"], [("a", 2), ("b", 1)], {"x": 1}, "fast delivery", 10),
        (2, [], [], {}, "", 20),
    ],
    [
        (3, None, None, None, None, 30),
        (4, ["blue", None], [("c", 5)], {"y": 2, "z": 3}, "gift", 40),
    ],
]
LIVE_AFTER = (0, 1)


def job(root, name: str, join: dict, select: list[str], where: str | None = None):
    document = {
        "name": name,
        "sources": {"orders": {"path": str(root / "orders"), "time": "t"}},
        "from": "orders",
        "joins": [join],
        "select": select,
        "output": {"path": str(root / f"out_{name}")},
    }
    if where:
        document["where"] = where
    return spec_from_dict(document)


def write(spark, root, commits) -> None:
    for rows in commits:
        append(spark, root / "orders", [(*r[:5], at(r[5])) for r in rows], ORDERS)


def rows_of(spark, spec, columns) -> Counter:
    return Counter(tuple(r[c] for c in columns) for r in read(spark, spec.output.location))


def live_then_replay(spark, root, name, join, select, columns):
    """The job run live between the commits, then replayed: (what each live run left, the live
    accounting, the replay's rows, the replay's accounting, the replay's spec)."""
    live = job(root, f"{name}_live", join, select)
    runner, written = None, []
    for index, rows in enumerate(COMMITS):
        write(spark, root, [rows])
        if index in LIVE_AFTER:
            runner = runner or LiveRunner(spark, live, str(root / f"checkpoint_{name}"))
            runner.run(900)
            written.append(rows_of(spark, live, columns))
    accounting, _ = live_accounting(spark, live.output.location)
    replayed = job(root, f"{name}_replay", join, select)
    metrics = replay(spark, replayed, at(0), at(3600), RunOptions(mode="exact"))
    return written, accounting, rows_of(spark, replayed, columns), source_counts(metrics), replayed


def buckets(rows_in, joined, emitted=0, dropped=0):
    return {
        "orders": {"rows_in": rows_in, "rejected": 0, "late": 0, "joined": joined, "unmatched_emitted": emitted,
                   "unmatched_dropped": dropped, "open": 0, "unsettled": 0}
    }  # fmt: skip


def test_flink_array_expansion_live_and_replayed(spark, tmp_path):
    """CROSS JOIN UNNEST(tags) AS t (tag): one row per element (a NULL element too), rows with an
    empty or NULL array dropped and counted."""
    join = {"unnest": "tags", "as": "t", "columns": ["tag"], "type": "cross"}
    written, live, replayed, counts, spec = live_then_replay(
        spark, tmp_path, "unnest", join, ["order_id", "t.tag"], ("order_id", "tag")
    )
    expected = Counter({(1, "red"): 1, (1, "big"): 1, (4, "blue"): 1, (4, None): 1})
    assert written == [Counter({(1, "red"): 1, (1, "big"): 1}), expected]
    assert replayed == expected
    assert live == counts == buckets(4, joined=2, dropped=2)
    text = describe(bind(spark, spec))
    assert "1. CROSS JOIN UNNEST(orders.tags) AS t(tag string) [unnest]" in text


def test_unnest_of_structs_and_maps_left(spark, tmp_path):
    """A struct element's fields become columns; a map gives key and value; LEFT keeps a row that
    has none, padded, once."""
    write(spark, tmp_path, COMMITS)
    items = job(
        tmp_path,
        "items",
        {"unnest": "orders.items", "as": "i", "type": "left"},
        ["order_id", "i.sku", "i.qty"],
    )
    metrics = replay(spark, items, at(0), at(3600), RunOptions(mode="exact"))
    assert rows_of(spark, items, ("order_id", "sku", "qty")) == Counter(
        {(1, "a", 2): 1, (1, "b", 1): 1, (2, None, None): 1, (3, None, None): 1, (4, "c", 5): 1}
    )
    assert source_counts(metrics) == buckets(4, joined=2, emitted=2)
    attrs = job(
        tmp_path,
        "attrs",
        {"unnest": "attrs", "as": "a", "columns": ["name", "n"], "type": "left"},
        ["order_id", "a.name", "a.n"],
        where="a.n IS NULL OR a.n > 1",
    )
    replay(spark, attrs, at(0), at(3600), RunOptions(mode="exact"))
    assert rows_of(spark, attrs, ("order_id", "name", "n")) == Counter(
        {(2, None, None): 1, (3, None, None): 1, (4, "y", 2): 1, (4, "z", 3): 1}
    )


@pytest.mark.parametrize("how", ["inner", "left"])
def test_flink_table_function_live_and_replayed(spark, tmp_path, how):
    """LATERAL TABLE(split_words(note)): INNER drops the orders whose call yields nothing (a blank
    and a NULL note); LEFT keeps them, padded."""
    join = {"function": "table_functions:split_words", "args": ["orders.note"], "as": "w", "type": how}
    if how == "left":
        join["on"] = True  # Flink's LEFT JOIN LATERAL TABLE(...) ON TRUE, as YAML reads `on: true`
    written, live, replayed, counts, spec = live_then_replay(
        spark,
        tmp_path,
        f"words_{how}",
        join,
        ["order_id", "w.word", "w.position"],
        ("order_id", "word", "position"),
    )
    words = Counter({(1, "fast", 0): 1, (1, "delivery", 1): 1, (4, "gift", 0): 1})
    pads = Counter({(2, None, None): 1, (3, None, None): 1}) if how == "left" else Counter()
    first = Counter({(1, "fast", 0): 1, (1, "delivery", 1): 1}) + (
        Counter({(2, None, None): 1}) if pads else Counter()
    )
    assert written == [first, words + pads]
    assert replayed == words + pads
    expected = buckets(4, joined=2, emitted=2) if how == "left" else buckets(4, joined=2, dropped=2)
    assert live == counts == expected
    kind = "LEFT JOIN" if how == "left" else "CROSS JOIN"
    assert (
        f"1. {kind} LATERAL TABLE(table_functions:split_words(orders.note)) AS w(word string, position int)"
        in describe(bind(spark, spec))
    )


def test_a_failing_function_names_itself_and_the_arguments(spark, tmp_path):
    append(spark, tmp_path / "orders", [(9, None, None, None, "boom", at(5))], ORDERS)
    spec = job(
        tmp_path, "boom", {"function": "table_functions:shout", "args": ["note"], "as": "s"}, ["s.word"]
    )
    with pytest.raises(
        Exception,
        match=r"table function table_functions:shout failed on arguments \('boom',\): ValueError: no shouting at boom",
    ):
        replay(spark, spec, at(0), at(3600), RunOptions(mode="exact"))


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ({"unnest": "tags", "as": "t", "type": "right"}, "is INNER .* or LEFT"),
        ({"unnest": "tags", "as": "t", "on": "t.element = 'x'"}, "takes no condition .*filter in 'where'"),
        ({"unnest": "tags", "as": "t", "within": "1m"}, "unknown setting"),
        ({"unnest": "tags"}, "give the rows it makes a name with 'as'"),
        ({"unnest": "tags", "function": "m:f", "as": "t"}, "give one of 'unnest' .*, 'function' or 'lookup'"),
        ({"function": "no colon", "as": "t"}, "should name a Spark Python UDTF as module:attribute"),
        ({"unnest": "tags", "as": "orders"}, "names both a source and the rows"),
        ({"unnest": "tags", "as": "t", "columns": ["a", "a"]}, "name a column twice"),
    ],
)
def test_lateral_settings_are_refused_before_any_data_moves(tmp_path, join, message):
    with pytest.raises(JobError, match=message):
        job(tmp_path, "refused", join, ["orders.order_id"])


def test_a_lateral_join_in_a_chain_is_refused(tmp_path):
    with pytest.raises(JobError, match="runs as the job's only join for now; split the job"):
        spec_from_dict(
            {
                "sources": {"orders": {"path": "o", "time": "t"}, "p": {"path": "p", "time": "t"}},
                "name": "chained",
                "from": "orders",
                "joins": [
                    {"unnest": "tags", "as": "t"},
                    {"join": "p", "on": "orders.order_id = p.id", "within": "1m"},
                ],
                "output": {"path": "out"},
            }
        )


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ({"unnest": "note", "as": "t"}, "unnest 'note' is a string; UNNEST expands an array or a map"),
        ({"unnest": "nope", "as": "t"}, "does not resolve"),
        (
            {"unnest": "tags", "as": "t", "columns": ["a", "b"]},
            r"columns names 2 column\(s\) but the rows made have 1 \(element string\)",
        ),
        ({"function": "no_such_module:f", "as": "t"}, "cannot import module 'no_such_module'"),
        ({"function": "table_functions:nothing", "as": "t"}, "has no 'nothing'"),
        (
            {"function": "table_functions:not_a_udtf", "as": "t"},
            "is a type, not a Spark Python table function; decorate",
        ),
        ({"function": "table_functions:with_terminate", "as": "t", "args": ["note"]}, "has terminate"),
        (
            {"function": "table_functions:split_words", "as": "t", "args": ["orders.nope"]},
            "arguments .* do not resolve|does not resolve",
        ),
    ],
)
def test_lateral_joins_are_checked_against_the_columns(spark, tmp_path, join, message):
    write(spark, tmp_path, COMMITS[:1])
    with pytest.raises(JobError, match=message):
        bind(spark, job(tmp_path, "refused", join, ["orders.order_id"]))
