"""Each join family is a plug-in (streamjoin/family.py): its module registers itself, and a job
using it, written in YAML or in SQL, compiles to its link through the registry alone. No Spark."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from streamjoin import family
from streamjoin.catalog import MemoryCatalog
from streamjoin.errors import JobError
from streamjoin.joins.temporal import StreamTableLink
from streamjoin.plan import as_json, bind, describe
from streamjoin.session import PROJECT_ROOT
from streamjoin.spec import spec_from_dict
from streamjoin.sql import spec_from_sql

STREAMS_YAML: dict[str, Any] = {
    "name": "joined",
    "sources": {"a": {"path": "a", "time": "t"}, "b": {"path": "b", "time": "t"}},
    "from": "a",
    "output": {"path": "out"},
}
STREAMS_SQL = "CREATE STREAM a WITH (path='a', time='t');\nCREATE STREAM b WITH (path='b', time='t');\n"
OUTPUT_SQL = "CREATE STREAM joined WITH (path='out') AS\n"
# A family joining two tables joins these instead.
TABLES_YAML: dict[str, Any] = {
    **STREAMS_YAML,
    "sources": {
        "a": {"path": "a", "kind": "table", "key": ["id"]},
        "b": {"path": "b", "kind": "table", "key": ["id"]},
    },
}
TABLES_SQL = "CREATE TABLE a WITH (path='a', key='id');\nCREATE TABLE b WITH (path='b', key='id');\n"
TABLES = ("table-table",)

# A lateral family's item (rows made for each row: no `join`) joins the first stream alone.
STREAM_YAML: dict[str, Any] = {**STREAMS_YAML, "sources": {"a": {"path": "a", "time": "t"}}}
STREAM_SQL = "CREATE STREAM a WITH (path='a', time='t');\n"
URL = "jdbc:postgresql://127.0.0.1:5432/shop"
# An enrichment family's item joins the stream with a table.
TABLE_YAML: dict[str, Any] = {
    **STREAMS_YAML,
    "sources": {**STREAMS_YAML["sources"], "b": {"path": "b", "kind": "table", "key": ["id"], "time": "t"}},
}
TABLE_SQL = (
    "CREATE STREAM a WITH (path='a', time='t');\nCREATE TABLE b WITH (path='b', key='id', time='t');\n"
)

# Per registered family: a join item of a YAML job over STREAMS_YAML's sources (TABLES_YAML's for
# the families in TABLES, STREAM_YAML's for a lateral item, TABLE_YAML's for an enrichment of the
# stream), the same join in SQL (after the
# statements it needs, each ending in ";\n"), and the link settings both compile to. A new family
# adds its example here.
EXAMPLES: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "interval": (
        {"join": "b", "on": "a.id = b.id", "between": ["-4h", "0s"], "type": "left"},
        "SELECT * FROM a LEFT JOIN b ON a.id = b.id AND a.t BETWEEN b.t AND b.t + INTERVAL '4' HOUR",
        {"kind": "interval", "type": "left", "on": "a.id = b.id", "bounds": {"lower": "-4h", "upper": "0s"}},
    ),
    "rows": (
        {"join": "b", "on": "a.id = b.id", "rows": {"b": 6}},
        "SELECT * FROM a JOIN b OVER (ROWS BETWEEN 5 PRECEDING AND CURRENT ROW) ON a.id = b.id",
        {"kind": "rows", "source": "b", "type": "inner", "on": "a.id = b.id", "rows": [["b", 6]]},
    ),
    "table-table": (
        {"join": "b", "on": "a.id = b.id", "type": "left"},
        "SELECT * FROM a LEFT JOIN b ON a.id = b.id",
        {"kind": "table-table", "source": "b", "type": "left", "on": "a.id = b.id"},
    ),
    "window": (
        {"join": "b", "on": "a.id = b.id", "window": {"hop": "1m", "size": "5m"}},
        "SELECT * FROM HOP(a, t, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE)"
        " JOIN HOP(b, t, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE) ON a.id = b.id",
        {"kind": "window", "source": "b", "on": "a.id = b.id", "window": {"hop": "1m", "size": "5m"}},
    ),
    "unnest": (
        {"unnest": "a.tags", "as": "t", "columns": ["tag"]},
        "SELECT * FROM a CROSS JOIN UNNEST(a.tags) AS t (tag)",
        {"kind": "unnest", "source": "t", "type": "inner", "unnest": "a.tags", "columns": ["tag"]},
    ),
    "function": (
        {"function": "words:split", "args": ["a.note"], "as": "w", "type": "left"},
        "CREATE TEMPORARY FUNCTION tokens AS 'words.split' LANGUAGE PYTHON;\n"
        "SELECT * FROM a LEFT JOIN LATERAL TABLE(tokens(a.note)) AS w ON TRUE",
        {"kind": "function", "source": "w", "type": "left", "function": "words:split", "args": ["a.note"]},
    ),
    "stream-table": (
        {"join": "b", "on": "a.id = b.id", "type": "left", "as_of": "arrival"},
        "SELECT * FROM a LEFT JOIN b FOR SYSTEM_TIME AS OF PROCTIME() ON a.id = b.id",
        {"kind": "stream-table", "source": "b", "type": "left", "on": "a.id = b.id", "as_of": "arrival"},
    ),
    "temporal": (
        {"join": "b", "on": "a.id = b.id", "as_of": "event_time"},
        "SELECT * FROM a JOIN b FOR SYSTEM_TIME AS OF a.t ON a.id = b.id",
        {"kind": "temporal", "source": "b", "type": "inner", "on": "a.id = b.id", "as_of": "event_time"},
    ),
    "asof": (
        {"join": "b", "on": "a.id = b.id AND b.t <= a.t", "asof": True},
        "SELECT * FROM a ASOF JOIN b ON a.id = b.id AND b.t <= a.t",
        {"kind": "asof", "source": "b", "type": "inner", "on": "a.id = b.id AND b.t <= a.t"},
    ),
    "lookup": (
        {"lookup": {"url": URL, "table": "customers"}, "as": "c", "on": "a.customer = c.id", "type": "left"},
        f"CREATE TABLE customers (id INT) WITH ('connector' = 'jdbc', 'url' = '{URL}', 'table-name' = "
        "'customers');\nSELECT * FROM a LEFT JOIN customers FOR SYSTEM_TIME AS OF a.t AS c ON a.customer = c.id",
        {
            "kind": "lookup",
            "source": "c",
            "type": "left",
            "on": "a.customer = c.id",
            "lookup": {"table": "customers", "url": URL},
        },
    ),
}


def test_every_module_of_the_joins_package_that_registers_a_family_is_found_and_has_an_example():
    """Discovery imports the joins package's modules: the moved families are registered, each
    under its own kinds, with its operator, and each has a YAML and SQL example below."""
    found = {plugin.name: plugin for plugin in family.families()}
    assert set(EXAMPLES) <= set(found)
    assert set(found) <= set(EXAMPLES), "a registered family needs an example in EXAMPLES"
    for plugin in found.values():
        assert plugin.kinds and all(family.of(kind) is plugin for kind in plugin.kinds)
        builders = [family.operator(kind) for kind in plugin.kinds]  # its step module, imported now
        assert all(b.__self__.__module__.endswith(".step") for b in builders), plugin.operator


def test_job_files_are_read_checked_and_compiled_without_spark():
    """A family's package declares it without Spark (its step module runs it): every job file of
    the repository, YAML and SQL, loads in a process that never imports pyspark or py4j, as an
    Airflow DAG file does at every parse."""
    probe = (
        "import sys; from streamjoin.jobfile import job_files, load_job; from streamjoin import family\n"
        "jobs = [load_job(f).name for f in job_files('jobs')]\n"
        "print(len(jobs), len(family.families()), sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'py4j'}))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    jobs, families, heavy = ran.stdout.split(maxsplit=2)
    assert int(jobs) >= 4 and int(families) == len(EXAMPLES) and heavy.strip() == "[]"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_familys_yaml_and_sql_compile_to_its_link(name):
    item, query, settings = EXAMPLES[name]
    plugin = family.of(settings["kind"])
    assert plugin is not None and plugin.name == name
    lateral, enriching = "join" not in item, name in ("stream-table", "temporal", "asof")
    yaml, sql = (TABLES_YAML, TABLES_SQL) if name in TABLES else (STREAMS_YAML, STREAMS_SQL)
    yaml, sql = (
        (STREAM_YAML, STREAM_SQL) if lateral else (TABLE_YAML, TABLE_SQL) if enriching else (yaml, sql)
    )
    (from_yaml,) = spec_from_dict({**yaml, "joins": [item]}).joins
    statements, _, select = query.rpartition(";\n")
    sources = sql + (statements + ";\n" if statements else "")
    (from_sql,) = spec_from_sql(sources + OUTPUT_SQL + select + ";").joins
    assert type(from_yaml) in plugin.links
    assert from_yaml == from_sql
    assert {k: v for k, v in from_yaml.settings().items() if k in settings} == settings


def test_a_familys_keys_are_the_ones_a_job_may_give_and_unknown_keys_name_them():
    """A YAML join item may give every registered family's keys; an unknown key is refused with
    the list of allowed ones, which holds them."""
    with pytest.raises(JobError, match="unknown setting.*'roows'") as refused:
        spec_from_dict({**STREAMS_YAML, "joins": [{"join": "b", "on": "a.id = b.id", "roows": 1}]})
    for key in family.join_keys():
        assert key in str(refused.value)


def test_the_enrichment_families_words_are_theirs_through_the_registry():
    """`as_of`, `asof`, ASOF JOIN and FOR SYSTEM_TIME AS OF are the enrichment families' own
    (joins/temporal/): the registry lists their keys and JOIN method, a link of another family
    given `as_of` refuses it in their words, and a link no family claims is theirs (stream-table,
    the last claim)."""
    assert {"as_of", "asof"} <= set(family.join_keys()) and "ASOF" in family.sql_methods()
    assert (
        family.refused_elsewhere("as_of")
        == "'as_of' and 'asof' apply to stream-table joins only; remove them"
    )
    window = {"join": "b", "on": "a.id = b.id", "window": {"tumble": "5m"}, "as_of": "arrival"}
    with pytest.raises(JobError, match=r"join with 'b': 'as_of' and 'asof' apply to stream-table joins only"):
        spec_from_dict({**STREAMS_YAML, "joins": [window]})
    last = family.claims()[-1]
    assert family.of("stream-table") is not None and last in family.of("stream-table").claims
    assert last.test({}, None, None) is StreamTableLink


SCHEMA = StructType([StructField("id", StringType()), StructField("t", TimestampType())])
CATALOG = MemoryCatalog({"a": SCHEMA, "b": SCHEMA})
BOUND_HERE = ("interval", "rows", "table-table", "window")  # sources with SCHEMA's columns suffice


@pytest.mark.parametrize("name", BOUND_HERE)
def test_a_familys_link_binds_and_explains_through_the_registry(name):
    """plan.py binds the link generically and calls its family's binding; `explain` prints what
    the family says of it under its header, and its JSON carries the family's keys."""
    item, _, settings = EXAMPLES[name]
    yaml = TABLES_YAML if name in TABLES else STREAMS_YAML
    plan = bind(CATALOG, spec_from_dict({**yaml, "joins": [item]}))
    (join,) = plan.joins
    plugin = family.of(join.family)
    assert plugin is not None and join.family == settings["kind"] and join.equi == (("a.id", "b.id"),)
    text = describe(plan)
    assert f"1. {join.spec.type.upper()} JOIN b [{join.family}] ON a.id = b.id" in text
    assert plugin.explain is not None and all(line in text for line in plugin.explain(plan, join, 1))
    (described,) = as_json(plan)["joins"]
    assert set(family.json_keys()) <= set(described)


