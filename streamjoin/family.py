"""A join family is a plug-in: one package of `streamjoin.joins` registers a `Family` at import.

The generic layers (spec.py, sql.py, plan.py, links.py, kernel.py) call this registry and import
no family module, so adding a family is one new package plus its tests. A family's `__init__`
builds one `Family` and passes it to `register`; `families()` imports every package of
`streamjoin.joins` once, so whatever registers there is found. What a `Family` holds:

- `name`, and `links`: its link classes (each a frozen `links.Link` with its `kind`, the plan's
  family of a link of that class).
- `claims`: which link class a join item is, from the settings given and the kinds joined
  (`Claim`; every family's claims are tried by precedence, lowest first, so a family takes its
  place among the others without editing them).
- `keys` and `settings`: the join-item keys it reads in a YAML job (besides `join`, `type`, `on`,
  `using`, `natural`, `grace`, read for every link) and how it turns them into link settings.
  `refused_elsewhere`: why a link of another family refuses one of its keys, when that link does
  not say (after "join with 'x': ").
  A lateral family's items carry no `join` (`unnest: ...`, `function: ...`, `lookup: ...`):
  it lists them in `made_by` (with how a refusal names each), the other keys its items take in
  `made_keys`, and `made` builds its link from the whole item.
- `sql`: its SQL syntax, hooks sql.py's generic join compiler calls (`SqlSyntax`).
- `bind`: its binding, called by plan.py's generic binder after the generic condition split, with
  the catalog, the schemas and the split (`Binding`); it refuses what its link cannot join and
  returns the `BoundJoin` fields it adds (e.g. `named_time`, the time an `as_of` names). Before the split, `schemas` gives
  the schemas the job's expressions see when the family adds `columns` to its sides' rows (a
  window join's window_start/window_end; NATURAL never joins on them), and `own_equality` says
  whether an equality of the condition is the family's own, not a key (`a.window_start =
  b.window_start`), and `inequalities` whether the split takes the condition's inequalities
  between the two sides apart from the residual (an ASOF link's nearest-row one). A lateral link (rows made for each row) has no generic split: its hook binds
  the whole link, asking the `Binding.catalog` what it needs, and returns every `BoundJoin` field
  past the first four (`made` at least).
- `check`: refuses what a whole bound job with its links cannot be (e.g. output columns its
  result reserves); `warnings`: what it warns of a bound job (`validate-job` and `explain`);
  `graced`: the sources of a link whose rows its grace judges late (`sides`: both; a temporal
  link: its table's versions), which the grace warning checks against their commits' lag.
- `explain` and `explain_json`: the lines `streamjoin explain` prints under the link's header (a
  lateral link: its header too) and the keys its JSON adds (`json_keys`: keys every join's JSON
  carries, None for other families).
- `operator`: where its join operator's builder is (`"<module>:<attribute>"`; `Plan`, `BoundJoin`
  -> `JoinOperator`), imported when a run first needs an operator. A family is a package under
  `streamjoin.joins`: its `__init__` declares it and imports no Spark (a job file is read, checked
  and compiled without Spark, as an Airflow DAG file does), its `step` module runs it on Spark: what
  the kernel runs for links of its kinds. `reach`, the same way: what checks, before a live run's
  first batch, the systems outside Spark its link asks for every new commit (a lookup's database).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from streamjoin.enums import SourceKind
from streamjoin.errors import JobError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType
    from sqlglot import exp

    from streamjoin.catalog import Catalog
    from streamjoin.links import Link
    from streamjoin.plan import BoundJoin, Plan
    from streamjoin.spec import JoinSpec

# A link class from the settings a join item gives and the kinds of what it joins (`left`, what
# is joined so far; `right`, its source; None when unknown); None: not this family's item.
ClaimTest = Callable[[Mapping[str, Any], "SourceKind | None", "SourceKind | None"], "type[Link] | None"]


@dataclass(frozen=True)
class Claim:
    """One rule by which a family claims a join item, tried in order of `precedence` (lowest
    first) among every family's rules."""

    precedence: int
    test: ClaimTest

    @classmethod
    def key(cls, precedence: int, key: str, link: type[Link]) -> Claim:
        """A join item giving `key` is a `link`, whatever else it gives (the link refuses the
        settings it does not take in the words given)."""
        return cls(precedence, lambda given, left, right: link if key in given else None)


