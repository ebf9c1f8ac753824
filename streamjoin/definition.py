"""The definition's hash: what decides a job's rows, as one stable digest stored beside its writes.

A job's output, its arrival index and its live checkpoint hold the rows (and the state) of the
definition that wrote them. Each carries that definition's hash (the `streamjoin.definition`
table property; the checkpoint's marker), and a run whose definition hashes differently is refused
before any data moves (docs/backfills.md, "A changed definition"). The hash covers what changes
rows: the sources' names, kinds, keys, times and changelog settings, every link's kind and
settings, `where`, `select`, the output's time and key, and the job's start. It leaves out what
does not: the description, schedule and quality (`JobMeta`), the job's name, and where the tables
and a lookup's database live (paths, table names, JDBC URLs: moving the data or the job's root
changes no row). A source's `max_future` is left to the arrival index, which refuses its change
in its own words.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pyspark.sql import SparkSession

from streamjoin import delta_io
from streamjoin.errors import DefinitionChangedError
from streamjoin.links import plain
from streamjoin.spec import SOURCE_KEYS, JoinSpec

PROPERTY = "streamjoin.definition"  # the table property holding the hash
# Not where a source lives; nor `max_future`, which the arrival index records with its entries and
# refuses a change of in its own words (`index._check_same_future_bound`).
_SOURCE_SETTINGS = tuple(key for key in SOURCE_KEYS if key not in ("path", "table", "max_future"))


def definition(spec: JoinSpec) -> dict[str, Any]:
    """The settings of `spec` that decide its rows, as plain data (module docstring)."""
    sources = {s.name: {k: plain(getattr(s, k)) for k in _SOURCE_SETTINGS} for s in spec.sources}
    return {
        "sources": sources,
        "from": spec.start,
        "links": [_deciding(link.settings()) for link in spec.joins],
        "where": spec.where,
        "select": list(spec.select),
        "output": {"time": spec.output.time, "key": list(spec.output.key)},
        "start_at": spec.start_at,
    }


def _deciding(settings: dict[str, Any]) -> dict[str, Any]:
    """A link's settings without where its database lives: a lookup's table decides rows, its URL
    does not (the answers a run records are read back from the journal wherever the database is)."""
    lookup = settings.get("lookup")
    return {**settings, "lookup": {"table": lookup["table"]}} if isinstance(lookup, dict) else settings


def definition_hash(spec: JoinSpec) -> str:
    """A short stable digest of `definition(spec)`: equal for jobs that decide the same rows."""
    text = json.dumps(definition(spec), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def places(spec: JoinSpec, output: bool = True) -> dict[str, str]:
    """The tables of the job that carry the hash, by what they are: its arrival index, and its
    output unless a run writes elsewhere (`output` False)."""
    found = {"arrival index": spec.output.side("index")}
    return {"output": spec.output.location, **found} if output else found


def refuse_changed(stored: str | None, spec: JoinSpec, place: str) -> None:
    """Refuse, in one line, a run of `spec` over what a definition hashing to `stored` wrote at
    `place`; None (written before definitions were hashed) is accepted."""
    now = definition_hash(spec)
    if stored is None or stored == now:
        return
    raise DefinitionChangedError(
        f"job {spec.name!r}: its definition changed since {place} was written (definition {stored} there, "
        f"{now} now), so its rows would differ from the rows already written; run `streamjoin reset` on the "
        "job (and its checkpoint) to compute it again from its start, or give the changed job a new output"
    )


def check(spark: SparkSession, spec: JoinSpec, output: bool = True) -> None:
    """Refuse to run `spec` over tables a different definition wrote (`places`), before any data moves."""
    for what, location in places(spec, output).items():
        if delta_io.exists(spark, location):
            stored = delta_io.table_properties(spark, location).get(PROPERTY)
            refuse_changed(stored, spec, f"its {what} {location}")


def stamp(spark: SparkSession, spec: JoinSpec, output: bool = True) -> None:
    """Record the definition's hash on the job's tables that exist and lack it (`places`): tables
    written before hashes were stored get it on their next run."""
    now = definition_hash(spec)
    for location in places(spec, output).values():
        if (
            delta_io.exists(spark, location)
            and delta_io.table_properties(spark, location).get(PROPERTY) != now
        ):
            delta_io.set_table_property(spark, location, PROPERTY, now)
