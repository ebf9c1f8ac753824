"""The definition's hash (streamjoin/definition.py): the same for jobs that decide the same rows,
different when a setting that decides rows changes. Pure: no Spark session."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.definition import definition_hash
from streamjoin.errors import DefinitionChangedError
from streamjoin.spec import spec_from_dict
from streamjoin.sql import spec_from_sql

STREAMS = {"a": {"path": "a", "time": "ts"}, "b": {"path": "b", "time": "ts"}}
TABLE_B = {"a": {"path": "a", "time": "ts"}, "b": {"path": "b", "kind": "table", "key": ["id"], "time": "ts"}}
TABLES = {
    "a": {"path": "a", "kind": "table", "key": ["id"]},
    "b": {"path": "b", "kind": "table", "key": ["id"]},
}
ON = {"on": "a.id = b.id"}
# One job per kind of link: its sources and its one link.
KINDS = {
    "interval": (STREAMS, {"join": "b", "type": "left", **ON, "within": "1h", "grace": "5m"}),
    "cross": (STREAMS, {"join": "b", "type": "cross", "between": ["-1m", "0s"]}),
    "window": (STREAMS, {"join": "b", **ON, "window": {"hop": "5m", "size": "10m"}, "grace": "1m"}),
    "rows": (STREAMS, {"join": "b", **ON, "rows": {"b": 3}}),
    "stream-table": (TABLE_B, {"join": "b", "type": "left", **ON}),
    "temporal": (TABLE_B, {"join": "b", **ON, "as_of": "event_time", "grace": "10m"}),
    "asof": (TABLE_B, {"join": "b", "on": "a.id = b.id AND b.ts <= a.ts", "asof": True}),
    "table-table": (TABLES, {"join": "b", "type": "full", **ON}),
    "unnest": ({"a": STREAMS["a"]}, {"unnest": "a.tags", "as": "t", "columns": ["tag"]}),
    "lookup": (
        {"a": STREAMS["a"]},
        {
            "lookup": {"url": "jdbc:postgresql://db:5432/shop?ssl=true", "table": "customers"},
            "as": "c",
            "on": "a.id = c.id",
        },
    ),
}
# Changes of what a job file says beside its rows: none may move the hash.
META = {
    "description": st.text(max_size=20),
    "schedule": st.fixed_dictionaries(
        {
            "every": st.sampled_from(["1h", "1d", "15m"]),
            "timezone": st.sampled_from(["UTC", "Europe/Berlin"]),
        },
        optional={"live_every": st.sampled_from(["5m", "1h"]), "start": st.just("2024-05-01")},
    ),
    "quality": st.fixed_dictionaries(
        {},
        optional={
            "not_null": st.lists(st.sampled_from(["aid", "bid"]), unique=True),
            "link_history": st.integers(0, 30),
            "link_tolerance": st.floats(0, 1),
            "allow_assumed": st.booleans(),
        },
    ),
    "name": st.sampled_from(["renamed", "j2"]),
}


def document(kind: str) -> dict:
    sources, link = KINDS[kind]
    return {
        "name": "j",
        "sources": copy.deepcopy(sources),
        "from": "a",
        "joins": [copy.deepcopy(link)],
        "select": ["a.id AS aid"],
        "output": {"path": "out"},
    }


def digest(doc: dict) -> str:
    return definition_hash(spec_from_dict(doc))


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(KINDS)), meta=st.fixed_dictionaries({}, optional=META))
def test_what_decides_no_row_leaves_the_hash_as_it_is(kind, meta):
    """Description, schedule, quality, the job's name, and where its tables live: none changes a row."""
    doc = document(kind)
    changed = {**copy.deepcopy(doc), **meta}
    changed["sources"]["a"]["path"] = "/elsewhere/a"
    changed["output"] = {"path": "/elsewhere/out", "partition_by": ["aid"]}
    # A source's max_future is the arrival index's to refuse (in its own words); a lookup's
    # database may move (its answers are read back from the journal).
    changed["sources"]["a"]["max_future"] = "1h"
    if "lookup" in changed["joins"][0]:
        changed["joins"][0]["lookup"]["url"] = "jdbc:postgresql://moved:5433/shop"
    assert digest(changed) == digest(doc)