@dataclass(frozen=True)
class SqlStatement:
    """What a family's statement hook sees of a job's query before it is compiled: the query
    (which the hook may rewrite, e.g. a window function as its source), the declared sources'
    settings by name (which it may complete, e.g. a source's time column), `where` (the job, for
    messages), `at` (a node's position in the statement, to begin a message with) and `duration`
    (an INTERVAL as the duration text a YAML job writes)."""

    query: exp.Expr
    sources: dict[str, dict[str, Any]]
    where: str
    at: Callable[[exp.Expr | None], str]
    duration: Callable[[exp.Interval], str]


@dataclass(frozen=True)
class SqlQuery:
    """What a family's query hook sees of one SELECT: the name of the source it reads FROM, each
    source's `OVER (...)` window by source name (SQLstream), how many JOINs it has, `where` (the
    job and output, for messages), `at` and `duration` (as in `SqlStatement`)."""

    query: exp.Select
    first: str
    overs: Mapping[str, exp.Expr]
    joins: int
    where: str
    at: Callable[[exp.Expr | None], str]
    duration: Callable[[exp.Interval], str]


@dataclass(frozen=True)
class SqlJoin:
    """What a family's join hooks see of one JOIN of a source: the JOIN, the declared source it
    joins (`name`), the job's join item being compiled (which the hook completes), the declared
    sources' settings, the statement's aliases (alias -> source), the sources joined before it
    (`seen`), the OVER windows no query hook claimed, and `where`, `at`, `duration`."""

    join: exp.Join
    name: str
    item: dict[str, Any]
    sources: Mapping[str, Mapping[str, Any]]
    aliases: Mapping[str, str]
    seen: tuple[str, ...]
    overs: Mapping[str, exp.Expr]
    where: str
    at: Callable[[exp.Expr | None], str]
    duration: Callable[[exp.Interval], str]


# Completes the job mapping compiled from a statement a family's statement hook read (sql.py).
Finish = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class SqlDeclaration:
    """A CREATE statement before the query, as a family's SQL hook sees it: the statement, `where`
    and `at` (as in `SqlQuery`)."""

    statement: exp.Create
    where: str
    at: Callable[[exp.Expr | None], str]


@dataclass(frozen=True)
class SqlMade:
    """What a family's SQL hooks for rows made for each row see of one JOIN item: the item, what the statements before the
    query declared for each family (`declared`: family name -> declared name -> its settings),
    `sql` (an expression as Spark SQL over the declared source names), `where` and `at` (as in
    `SqlQuery`)."""

    join: exp.Join
    declared: Mapping[str, Mapping[str, dict[str, Any]]]
    sql: Callable[[exp.Expr], str]
    where: str
    at: Callable[[exp.Expr | None], str]


