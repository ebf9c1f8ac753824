"""Table-table joins (ksqlDB primary-key 1:1 and foreign-key 1:N): a result table and its changelog.

The result is itself a table, keyed by the left table's primary key (a FULL primary-key join keys
a right-only row by the right key). After every input commit, in arrival-position order, each
result row the commit touches is recomputed from the tables as they are at that position:

- the row appears or its values change: an `upsert`;
- the row disappears (a tombstone on either side, a foreign key moved away, `where` no longer
  holds): a `delete`, ksqlDB's output tombstone, emitted only if the row existed.

Primary-key join: the equalities pair the left table's whole primary key with the right table's.
Foreign-key join: any left columns equal the right table's whole primary key; a change of a right
row updates every left row pointing at it at that moment (ksqlDB's 1:N table, row 8). INNER needs
both rows (and the residual), LEFT the left row, FULL (primary key only) either.

N-way (`FROM a JOIN b ON ... JOIN c ON ...`, all tables): each further table joins by its whole
primary key from the columns of one earlier table, INNER or LEFT; the result stays keyed by the
first table's key, and a change of any table touches every result row that leads to it at that
moment, back along the links. A FULL join is a job's only join.

Each result change carries the position of the input commit that caused it, so the sequence of
changes per key is a function of the tables' logs alone: the live runner and a replay produce
the same sequence, however commits were grouped into micro-batches. A change is settled once all
tables are known past its commit (`clock_skew`, as for enrichment joins).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamjoin import family
from streamjoin.enums import LinkKind, SourceKind
from streamjoin.errors import JobError
from streamjoin.links import Conditioned, Graced, Link

if TYPE_CHECKING:
    from streamjoin.plan import BoundJoin, Plan


@dataclass(frozen=True)
class TableTableLink(Graced, Conditioned):
    """Two tables joined by key: the result a table too, updated by every commit of either
    (ksqlDB's table-table join). It judges nothing late: its grace (given, or derived from a SQL
    job's watermarks) has no effect."""

    kind = LinkKind.TABLE_TABLE


def _claim(given: Mapping[str, Any], left: SourceKind | None, right: SourceKind | None) -> type[Link] | None:
    """Two tables (and nothing an earlier family claims): a table-table link."""
    return TableTableLink if (left, right) == (SourceKind.TABLE, SourceKind.TABLE) else None


RESERVED = ("result_key", "op", "change_source", "change_version")  # the result's and changes' own columns


def _check(plan: Plan) -> None:
    """The output's columns must not take the names the result and its changes hold."""
    reserved = sorted(set(RESERVED) & set(plan.output_columns))
    if reserved:
        raise JobError(
            f"job {plan.spec.name!r}: output column(s) {', '.join(reserved)} are reserved in a table-table join's "
            "result and changes; give those select items other aliases"
        )


def _explain(plan: Plan, join: BoundJoin, step: int) -> list[str]:
    """A table-table link's kind (primary- or foreign-key) and the key its result is kept by."""
    first = plan.source(join.left[0]).spec
    parent = plan.source(join.equi[0][0].split(".", 1)[0]).spec if join.equi else first
    kind = (
        "primary-key (1:1)"
        if sorted(a.split(".", 1)[1] for a, _ in join.equi) == sorted(parent.key)
        else "foreign-key (1:N)"
    )
    of = "" if parent.name == first.name else f" of {parent.name}"
    return [
        f"     {kind}{of}: result keyed by {first.name}'s key ({', '.join(first.key)}); every input commit "
        f"updates the rows it touches; changes (upsert/delete) in {plan.spec.output.side('changes')}"
    ]


family.register(
    family.Family(
        name="table-table",
        links=(TableTableLink,),
        claims=(family.Claim(70, _claim),),
        check=_check,
        explain=_explain,
        operator="streamjoin.joins.table_table.step:TableTableJoin.build",
    )
)
