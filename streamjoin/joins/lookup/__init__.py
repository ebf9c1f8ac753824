"""Lookup joins (Flink's JDBC lookup join), made replayable by a journal of the answers.

Each stream row is enriched with the rows of an external database table whose key columns equal
the row's, as the database holds them when the row is processed (`lookup: {url, table}`, `on`
with at least one equality; Flink's `JOIN customers FOR SYSTEM_TIME AS OF o.proc_time`).

No seed system can replay such a join: the database has moved on. Here every answer is recorded
in the journal `<output>_lookups`, keyed by the row's commit (source, version) and its lookup key:
the first run that processes a commit (the live runner, as rows arrive) asks the database once per
key of the commit and appends the answers; every later run of that commit (a replay, a backfill,
`verify`, a restarted batch) reads them back, so it writes the rows the live run wrote. A run
that meets commits the journal does not hold (a backfill of history no live run processed) asks
the database as it is now, records those answers too, and says how many it fetched
(the `lookups` total of its metrics, in its summary). Rows of one commit with one key share one answer; if two
runs raced to record one, the first recorded wins for everyone.

INNER drops a row without a database row (or none passing the condition's other terms), LEFT
keeps it once, padded. A row with a NULL key is rejected (`null_key`), as in every keyed join.
Decided as the row is processed: nothing is late, nothing waits, no state is kept. Output event
time: the row's own.

Two runs recording answers for the same commits at the same moment (a backfill over a range the
live runner is still writing, which docs/backfills.md, "Who writes an output", rules out) could
each read its own answer before seeing the other's; the journal then settles on the earlier
`looked_up_at` for later runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from streamjoin import family
from streamjoin.database import Lookup
from streamjoin.enums import JoinType, LinkKind
from streamjoin.errors import JobError
from streamjoin.links import Link
from streamjoin.sql import property_key, setting_value, statement_settings

if TYPE_CHECKING:
    from streamjoin.plan import BoundJoin, Plan


@dataclass(frozen=True, kw_only=True)
class LookupLink(Link):
    """Each row enriched with the rows of an external database table with equal keys, looked up
    as the row is processed and recorded in a journal beside the output (streamjoin/joins/lookup/)."""

    lookup: Lookup
    on: str | None = None

    kind = LinkKind.LOOKUP
    makes_rows = True

    def _check(self, where: str) -> None:
        super()._check(where)
        if self.type not in (JoinType.INNER, JoinType.LEFT):
            raise JobError(
                f"{where}: a lookup join is INNER (a row without a database row is dropped) or LEFT (kept, "
                f"padded); type {self.type} has no meaning for rows looked up for the row"
            )
        if not self.on:
            raise JobError(
                f"{where}: a lookup join needs 'on' with an equality of a stream column and a column of the "
                "database table (Flink's mandatory equality), e.g. on: orders.customer_id = c.id"
            )

    def expressions(self) -> list[tuple[str, str]]:
        return [("on", str(self.on))]


def _made(item: Mapping[str, Any], where: str) -> LookupLink:
    """`lookup: {url, table, user, password_env, driver}` with `on`, named by `as` (YAML)."""
    if item.get("args") or "columns" in item:
        raise JobError(
            f"join with {item['as']!r}: 'args' and 'columns' belong to UNNEST and table-function joins; remove them"
        )
    settings = item["lookup"]
    family.only(settings, {"url", "table", "user", "password_env", "driver"}, f"{where}: lookup")
    text = {
        k: None if settings.get(k) is None else str(settings[k]) for k in ("user", "password_env", "driver")
    }
    table = Lookup(url=str(settings.get("url", "")), table=str(settings.get("table", "")), **text)
    return LookupLink(item["as"], item.get("type", "inner"), lookup=table, on=item.get("on"))


def _sql_declaration(declared: family.SqlDeclaration) -> dict[str, Any] | None:
    """Flink's `CREATE TABLE customers (...) WITH ('connector' = 'jdbc', 'url' = ..., 'table-name' =
    ..., 'username' = ..., 'driver' = ...)`: a database table to look rows up in, not a source; its
    settings as a lookup's. The password only by the name of an environment variable."""
    create, where = declared.statement, declared.where
    properties = create.args.get("properties")
    jdbc = any(
        property_key(p) == "connector" and setting_value(p.args.get("value"), "connector") == "jdbc"
        for p in (properties.expressions if properties else [])
    )
    if not jdbc:
        return None
    allowed = ("connector", "url", "table-name", "username", "password", "password_env", "driver")
    settings = statement_settings(create, allowed, where)
    if "password" in settings:
        raise JobError(
            f"{where}: {declared.at(create)}a password does not belong in a job file; put it in an environment "
            "variable and name that: 'password_env' = 'SHOP_PASSWORD'"
        )
    names = {
        "url": "url",
        "table-name": "table",
        "username": "user",
        "password_env": "password_env",
        "driver": "driver",
    }
    return {names[key]: value for key, value in settings.items() if key in names}


def _sql_made(joined: family.SqlMade) -> str | None:
    """A JOIN of a declared JDBC table makes the rows looked up, named by its alias."""
    table = joined.join.this
    tables = joined.declared.get("lookup", {})
    return table.alias_or_name if isinstance(table, exp.Table) and table.name in tables else None


def _sql_made_join(joined: family.SqlMade) -> dict[str, Any]:
    """Flink's lookup join, `JOIN customers FOR SYSTEM_TIME AS OF o.proc_time AS c ON o.id = c.id`,
    as a join entry. The AS OF time says "when the row is processed" in Flink; here that is when
    its commit is first processed."""
    join, table = joined.join, joined.join.this
    side = (join.args.get("side") or "").upper()
    on = join.args.get("on")
    if side not in ("", "LEFT") or (join.args.get("kind") or "").upper() == "CROSS" or on is None:
        raise JobError(
            f"{joined.where}: {joined.at(table)}a lookup join of {table.name} is JOIN or LEFT JOIN ... ON "
            f"<stream column> = <{table.name} column> (Flink)"
        )
    return {
        "lookup": dict(joined.declared["lookup"][table.name]),
        "as": table.alias_or_name,
        "on": joined.sql(on),
        "type": "left" if side == "LEFT" else "inner",
    }


def _bind(binding: family.Binding) -> dict[str, Any]:
    """The database table's columns (as the job's journal recorded them, else read through JDBC
    now, so an unreachable database is refused before data moves: the catalog's), and the
    condition split into the key equalities (at least one, Flink's rule) and the other terms."""
    from pyspark.sql.types import StructField, StructType

    from streamjoin.plan import check_qualifiers, conjuncts, equality, qualify

    link, left, where = binding.link, binding.left, binding.where
    assert isinstance(link, LookupLink) and link.on  # the spec requires a condition
    columns = binding.catalog.database_columns(link.lookup, where, binding.spec.output.side("lookups"))
    made = StructType([StructField(f.name, f.dataType, True) for f in columns.fields])
    seen = {**binding.schemas, link.source: made}
    on = qualify(str(link.on), (*left, link.source), seen, where)
    check_qualifiers(on, (*left, link.source), seen, where)
    equi, residual = [], []
    for term in conjuncts(on, f"{where}: the condition"):
        pair = equality(term, left, link.source)
        if pair:
            equi.append(pair)
        else:
            residual.append(f"({term.sql(dialect='spark')})")
    if not equi:
        raise JobError(
            f"{where}: a lookup join needs an equality of a stream column and a column of {link.lookup.where} "
            f"(Flink's rule: the database is asked by key), e.g. on: {left[0]}.customer_id = {link.source}.id"
        )
    return {"equi": tuple(equi), "residual": " AND ".join(residual) or None, "condition": on, "made": made}


def _explain(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    """`explain`'s text: Flink's form of the join, and how the journal makes it replayable."""
    assert join.made is not None  # the plan binds lookup joins so
    columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in join.made.fields)
    condition = " AND ".join(
        [*(f"{a} = {b}" for a, b in join.equi), *([join.residual] if join.residual else [])]
    )
    return [
        f"  {step}. {join.spec.type.upper()} JOIN {join.link(LookupLink).lookup.where} AS {join.right}({columns}) "
        f"[lookup] ON {condition}",
        "     each row enriched with the database's rows of its key as it holds them when the row's commit is "
        f"first processed, recorded in the journal {plan.spec.output.side('lookups')}; later runs read the "
        "journal (commits it lacks are looked up then, and counted)",
    ]


family.register(
    family.Family(
        name="lookup",
        links=(LookupLink,),
        made_by=(("lookup", "'lookup'"),),
        made=_made,
        sql=family.SqlSyntax(declaration=_sql_declaration, made=_sql_made, made_join=_sql_made_join),
        bind=_bind,
        explain=_explain,
        operator="streamjoin.joins.lookup.step:LookupJoin.build",
        reach="streamjoin.joins.lookup.step:check_database",
        order=920,  # after the UNNEST and table-function families (joins/lateral/)
        totals={
            "lookups": family.Total(
                said="looked up in the database (not yet in the journal)",
                label="looked up (not in the journal)",
            )
        },
    )
)
