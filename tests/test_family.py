"""Each join family is a plug-in (streamjoin/family.py): its module registers itself, and a job
using it, written in YAML or in SQL, compiles to its link through the registry alone. No Spark."""

from __future__ import annotations

from typing import Any

import pytest

from streamjoin import family
from streamjoin.errors import JobError
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

# Per registered family: a join item of a YAML job over STREAMS_YAML's sources, the same join in
# SQL, and the link settings both compile to. A new family adds its example here.
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
    "window": (
        {"join": "b", "on": "a.id = b.id", "window": {"hop": "1m", "size": "5m"}},
        "SELECT * FROM HOP(a, t, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE)"
        " JOIN HOP(b, t, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE) ON a.id = b.id",
        {"kind": "window", "source": "b", "on": "a.id = b.id", "window": {"hop": "1m", "size": "5m"}},
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
        assert all(family.operator(kind) is plugin.operator for kind in plugin.kinds)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_familys_yaml_and_sql_compile_to_its_link(name):
    item, query, settings = EXAMPLES[name]
    plugin = family.of(settings["kind"])
    assert plugin is not None and plugin.name == name
    (from_yaml,) = spec_from_dict({**STREAMS_YAML, "joins": [item]}).joins
    (from_sql,) = spec_from_sql(STREAMS_SQL + OUTPUT_SQL + query + ";").joins
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
