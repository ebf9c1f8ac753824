"""Job validation: every error is raised before data moves and says what to change."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from conftest import append, at
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from streamjoin.catalog import MemoryCatalog
from streamjoin.errors import JobError
from streamjoin.jobfile import load_job
from streamjoin.joins.interval import IntervalLink
from streamjoin.joins.rows import RowsLink
from streamjoin.joins.table_table import TableTableLink
from streamjoin.joins.temporal import AsofLink, StreamTableLink, TemporalLink
from streamjoin.joins.window import WindowLink
from streamjoin.plan import bind, describe, split_conjuncts
from streamjoin.runners.options import RunOptions
from streamjoin.spec import spec_from_dict
from streamjoin.timeutil import parse_duration, parse_instant

EVENTS = StructType(
    [StructField("id", StringType()), StructField("amount", LongType()), StructField("ts", TimestampType())]
)
TEXT_TIME = StructType([StructField("id", StringType()), StructField("ts", StringType())])
NUMERIC_TIME = StructType([StructField("id", StringType()), StructField("ts", LongType())])

BASE_JOB = {
    "name": "j",
    "sources": {
        "a": {"path": "a", "kind": "stream", "time": "ts"},
        "b": {"path": "b", "kind": "stream", "time": "ts"},
    },
    "from": "a",
    "joins": [{"join": "b", "type": "left", "on": "a.id = b.id", "within": "1h"}],
    "output": {"path": "out"},
}
# The sources' tables as schemas alone, by path: binding against them needs no Spark.
CATALOG = MemoryCatalog({"a": EVENTS, "b": EVENTS, "text": TEXT_TIME, "numeric": NUMERIC_TIME})


def job(**changes):
    document = copy.deepcopy(BASE_JOB)
    for path, value in changes.items():
        target = document
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is None:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
    return spec_from_dict(document)


def test_a_valid_job_builds():
    spec = job()
    assert spec.names == ("a", "b")
    assert spec.joins[0].bounds.lower == -timedelta(hours=1)
    assert spec.joins[0].grace == timedelta(hours=24)  # ksqlDB's default
    assert spec.sources[0].max_future == timedelta(days=1)  # docs/job-spec.md


def test_max_future_is_a_duration_or_none():
    assert job(sources__a__max_future="6h").sources[0].max_future == timedelta(hours=6)
    assert job(sources__a__max_future="none").sources[0].max_future is None


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"from": "nope"}, "names source 'nope', which is not declared"),
        ({"joins__0__join": "c"}, "names source 'c', which is not declared"),
        ({"joins__0__within": None}, "a stream-stream join needs time bounds"),
        ({"joins__0__grace": "-5s"}, "grace -5s is negative"),
        (
            {"joins__0__within": None, "joins__0__between": ["2h", "1h"]},
            "lower bound 2h is above its upper bound 1h",
        ),
        ({"joins__0__type": "sideways"}, "type 'sideways' is unknown"),
        ({"joins__0__on": None}, "give exactly one condition"),
        ({"joins__0__emit": "soon"}, "emit is 'soon'"),
        (
            {"joins__0__within": None, "joins__0__asof": True, "joins__0__on": "a.id = b.id AND b.t <= a.t"},
            "ASOF between two streams is not supported yet (RisingWave's ASOF JOIN of two append-only",
        ),
        ({"sources__b__time": None}, "a stream needs 'time'"),
        ({"sources__b__kind": "river"}, "kind is 'river'"),
        ({"sources__b__max_future": "-1h"}, "max_future -1h is negative; write 0s or more, or none"),
        ({"sources__b__max_future": "soon"}, "max_future 'soon' is not a duration"),
        ({"sources__b__path": None}, "give exactly one of 'path'"),
        ({"joins__0__window": "1h"}, "window '1h' is not a mapping; write window: {tumble: 10m}"),
        ({"joins__0__window": {"tumble": "1h"}}, "give either 'window' (rows in the same time window)"),
        ({"joins__0__within": "soon"}, "is not a duration"),
        ({"joins__0__type": "cross"}, "a CROSS join pairs every row with every row"),
        (
            {"joins__0__type": "cross", "joins__0__on": None, "joins__0__within": None},
            "a CROSS join of two streams needs time bounds",
        ),
    ],
)
def test_structural_errors_name_the_problem(changes, message):
    with pytest.raises(JobError) as error:
        job(**changes)
    assert message in str(error.value)


def test_stream_table_full_outer_is_refused_with_the_seeds_reason():
    with pytest.raises(JobError) as error:
        job(
            sources__b={"path": "b", "kind": "table", "key": ["id"]},
            joins__0__within=None,
            joins__0__type="full",
        )
    text = str(error.value)
    assert "FULL join of a stream with a table is refused" in text
    assert "table updates never trigger output" in text
    assert "Supported: inner, left" in text


def test_a_cross_join_takes_no_condition_and_pairs_streams_only():
    spec = job(joins__0__type="CROSS JOIN", joins__0__on=None)
    assert spec.joins[0].type == "cross"
    assert "CROSS JOIN b [interval] (every pair in the time bounds)" in describe(bind(CATALOG, spec))
    with pytest.raises(
        JobError, match="CROSS join of a stream with a table is refused: a CROSS join pairs rows"
    ):
        job(
            sources__b={"path": "b", "kind": "table", "key": ["id"]},
            joins__0__within=None,
            joins__0__type="cross",
            joins__0__on=None,
        )


def test_table_first_and_bounds_on_non_stream_joins_are_refused():
    with pytest.raises(JobError, match="put the stream first"):
        job(sources__a={"path": "a", "kind": "table", "key": ["id"]}, joins__0__within=None)
    with pytest.raises(JobError, match="apply to stream-stream joins only"):
        job(sources__b={"path": "b", "kind": "table", "key": ["id"]})


TABLE_B = {"path": "b", "kind": "table", "key": ["id"], "time": "ts"}


@pytest.mark.parametrize(
    ("changes", "kind", "family"),
    [
        ({}, IntervalLink, "interval"),
        ({"joins__0__type": "cross", "joins__0__on": None}, IntervalLink, "interval"),
        ({"joins__0__within": None, "joins__0__window": {"tumble": "1h"}}, WindowLink, "window"),
        ({"joins__0__within": None, "joins__0__rows": {"b": 3}}, RowsLink, "rows"),
        ({"sources__b": TABLE_B, "joins__0__within": None}, StreamTableLink, "stream-table"),
        (
            {"sources__b": TABLE_B, "joins__0__within": None, "joins__0__as_of": "arrival"},
            StreamTableLink,
            "stream-table",
        ),
        (
            {"sources__b": TABLE_B, "joins__0__within": None, "joins__0__as_of": "event_time"},
            TemporalLink,
            "temporal",
        ),
        (
            {
                "sources__b": TABLE_B,
                "joins__0__within": None,
                "joins__0__asof": True,
                "joins__0__on": "a.id = b.id AND b.ts <= a.ts",
            },
            AsofLink,
            "asof",
        ),
        (
            {"sources__a": {**TABLE_B, "path": "a"}, "sources__b": TABLE_B, "joins__0__within": None},
            TableTableLink,
            "table-table",
        ),
    ],
)
def test_each_link_is_typed_by_its_settings_and_the_kinds_it_joins(changes, kind, family):
    """The job's sources declare stream or table, so the kind of each link follows from the job;
    the link holds its kind's settings only, and its kind is the plan's family."""
    (link,) = job(**changes).joins
    assert type(link) is kind and link.kind == family
    held = {"bounds", "window", "rows", "as_of", "emit"} & set(link.settings())
    assert held <= {
        IntervalLink: {"bounds", "emit"},
        WindowLink: {"window"},
        RowsLink: {"rows"},
    }.get(kind, {"as_of"})


def test_a_setting_another_kind_of_link_takes_is_refused_in_the_words_written():
    """A window with within, rows with a grace, eager emission of a window: each is refused naming
    the setting; a link a job builds in Python cannot hold them at all."""
    with pytest.raises(JobError, match="give either 'window' .* not both"):
        job(joins__0__window={"tumble": "1h"})
    with pytest.raises(JobError, match="a ROWS window judges no row late"):
        job(joins__0__within=None, joins__0__rows={"b": 3}, joins__0__grace="5s")
    with pytest.raises(TypeError):
        StreamTableLink("b", on="a.id = b.id", bounds=None)


def test_yaml_job_file_with_on_key_and_relative_paths(tmp_path):
    file = tmp_path / "j.yaml"
    file.write_text(
        "sources:\n  a: {path: x/a, time: ts}\n  b: {path: x/b, time: ts}\nfrom: a\n"
        "joins:\n  - join: b\n    on: a.id = b.id\n    between: [-4h, 0s]\n    grace: 5s\noutput: {path: out}\n"
    )
    spec = load_job(file, root=tmp_path)
    assert spec.name == "j"  # from the file name
    assert spec.joins[0].on == "a.id = b.id"  # YAML 1.1 reads the key `on` as true
    assert spec.source("a").path == str(tmp_path / "x" / "a")
    assert (spec.joins[0].bounds.lower, spec.joins[0].bounds.upper) == (-timedelta(hours=4), timedelta(0))


def test_durations_and_instants():
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("15 SECONDS") == timedelta(seconds=15)
    assert parse_duration("PT2H") == timedelta(hours=2)
    assert parse_duration("-4h") == -timedelta(hours=4)
    assert parse_instant("2024-05-01").isoformat() == "2024-05-01T00:00:00+00:00"
    assert parse_instant("2024-05-01T02:00+02:00").isoformat() == "2024-05-01T00:00:00+00:00"
    with pytest.raises(JobError, match="not an ISO date"):
        parse_instant("yesterday-ish")
    for without_a_date in ("12:00", "P1D"):  # a time of day is not taken as today's, nor a duration
        with pytest.raises(JobError, match="is not a date or datetime, e.g. 2024-05-01"):
            parse_instant(without_a_date)


def test_conjuncts_split_at_top_level_only():
    """Parsed, not cut at every AND: parentheses around a conjunction open, BETWEEN ... AND and
    CASE WHEN ... AND stay whole, an AND inside a string is text."""
    assert split_conjuncts("a.id = b.id AND (b.x > 1 AND b.y < 2) and b.s = 'AND'") == [
        "a.id = b.id",
        "b.x > 1",
        "b.y < 2",
        "b.s = 'AND'",
    ]
    assert split_conjuncts("a.id == b.id AND b.x BETWEEN 1 AND 5") == ["a.id = b.id", "b.x BETWEEN 1 AND 5"]
    assert split_conjuncts("a.id = b.id AND CASE WHEN a.x > 0 AND b.x > 0 THEN true ELSE false END") == [
        "a.id = b.id",
        "CASE WHEN a.x > 0 AND b.x > 0 THEN TRUE ELSE FALSE END",
    ]


def test_a_condition_that_does_not_parse_says_where():
    with pytest.raises(JobError) as error:
        bind(CATALOG, job(joins__0__on="a.id = b.id AND"))
    assert str(error.value).startswith(
        "job 'j', join with 'b': the condition 'a.id = b.id AND' does not parse as a SQL condition at line 1, "
        "column 15 (near 'AND'): write it as Spark SQL"
    )


# ------------------------------------------------------------------ schema-level checks (real Delta)


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("spec_tables")
    append(spark, root / "a", [("k", 1, at(0))], EVENTS)
    append(spark, root / "b", [("k", 2, at(1))], EVENTS)
    append(spark, root / "text", [("k", "2024-01-01 00:00:05")], TEXT_TIME)
    append(spark, root / "numeric", [("k", 5)], NUMERIC_TIME)
    return root


def bound(tables, **changes):
    return job(**changes).with_root(tables)


def test_unknown_column_in_condition(spark, tables, capfd):
    """The message names the join and the column, and nothing else is printed first (PySpark logs
    each analysis error as a page of JSON and Java frames unless told not to)."""
    with pytest.raises(JobError) as error:
        bind(spark, bound(tables, joins__0__on="a.id = b.idd"))
    assert "condition of the join with 'b'" in str(error.value)
    assert "idd" in str(error.value)
    printed = capfd.readouterr()
    assert "idd" not in printed.err + printed.out


def test_unknown_column_in_select_and_ambiguous_names():
    with pytest.raises(JobError, match="select list does not resolve"):
        bind(CATALOG, job(select=["a.nope"]))
    with pytest.raises(JobError, match="select list names id more than once"):
        bind(CATALOG, job(select=["a.id", "b.id"]))


def test_a_source_star_selects_its_own_columns(spark, tables, tmp_path):
    """`a.*` writes a's columns as they are named in its table, never streamjoin's own columns."""
    from streamjoin.runners.replay import replay

    spec = bound(tables, select=["a.*", "b.amount AS paid"], output__path=str(tmp_path / "out"))
    assert list(bind(spark, spec).output_columns) == ["id", "amount", "ts", "paid"]
    replay(spark, spec, at(-60), at(3600), RunOptions(closed=True))
    written = spark.read.format("delta").load(str(tmp_path / "out"))
    assert written.columns == ["id", "amount", "ts", "paid", "event_time"]
    assert [tuple(r) for r in written.select("id", "amount", "paid").collect()] == [("k", 1, 2)]


def test_non_equi_condition_is_refused():
    with pytest.raises(JobError) as error:
        bind(CATALOG, job(joins__0__on="a.amount < b.amount"))
    assert "has no equality between a column of a and a column of b" in str(error.value)


def test_time_column_of_the_wrong_type():
    with pytest.raises(JobError) as error:
        bind(CATALOG, job(sources__b={"path": "numeric", "time": "ts"}))
    assert "has type bigint, not a timestamp" in str(error.value)
    with pytest.raises(JobError, match="add time_format"):
        bind(CATALOG, job(sources__b={"path": "text", "time": "ts"}))
    plan = bind(CATALOG, job(sources__b={"path": "text", "time": "ts", "time_format": "yyyy-MM-dd HH:mm:ss"}))
    assert plan.source("b").keys == ("id",)


def test_missing_source_table(spark, tables):
    with pytest.raises(JobError, match="is not a Delta table"):
        bind(spark, bound(tables, sources__b={"path": "missing", "time": "ts"}))


def test_reserved_output_time_and_residual_split():
    with pytest.raises(JobError, match="reserved for the output event time"):
        bind(CATALOG, job(select=["a.id AS event_time"]))
    plan = bind(CATALOG, job(joins__0__on="a.id = b.id AND b.amount > a.amount"))
    assert plan.joins[0].equi == (("a.id", "b.id"),)
    assert plan.joins[0].residual == "(b.amount > a.amount)"
    assert plan.output_columns == ("a_id", "a_amount", "a_ts", "b_id", "b_amount", "b_ts")


def test_runners_refuse_what_they_cannot_run_before_data_moves(spark, tables, tmp_path):
    from streamjoin.errors import UnsupportedJobError
    from streamjoin.kernel import family
    from streamjoin.runners.replay import replay

    both_tables = bound(
        tables,
        sources__a={"path": "a", "kind": "table", "key": ["id"]},
        sources__b={"path": "b", "kind": "table", "key": ["id"]},
        joins__0__within=None,
        joins__0__on="a.amount = b.amount",
    )
    with pytest.raises(UnsupportedJobError, match="many-to-many join"):
        family(bind(spark, both_tables))
    three = copy.deepcopy(BASE_JOB)
    three["sources"]["c"] = {"path": "a", "kind": "stream", "time": "ts"}
    three["joins"].append({"join": "c", "type": "cross", "within": "1h"})
    chain = spec_from_dict(three).with_root(tables)
    with pytest.raises(
        UnsupportedJobError, match=r"join 2 \(CROSS JOIN c, family interval\) cannot follow the interval"
    ):
        replay(spark, chain, at(0), at(60))
    assert not (tables / "out").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("residual", "joined"),
    [
        ("b.amount BETWEEN 1 AND 2", True),
        ("b.amount BETWEEN 3 AND 4", False),
        ("CASE WHEN a.amount = 1 AND b.amount = 2 THEN true ELSE false END", True),
        ("CASE WHEN a.amount = 1 AND b.amount = 3 THEN true ELSE false END", False),
    ],
)
def test_a_residual_with_and_inside_runs_as_written(spark, tables, tmp_path, residual, joined):
    """a's row (amount 1) and b's (amount 2) share their id and lie a second apart: the residual
    alone decides whether they join (LEFT: a padded a row otherwise)."""
    from streamjoin.runners.replay import replay

    spec = bound(tables, joins__0__on=f"a.id = b.id AND {residual}", output__path=str(tmp_path / "out"))
    plan = bind(spark, spec)
    assert plan.joins[0].equi == (("a.id", "b.id"),) and plan.joins[0].residual == f"({residual})".replace(
        "true", "TRUE"
    ).replace("false", "FALSE")
    replay(spark, spec, at(-60), at(3600), RunOptions(closed=True))
    rows = spark.read.format("delta").load(str(tmp_path / "out")).collect()
    assert [(r.a_amount, r.b_amount) for r in rows] == [(1, 2) if joined else (1, None)]


@pytest.mark.parametrize("name", ["net;gross", "paid amount", "a=b", "f(x)", "tab\there"])
def test_output_column_names_delta_refuses_are_refused_before_data_moves(name):
    """Delta refuses ' ,;{}()\\n\\t=' in a column name (without column mapping) when the first
    rows are written; the job is refused when it is validated instead."""
    with pytest.raises(JobError) as error:
        bind(CATALOG, job(select=["a.id", f"a.amount AS `{name}`"]))
    message = str(error.value)
    assert message.startswith(f"job 'j': output column {name!r} holds ")
    assert "which Delta refuses in a column name" in message and "give that select item an alias" in message


@pytest.mark.parametrize(
    "changes, place, function",
    [
        (
            {"select": ["a.id", "java_method('java.lang.System', 'getProperty', 'user.home') AS home"]},
            "select",
            "java_method",
        ),
        ({"select": ["JAVA_METHOD('java.lang.Math', 'abs', a.amount) AS m"]}, "select", "JAVA_METHOD"),
        ({"select": ["`reflect`('java.lang.Math', 'abs', a.amount) AS m"]}, "select", "reflect"),
        (
            {"select": ["IDENTIFIER('java_' || 'method')('java.lang.Math', 'abs', a.amount)"]},
            "select",
            "reflect",
        ),
        (
            {"joins__0__on": "a.id = b.id AND reflect('java.lang.Math', 'abs', a.amount) = '1'"},
            "join with 'b', on",
            "reflect",
        ),
        ({"where": "try_reflect('java.lang.Thread', 'sleep', a.amount) IS NULL"}, "where", "try_reflect"),
    ],
)
def test_expressions_that_call_java_are_refused_wherever_they_stand(spark, tables, changes, place, function):
    """reflect, java_method and try_reflect run any static Java method: refused however spelt,
    found in Spark's analysed expressions (an alias, a case, quotes or IDENTIFIER() change
    nothing)."""
    with pytest.raises(JobError) as error:
        bind(spark, bound(tables, **changes))
    message = str(error.value)
    assert message.startswith(f"job 'j', {place}: ")
    assert f"calls {function}, which runs any Java method it is given" in message


def test_an_unnest_that_calls_java_is_refused():
    document = {
        "name": "j",
        "sources": {"a": {"path": "a", "kind": "stream", "time": "ts"}},
        "from": "a",
        "joins": [{"unnest": "array(java_method('java.util.UUID', 'randomUUID'))", "as": "m"}],
        "output": {"path": "out"},
    }
    with pytest.raises(JobError, match=r"^job 'j', join with 'm': .* calls java_method, which runs any Java"):
        bind(CATALOG, spec_from_dict(document))


def test_expressions_nested_to_the_limit_bind(spark, tables):
    """The nesting limit lies well below where the parsers give out, on the whole bind path."""
    deep = 20  # streamjoin.limits.MAX_NESTING
    plan = bind(
        spark,
        bound(
            tables,
            joins__0__on="(" * deep + "a.id = b.id" + ")" * deep,
            select=["abs(" * deep + "a.amount" + ")" * deep + " AS amount"],
        ),
    )
    assert plan.output_columns == ("amount",) and plan.joins[0].equi == (("a.id", "b.id"),)