@dataclass(frozen=True)
class SqlSyntax:
    """A family's SQL hooks, each None when the family has no such syntax. `statement`: reads (and
    rewrites) the statement before it is compiled, returning what completes the compiled job
    mapping, or None when the statement does not use its syntax (a window join's TUMBLE and HOP).
    `query`: the join-item settings its syntax over a whole SELECT gives its first join, claiming
    the OVER windows (None: the query does not use its syntax; the query's checks may still
    refuse it). `join`: adds the settings its syntax gives a JOIN to the join item, once the join's
    type is read. `terms`: takes the terms of a JOIN's condition that are its syntax (an interval
    join's time bounds) and returns the rest, which become `on`. `declaration`: the settings of a
    CREATE statement it claims (e.g. Flink's JDBC table), else None. `made`: the name of the rows
    a JOIN item makes when the family claims it (UNNEST, a declared table it looks rows up in),
    else None; `made_join`: that item's join entry. `methods`: the words before JOIN (`ASOF JOIN`)
    its `join` hook reads; sql.py refuses any other but NATURAL. `words`: its links' advice in a
    YAML job's words (`add as_of: event_time`), each with the SQL statement's nearest form, which
    a SQL job's messages say instead."""

    statement: Callable[[SqlStatement], Finish | None] | None = None
    query: Callable[[SqlQuery], dict[str, Any] | None] | None = None
    join: Callable[[SqlJoin], None] | None = None
    terms: Callable[[SqlJoin, list[exp.Expr]], list[exp.Expr]] | None = None
    declaration: Callable[[SqlDeclaration], dict[str, Any] | None] | None = None
    made: Callable[[SqlMade], str | None] | None = None
    made_join: Callable[[SqlMade], dict[str, Any]] | None = None
    methods: tuple[str, ...] = ()  # JOIN methods its `join` hook reads (`ASOF JOIN`), besides NATURAL
    words: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Binding:
    """What a family's binding hook sees of one link: the catalog that answers schemas and analyses
    expressions (streamjoin/catalog.py), the job, the link, the names joined before it (`left`),
    every schema so far, the condition split into key equalities, residual terms and inequalities,
    and `where` (the job and link, for messages)."""

    catalog: Catalog
    spec: JoinSpec
    link: Link
    left: tuple[str, ...]
    schemas: Mapping[str, StructType]
    equi: tuple[tuple[str, str], ...]
    residual: tuple[str, ...]
    inequalities: tuple[tuple[str, str, str], ...]
    where: str


Builder = Callable[["Plan", "BoundJoin"], Any]  # -> the family's JoinOperator (streamjoin/joins/base.py)


@dataclass(frozen=True)
class Total:
    """A count a family's step reports beyond its sources' buckets (`Counters.totals`): kept in the
    metrics table's column of its name, said in a run's summary and headed so in the report."""

    said: str  # the summary's words before the count
    label: str  # the report's column heading


@dataclass(frozen=True)
class Family:
    """One join family's plug-in (see the module's docstring for what each part is for)."""

    name: str
    links: tuple[type[Link], ...]
    claims: tuple[Claim, ...] = ()
    keys: tuple[str, ...] = ()
    refused_elsewhere: Mapping[str, str] = field(default_factory=dict)
    settings: Callable[[Mapping[str, Any], str], dict[str, Any]] | None = None
    made_by: tuple[tuple[str, str], ...] = ()  # (item key, how a refusal names it)
    made_keys: tuple[str, ...] = ()
    made: Callable[[Mapping[str, Any], str], Link] | None = None
    sql: SqlSyntax = field(default_factory=SqlSyntax)
    bind: Callable[[Binding], Mapping[str, Any]] | None = None
    schemas: Callable[[JoinSpec, Link, str, dict[str, StructType]], dict[str, StructType]] | None = None
    columns: tuple[str, ...] = ()
    own_equality: Callable[[tuple[str, str], str], bool] | None = None
    inequalities: bool = (
        False  # its binding takes the condition's inequalities apart (`Binding.inequalities`)
    )
    check: Callable[[Plan], None] | None = None
    warnings: Callable[[Plan], list[str]] | None = None
    graced: Callable[[BoundJoin], tuple[str, ...]] | None = None
    explain: Callable[[Plan, BoundJoin, int], list[str]] | None = None
    explain_json: Callable[[BoundJoin], dict[str, Any]] | None = None
    json_keys: tuple[str, ...] = ()
    operator: str | None = None  # "<module>:<attribute>" of its builder (module docstring)
    # "<module>:<attribute>" of `(spark, plan, join) -> None`, called before a live run's first batch:
    # the systems outside Spark its link asks for every new commit answer now (a lookup's database)
    reach: str | None = None
    order: int = 1_000  # its precedence when it has no claims (a lateral family: the order of its words)
    totals: Mapping[str, Total] = field(default_factory=dict)  # by name: what its step counts

    @property
    def precedence(self) -> int:
        """Where it stands among the families: its first claim's precedence (its hooks are called
        in this order too)."""
        return min((claim.precedence for claim in self.claims), default=self.order)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The plan's family names of its links (their `kind`)."""
        return tuple(str(link.kind) for link in self.links)


