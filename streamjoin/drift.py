"""Schema changes in sources: those a job follows, and those it refuses before any data moves.

A run reads each source over a range of versions (from the job's start to the version it pins),
and the source's schema may change within it: columns added, dropped or renamed (Delta's column
mapping). The reads follow each version's schema (`delta_io.read_changes`, the live runner's
schema log), so a change to a column the job never uses changes nothing. A change to a column it
uses (`BoundSource.used`: selected, a key, a join or filter column, its time) is refused with the
source, the column, the version and what to do (docs/semantics.md, "Schema changes in sources").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import SparkSession
from pyspark.sql.types import StructField, StructType

from streamjoin import delta_io
from streamjoin.delta_io import SchemaSpan, column_id
from streamjoin.errors import JobError

if TYPE_CHECKING:
    from streamjoin.plan import BoundSource, Plan


def check(spark: SparkSession, plan: Plan, starts: dict[str, int], upto: dict[str, int]) -> None:
    """Refuse a run whose sources, over the versions it reads (from `starts` to `upto`, by source
    name), changed a column the job uses."""
    for source in plan.sources:
        check_source(spark, source, starts[source.name], upto[source.name])


def check_source(spark: SparkSession, source: BoundSource, since: int, upto: int) -> None:
    """Refuse reading versions [since, upto] of `source` if a column the job uses was dropped,
    renamed, or dropped and added again within them. Versions older than the log keeps (a journal
    serves them) are not checked: their schema is no longer known."""
    location = source.spec.location
    since = max(since, delta_io.oldest_version(spark, location))
    spans = delta_io.schema_spans(spark, location, since, max(since, upto))
    for column in source.used:
        change = _change(column, spans)
        if change is None:
            continue
        what, version = change
        if what == "was dropped":
            advice = "Remove it from the job (a live run: on a new checkpoint)"
        else:  # the versions before `version` hold it under another name, or another column of its name
            advice = (
                f"Start the job at version {version} or later, from which it is the same column throughout: "
                f"`streamjoin reset <job file> --yes`, then run it with `--from {source.name}={version}` (or start_at)"
            )
        raise JobError(
            f"source {source.name!r} ({location}): column {column!r}, which the job uses, {what} at version "
            f"{version}, and this run reads its versions {since} to {upto}. {advice}"
        )


def _change(column: str, spans: list[SchemaSpan]) -> tuple[str, int] | None:
    """How `column` (as the newest schema of `spans` names it, or named so before) changed over
    `spans`, and at which version; None if it did not change. Columns are told apart by their
    column-mapping ids; without column mapping, only a drop can be seen (a rename needs it)."""
    newest = _named(spans[-1].schema, column)
    if newest is None:
        version = dropped_at(spans, column)
        return None if version is None else ("was dropped", version)  # never there: binding says so
    key = column_id(newest)
    if key is None:
        return None
    for older, newer in zip(reversed(spans[:-1]), reversed(spans[1:]), strict=True):
        same = next((f for f in older.schema.fields if column_id(f) == key), None)
        if same is not None and same.name != newest.name:
            return f"was renamed (from {same.name!r})", newer.first
        if same is None and _named(older.schema, column) is not None:
            return "was dropped and added again", newer.first
    return None


def dropped_at(spans: list[SchemaSpan], column: str) -> int | None:
    """The version from which `column` is missing for good, after a span that had it; None if no
    span has it."""
    having = [n for n, span in enumerate(spans) if _named(span.schema, column) is not None]
    if not having or having[-1] == len(spans) - 1:
        return None
    return spans[having[-1] + 1].first


def missing_column(spark: SparkSession, location: str, column: str, source: str) -> str | None:
    """Why a table has no `column` although its log shows it had one, and what a job naming it as
    `<source>.<column>` can do: renamed (its column-mapping id lives on under another name) or
    dropped, at which version; None if no version the log keeps had it."""
    oldest, newest = delta_io.logged_versions(spark, location)
    spans = delta_io.schema_spans(spark, location, oldest, newest)
    version = dropped_at(spans, column)
    if version is None:
        return None
    before = next(s for s in reversed(spans) if s.first < version)
    had = _named(before.schema, column)
    key = None if had is None else column_id(had)
    now = next((f for f in spans[-1].schema.fields if key is not None and column_id(f) == key), None)
    if now is not None:
        return (
            f"column {column!r} was renamed to {now.name!r} at version {version}. Name it {source}.{now.name} "
            f"and start the job at version {version} or later, or remove it from the job"
        )
    return (
        f"column {column!r} was dropped from it at version {version}. Remove {source}.{column} from the job"
    )


def _named(schema: StructType, column: str) -> StructField | None:
    """The field of `schema` named `column`, letter case aside (Spark's resolution)."""
    return next((f for f in schema.fields if f.name.lower() == column.lower()), None)
