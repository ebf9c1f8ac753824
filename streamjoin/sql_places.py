"""A SQL job's column errors told in the job file's terms.

A SQL job is checked against its tables after it was compiled to the job mapping, where each alias
is replaced by its source's name and each expression is rewritten as Spark SQL; Spark's own message
then points at "line 1 pos 0" of that rewritten expression. `in_file_terms` turns such an error
back into the file's terms: the line and column of the column that does not resolve, as the user
wrote it (`v.pgae`, not `views.pgae`), and the sources by the aliases the query gives them.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp

from streamjoin.errors import JobError
from streamjoin.sql import StreamSQL

# plan.py's refusal of `<source>.<column>` naming no column of the source
_NO_SUCH_COLUMN = re.compile(
    r"^(?P<job>job '[^']*'): (?P<what>.+?) does not resolve against the sources' columns: "
    r"(?P<source>[^.\s]+)\.(?P<column>\S+) names (?P<rest>no column of source .*)$",
    re.DOTALL,
)
# Spark's analysis refusing a bare name, as plan.py passes it on
_UNRESOLVED = re.compile(
    r"^(?P<job>job '[^']*'): (?P<what>.+?) does not resolve against the sources' columns: \[UNRESOLVED_COLUMN[.\w]*\] "
    r".*? with name `(?P<column>[^`]+)` cannot be resolved\.(?: Did you mean one of the following\? "
    r"\[(?P<suggested>[^\]]*)\]\.)?",
    re.DOTALL,
)


def in_file_terms(error: JobError, text: str, origin: str) -> JobError:
    """`error` (a job's binding error) with the line and column, in `origin`'s SQL `text`, of the
    column it is about, in the user's words; `error` itself when it is not about a column or the
    column is not found in the query."""
    message = str(error)
    named = _NO_SUCH_COLUMN.match(message)
    unresolved = None if named else _UNRESOLVED.match(message)
    found = named or unresolved
    if found is None:
        return error
    query = _query(text)
    aliases = {} if query is None else {t.name: t.alias for t in query.find_all(exp.Table) if t.alias}
    source = named["source"] if named else None
    clause = _clause(query, found["what"])
    column = next((c for c in _columns(clause) if _names(c, source, found["column"], aliases)), None)
    if column is None:
        return error
    written = _written(column, text)
    if named:
        reason = f"{written} names {named['rest']}"
    else:
        suggested = ", ".join(
            _in_aliases(name, aliases) for name in (found["suggested"] or "").split(", ") if name
        )
        reason = f"no source has a column {written}" + (f"; did you mean {suggested}?" if suggested else "")
    where = _place(column)
    return type(error)(
        f"{found['job']}, {origin}: line {where[0]}, column {where[1]}, in {found['what']}: {reason}"
    )


def _query(text: str) -> exp.Query | None:
    """The job's query: the one statement that creates its output AS SELECT (or INSERT INTO)."""
    for statement in sqlglot.parse(text, read=StreamSQL):
        if isinstance(statement, exp.Create | exp.Insert) and isinstance(statement.expression, exp.Query):
            return statement.expression
    return None


def _clause(query: exp.Query | None, what: str) -> list[exp.Expr]:
    """The part of the query an error's `what` names: the select list, the where clause, or the
    condition of the join with a source; the whole query when it names none of them."""
    if query is None:
        return []
    if what == "the select list":
        return list(query.expressions)
    if what.startswith("where"):
        return [query.args["where"]] if query.args.get("where") else [query]
    joined = re.match(r"the condition of the join with '([^']+)'", what)
    if joined:
        for join in query.args.get("joins") or []:
            if joined[1] in (join.this.name, join.this.alias) and join.args.get("on"):
                return [join.args["on"]]
    return [query]


def _columns(clause: list[exp.Expr]) -> list[exp.Column]:
    """The column references of a clause, in the order they are written."""
    found = (c for node in clause for c in node.find_all(exp.Column) if c.this.meta.get("line"))
    return sorted(found, key=_place)


def _names(column: exp.Column, source: str | None, name: str, aliases: dict[str, str]) -> bool:
    """`column` is the reference an error names: `source.name` (the source by its name or alias), or
    the bare `name` when `source` is None."""
    if column.name.lower() != name.lower():
        return False
    if source is None:
        return not column.table
    return column.table in (source, aliases.get(source))


def _written(column: exp.Column, text: str) -> str:
    """The column reference exactly as the file writes it."""
    parts = [part.meta for part in column.parts if part.meta.get("start") is not None]
    return text[min(p["start"] for p in parts) : max(p["end"] for p in parts) + 1]


def _place(column: exp.Column) -> tuple[int, int]:
    """(line, column) of a column reference's first character (sqlglot places a token by its last)."""
    first = column.parts[0].meta
    return first["line"], first["col"] - (first["end"] - first["start"])


def _in_aliases(name: str, aliases: dict[str, str]) -> str:
    """One of Spark's suggestions, `` `views`.`page` ``, as the query would write it: `v.page`."""
    parts = [part.strip("`") for part in name.split(".")]
    if len(parts) == 2 and parts[0] in aliases:
        parts[0] = aliases[parts[0]]
    return ".".join(parts)