# Changes that decide rows, each applicable to the kinds it names: every one moves the hash.
ROW_CHANGES = [
    ("interval", lambda d: d["joins"][0].update(within="2h")),
    ("interval", lambda d: d["joins"][0].update(grace="6m")),
    ("interval", lambda d: d["joins"][0].update(type="inner")),
    ("interval", lambda d: d["joins"][0].update(emit="eager")),
    ("interval", lambda d: d["joins"][0].update(on="a.id = b.id AND b.v > 0")),
    ("cross", lambda d: d["joins"][0].update(between=["-2m", "0s"])),
    ("window", lambda d: d["joins"][0].update(window={"tumble": "10m"})),
    ("window", lambda d: d["joins"][0].update(grace="2m")),
    ("rows", lambda d: d["joins"][0].update(rows={"b": 4})),
    ("rows", lambda d: d["joins"][0].update(rows={"a": 3})),
    ("stream-table", lambda d: d["joins"][0].update(type="inner")),
    ("stream-table", lambda d: d["joins"][0].update(as_of="event_time")),
    ("stream-table", lambda d: d["sources"]["b"].update(clock_skew="10s")),
    ("stream-table", lambda d: d["sources"]["b"].update(changelog=True)),
    ("temporal", lambda d: d["joins"][0].update(grace="20m")),
    ("temporal", lambda d: d["sources"]["b"].update(key=["id", "v"])),
    ("asof", lambda d: d["joins"][0].update(as_of="event_time")),
    ("asof", lambda d: d["joins"][0].update(on="a.id = b.id AND b.ts < a.ts")),
    ("table-table", lambda d: d["joins"][0].update(type="left")),
    ("unnest", lambda d: d["joins"][0].update(columns=["label"])),
    ("unnest", lambda d: d["joins"][0].update(type="left")),
    ("lookup", lambda d: d["joins"][0]["lookup"].update(table="clients")),
    (None, lambda d: d["sources"]["a"].update(time="ts2")),
    (None, lambda d: d.update(where="a.id > 0")),
    (None, lambda d: d.update(select=["a.id AS aid", "a.ts"])),
    (None, lambda d: d["output"].update(time="t_out")),
    (None, lambda d: d["output"].update(key=["aid"])),
    (None, lambda d: d.update(start_at="2024-05-01T00:00:00Z")),
]


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    change=st.sampled_from(ROW_CHANGES),
    meta=st.fixed_dictionaries({}, optional=META),
)
def test_a_change_that_decides_rows_moves_the_hash(kind, change, meta):
    """A bound, a grace, a join type, a condition, a window, a key, a time...: each changes the
    hash, whatever else of the file changed with it."""
    applies, apply = change
    kind = applies or kind
    before = document(kind)
    after = {**copy.deepcopy(before), **meta}
    apply(after)
    assert digest(after) != digest(before)


def test_the_yaml_and_the_sql_of_one_job_hash_alike():
    """A SQL job compiles to the definition its YAML form builds: one hash."""
    sql = spec_from_sql(
        "CREATE STREAM a WITH (path='a', time='ts'); CREATE STREAM b WITH (path='b', time='ts');\n"
        "CREATE STREAM j WITH (path='out') AS SELECT a.id AS aid FROM a LEFT JOIN b WITHIN 1 HOUR ON a.id = b.id;"
    )
    yaml = document("interval")
    yaml["joins"][0] = {"join": "b", "type": "left", **ON, "within": "1h"}
    assert definition_hash(sql) == digest(yaml)


def test_the_hash_is_the_same_in_another_process():
    """No hash randomization or set order leaks in: another interpreter computes the same digest."""
    code = (
        "from test_definition import KINDS, digest, document\n"
        "print(' '.join(digest(document(kind)) for kind in sorted(KINDS)))"
    )
    here = Path(__file__).resolve().parent
    other = subprocess.run(
        [sys.executable, "-c", code],
        cwd=here,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "7", "PYTHONPATH": f"{here.parent}:{here}"},
    )
    assert other.stdout.split() == [digest(document(kind)) for kind in sorted(KINDS)]


def test_a_changed_definition_is_refused_in_one_line_and_an_unhashed_table_accepted():
    from streamjoin.definition import refuse_changed

    spec = spec_from_dict(document("interval"))
    refuse_changed(None, spec, "its output out")  # written before hashes were stored
    refuse_changed(definition_hash(spec), spec, "its output out")
    try:
        refuse_changed("0123456789abcdef", spec, "its output out")
    except DefinitionChangedError as error:
        message = str(error)
    assert "\n" not in message and "definition 0123456789abcdef there" in message
    assert "streamjoin reset" in message and "a new output" in message