@pytest.mark.parametrize(
    "name, judged",
    [("interval", ("a", "b")), ("window", ("a", "b")), ("temporal", ("b",)), ("asof", ()), ("rows", ())],
)
def test_a_familys_grace_judges_the_sources_it_names(name, judged):
    """The grace warning checks the sources a link's family says its grace judges late: both
    sides of an interval or window join, a temporal link's table (its stream's rows never are
    late), none for the others."""
    item, _, _ = EXAMPLES[name]
    yaml = TABLE_YAML if name in ("temporal", "asof") else STREAMS_YAML
    (join,) = bind(CATALOG, spec_from_dict({**yaml, "joins": [item]})).joins
    plugin = family.of(join.family)
    assert plugin is not None and (plugin.graced(join) if plugin.graced else ()) == judged


def test_a_table_table_result_reserves_its_change_columns_and_explains_its_key():
    item = {"join": "b", "on": "a.id = b.id"}
    reserved = spec_from_dict({**TABLES_YAML, "joins": [item], "select": ["a.id AS op", "b.t"]})
    with pytest.raises(JobError, match=r"output column\(s\) op are reserved in a table-table join's result"):
        bind(CATALOG, reserved)
    text = describe(bind(CATALOG, spec_from_dict({**TABLES_YAML, "joins": [item]})))
    assert (
        "primary-key (1:1): result keyed by a's key (id); every input commit updates the rows it touches"
        in text
    )


def test_a_rows_window_naming_no_side_of_its_join_is_refused_by_its_binding():
    item = {"join": "b", "on": "a.id = b.id", "rows": {"c": 2}}
    with pytest.raises(JobError, match=r"rows names 'c', which is not a side of this join \(a, b\)"):
        bind(CATALOG, spec_from_dict({**STREAMS_YAML, "joins": [item]}))