_REGISTERED: dict[str, Family] = {}
OPERATORS: dict[str, Builder] = {}  # plan family name (a link's kind) -> operator builder, once loaded
_discovered = False


def sides(join: BoundJoin) -> tuple[str, ...]:
    """Every source a link joins: what is joined before it and its own (`Family.graced`)."""
    return (*join.left, join.right)


def register(family: Family) -> Family:
    """Add `family` (a family module calls this once, at import); a second family claiming one of
    its kinds or names is a programming error."""
    taken = [
        name
        for other in _REGISTERED.values()
        for name in (*family.kinds, *family.totals)
        if name in other.kinds or name in other.totals
    ]
    if family.name in _REGISTERED or taken:
        raise ValueError(
            f"join family {family.name!r} registered twice (or its kinds or totals {taken} taken)"
        )
    _REGISTERED[family.name] = family
    return family


def families() -> tuple[Family, ...]:
    """Every registered family, after importing each package of `streamjoin.joins` once, in order
    of precedence."""
    global _discovered
    if not _discovered:
        _discovered = True
        package = importlib.import_module("streamjoin.joins")
        for module in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            if module.ispkg:  # a family; the package's plain modules are the families' shared machinery
                importlib.import_module(module.name)
    return tuple(sorted(_REGISTERED.values(), key=lambda family: (family.precedence, family.name)))


def of(kind: str) -> Family | None:
    """The family of links of `kind` (a plan's family name); None when no module registered it."""
    return next((family for family in families() if kind in family.kinds), None)


def claims() -> list[Claim]:
    """Every family's claims, in order of precedence."""
    return sorted((claim for family in families() for claim in family.claims), key=lambda c: c.precedence)


def join_keys() -> tuple[str, ...]:
    """The join-item keys the families read (besides the ones every link reads)."""
    return tuple(key for family in families() for key in family.keys)


def refused_elsewhere(key: str) -> str | None:
    """Why a link refuses another family's join-item `key`, in that family's words (None: it has none)."""
    return next((f.refused_elsewhere[key] for f in families() if key in f.refused_elsewhere), None)


def settings(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The link settings the families read from the keys `item` gives them."""
    given: dict[str, Any] = {}
    for family in families():
        if family.settings is not None and any(key in item for key in family.keys):
            given |= family.settings(item, where)
    return given


def _first_answer(
    hook: Callable[[Family], Callable[[Any], Any] | None], asked: Any
) -> tuple[Family, Any] | None:
    """The first family whose hook (`hook(family)`, None: it has none) answers `asked` with
    something, and that answer; None when no family does."""
    for family in families():
        answers = hook(family)
        found = answers(asked) if answers is not None else None
        if found is not None:
            return family, found
    return None


def sql_query(query: SqlQuery) -> dict[str, Any] | None:
    """The first join's settings from the first family, by precedence, whose syntax the whole
    query uses; it claims the OVER windows, which the families after it do not see."""
    claimed = None
    for family in families():
        if family.sql.query is not None:
            found = family.sql.query(query if claimed is None else replace(query, overs={}))
            claimed = found if claimed is None else claimed
    return claimed


def sql_join(join: SqlJoin) -> None:
    """Each family's settings of a JOIN, added to its item."""
    for family in families():
        if family.sql.join is not None:
            family.sql.join(join)


def sql_methods() -> tuple[str, ...]:
    """The JOIN methods (`ASOF`) the families' join hooks read, in upper case."""
    return tuple(method.upper() for family in families() for method in family.sql.methods)


def sql_words() -> dict[str, str]:
    """Every family's advice in a YAML job's words, with the SQL statement's form of each."""
    return {yaml: sql for family in families() for yaml, sql in family.sql.words.items()}


def sql_terms(join: SqlJoin, terms: list[exp.Expr]) -> list[exp.Expr]:
    """The terms of a JOIN's condition left once each family took its own."""
    for family in families():
        if family.sql.terms is not None:
            terms = family.sql.terms(join, terms)
    return terms


def check(plan: Plan) -> None:
    """The checks of the whole bound job by the families of its links."""
    for family in families():
        if family.check is not None and any(join.family in family.kinds for join in plan.joins):
            family.check(plan)


def warnings(plan: Plan) -> list[str]:
    """What the families warn of a bound job."""
    return [line for family in families() if family.warnings is not None for line in family.warnings(plan)]


def statement(query: SqlStatement) -> list[Finish]:
    """What completes the job mapping, from each family whose syntax the statement uses."""
    hooks = [family.sql.statement for family in families() if family.sql.statement is not None]
    return [finish for finish in (hook(query) for hook in hooks) if finish is not None]


def columns() -> tuple[str, ...]:
    """The columns families add to their sides' rows (NATURAL never joins on them)."""
    return tuple(column for family in families() for column in family.columns)


def only(body: Any, allowed: Collection[str], where: str) -> None:
    """Refuse settings `body` gives beyond `allowed` (a family's keys, a section of a job file),
    naming them and what is allowed; `body` must be a mapping."""
    if not isinstance(body, dict):
        raise JobError(f"{where}: expected a mapping of settings")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise JobError(
            f"{where}: unknown setting(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}"
        )


def made_by() -> tuple[tuple[str, str], ...]:
    """The keys that make a join item lateral, with how a refusal names each, every family's."""
    return tuple(pair for family in families() for pair in family.made_by)


def made_keys() -> tuple[str, ...]:
    """The keys a lateral join item may give besides its kind's key, `as`, `type` and `on`."""
    return tuple(key for family in families() for key in family.made_keys)


def maker(item: Mapping[str, Any]) -> Family | None:
    """The family whose lateral key `item` gives first (None: no family's)."""
    return next((f for f in families() if any(key in item for key, _ in f.made_by)), None)


def sql_declaration(declaration: SqlDeclaration) -> tuple[str, dict[str, Any]] | None:
    """(family name, settings) of a CREATE statement a family claims; None when none does."""
    found = _first_answer(lambda family: family.sql.declaration, declaration)
    return None if found is None else (found[0].name, found[1])


def sql_made(join: SqlMade) -> tuple[Family, str] | None:
    """The family that claims a JOIN item as rows it makes, and their name; None: a source."""
    return _first_answer(lambda family: family.sql.made, join)


def json_keys() -> tuple[str, ...]:
    """The keys every join's JSON carries for some family (None where another family's)."""
    return tuple(key for family in families() for key in family.json_keys)


def totals() -> dict[str, Total]:
    """Every family's named totals by name, in order of precedence (the metrics table's columns)."""
    return {name: total for family in families() for name, total in family.totals.items()}


def operators() -> dict[str, Builder]:
    """Every family's operator builder by kind, their step modules imported (once): what a run
    executes, and what a chain asks of each family (`joins.chaining.declare`, in those modules)."""
    if not OPERATORS:
        for plugin in families():
            if plugin.operator is not None:
                OPERATORS.update(dict.fromkeys(plugin.kinds, resolved(plugin.operator)))
    return OPERATORS


def resolved(path: str) -> Any:
    """What `"<module>:<attribute>"` names (a family's step module imported for it)."""
    where, _, attribute = path.partition(":")
    found: Any = importlib.import_module(where)
    for name in attribute.split("."):
        found = getattr(found, name)
    return found


def operator(kind: str) -> Builder:
    """The operator builder of links of `kind`."""
    return operators()[kind]
