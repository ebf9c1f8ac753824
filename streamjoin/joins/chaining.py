"""What a join family offers to be a link of a chain, and which links it takes after its own.

A chain (`joins/chain.py`) is a fold over links. Each link decides one part of the job over the
rows of one stream: a source's, or the rows the link before emitted, each at the position where it
became known (its emission position). The `ChainLink` interface is what the fold calls, with one
signature for every family: run the link over its input (`run_link`, giving the rows it emits in
its own joined form, its counts per slice, what it keeps open, what it keeps waiting), turn those
rows into the next link's input (`as_rows`) or into output rows (`output`), and say which sources
it reads (`reads`) and how far around the slices (`read_margins`).

Which links may follow which is declared, not written into the fold: each family registers what
it accepts right after its own link (`declare`, a tuple of `Accepts`) and, if it can be a later
link itself, how it is built over the rows of the link before (`Upstream`). `refusal` builds the
message of a job whose links do not chain from those declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructField

from streamjoin import family
from streamjoin.errors import UnsupportedJobError
from streamjoin.joins.base import JoinOperator, StepInput
from streamjoin.metrics import LinkCounts, SourceCounts
from streamjoin.plan import BoundJoin, Plan


def derived(number: int) -> str:
    """The stream of rows the links before join `number` (the job's, from 2) emitted: its input."""
    return f"_sj_link{number}"


def _always(join: BoundJoin) -> bool:
    return True


@dataclass(frozen=True)
class Accepts:
    """A kind of join a family takes as the next link after its own: one of `families` (the plan's
    family names) for which `allows` holds (`when` says what it demands, for the refusal)."""

    families: tuple[str, ...]
    when: str = ""
    allows: Callable[[BoundJoin], bool] = _always
    at_start: bool = False  # only after a link that reads a source (the chain's first)
    last: bool = False  # the join it takes ends the chain


@dataclass(frozen=True)
class Upstream:
    """A later link's input: the rows the link before emitted, named `name` (`derived`), holding
    `sources`' columns (a struct each); `number` is the job's number of the new link."""

    name: str
    sources: tuple[str, ...]
    number: int


@dataclass(frozen=True)
class LinkInput:
    """What the fold hands a link: the step, and (after the first link) the rows the link before
    emitted at their emission positions and the rows it keeps waiting (their event time `T` and
    their clock `CLOCK`): a stream-stream link keeps partners open for those."""

    step: StepInput
    rows: DataFrame | None = None
    held: DataFrame | None = None


@dataclass
class LinkRun:
    """What one link decided in a step. `emitted` is in the family's joined form (`as_rows` and
    `output` read it); `sources` counts, per slice, the sources it reads (not its input rows);
    `links`, per slice, one `LinkCounts` per join it decides; `state` the rows it keeps (by name);
    `held` the rows it keeps waiting that a later link must wait for; `watermark` the streams'
    watermark it judged lateness by (None: it judges none)."""

    emitted: list[DataFrame]
    late: DataFrame
    sources: Sequence[dict[str, SourceCounts]]
    links: Sequence[list[LinkCounts]]
    state: dict[str, DataFrame] | None
    cached: list[DataFrame] = field(default_factory=list)
    held: DataFrame | None = None
    watermark: int | None = None


class ChainLink(JoinOperator, Protocol):
    """A join operator that can be a link of a chain."""

    @property
    def number(self) -> int:
        """The job's number of its first join (from 1)."""
        ...

    @property
    def reach(self) -> tuple[int, int]:
        """How far (before, after) around the slices it emits rows, for the links after it."""
        ...

    def family(self) -> str:
        """The plan's family name of its last join (whose declaration says what may follow)."""
        ...

    def joins(self) -> int:
        """How many of the job's joins it decides."""
        ...

    def input(self) -> str:
        """The stream whose rows it takes: a source, or `derived(number)` after another link."""
        ...

    def reads(self) -> tuple[str, ...]:
        """The job's sources it reads (its input's, if a source, and those it joins)."""
        ...

    def sources(self) -> tuple[str, ...]:
        """The sources whose columns its emitted rows hold, in the order written."""
        ...

    def carries(self) -> tuple[StructField, ...]:
        """Columns its emitted rows carry for later links beside the sources' and the arrival
        columns; every state row of its chain carries them (NULL where a row has none)."""
        ...

    def read_margins(self, side: str) -> tuple[int, int] | None:
        """How far around the slices it reads source `side` (its margins plus its reach); None:
        it does not read `side` as a stream."""
        ...

    def reaching(self, reach: tuple[int, int]) -> ChainLink:
        """This link emitting `reach` around the slices (what the links after it read there)."""
        ...

    def absorb(self, plan: Plan, join: BoundJoin) -> ChainLink | None:
        """This link deciding `join` too (several tables looked up in turn are one link); None:
        `join` is a link of its own."""
        ...

    def run_link(self, spark: SparkSession, plan: Plan, given: LinkInput) -> LinkRun:
        """Decide this link's part of the step."""
        ...

    def as_rows(
        self, spark: SparkSession, plan: Plan, emitted: list[DataFrame], inputs: StepInput
    ) -> DataFrame:
        """Emitted rows as the rows of one stream, the next link's input: each source's columns in
        a struct named after it, `carries`, the output event time and the emission position."""
        ...

    def output(self, plan: Plan, emitted: list[DataFrame]) -> DataFrame:
        """Emitted rows as output rows (`where`, `select`, the output time)."""
        ...


LaterLink = Callable[[Plan, BoundJoin, Upstream], ChainLink]


@dataclass(frozen=True)
class Declaration:
    """What a family declares about chains: the joins it takes after its own link, and how it is
    built as a later link (None: never one)."""

    accepts: tuple[Accepts, ...]
    after: LaterLink | None = None


DECLARED: dict[str, Declaration] = {}  # plan family name -> its declaration


def declare(*names: str, accepts: tuple[Accepts, ...], after: LaterLink | None = None) -> None:
    """Declare, for the plan's family names `names`, what follows their links and how they follow."""
    for name in names:
        DECLARED[name] = Declaration(accepts, after)


def accepted(family: str, join: BoundJoin, at_start: bool) -> Accepts | None:
    """The rule of `family`'s declaration that takes `join` right after its link (`at_start`: that
    link reads a source), or None."""
    declared = DECLARED.get(family)
    for rule in () if declared is None else declared.accepts:
        if join.family in rule.families and rule.allows(join) and (at_start or not rule.at_start):
            return rule
    return None


def later_link(plan: Plan, join: BoundJoin, upstream: Upstream) -> ChainLink | None:
    """`join` as a link after another (`upstream`), or None if its family is never a later link."""
    declared = DECLARED.get(join.family)
    return None if declared is None or declared.after is None else declared.after(plan, join, upstream)


def _names(families: Sequence[str]) -> str:
    """ "an a join", "an a or b join", "an a, b or c join"."""
    listed = families[0] if len(families) == 1 else f"{', '.join(families[:-1])} or {families[-1]}"
    return f"{'an' if listed[0] in 'aeiou' else 'a'} {listed} join"


def _rule_text(rule: Accepts) -> str:
    """One rule as the refusal says it: "at a chain's start, an interval join (keyed) that ends it"."""
    return (
        ("at a chain's start, " if rule.at_start else "")
        + _names(rule.families)
        + (f" ({rule.when})" if rule.when else "")
        + (" that ends the chain" if rule.last else "")
    )


def chains() -> str:
    """What may follow what, from the declarations: one sentence for the refusal."""
    groups: dict[tuple[Accepts, ...], list[str]] = {}
    for name, declared in sorted(DECLARED.items()):
        if declared.accepts:
            groups.setdefault(declared.accepts, []).append(name)
    rules = [
        f"after {_names(names)}, {', or '.join(_rule_text(rule) for rule in accepts)}"
        for accepts, names in sorted(groups.items(), key=lambda group: group[1])
    ]
    closed = sorted(name for name in family.operators() if not (name in DECLARED and DECLARED[name].accepts))
    if closed:
        rules.append(f"after {_names(closed)}, none yet")
    return "; ".join(rules)


def refusal(plan: Plan, number: int) -> UnsupportedJobError:
    """The refusal of a job whose join `number` (from 2) does not follow the join before it."""
    join, before = plan.joins[number - 1], plan.joins[number - 2]
    return UnsupportedJobError(
        f"job {plan.spec.name!r}: join {number} ({join.spec.type.upper()} JOIN {join.right}, family "
        f"{join.family}) cannot follow the {before.family} join before it yet. Joins chain as each "
        f"family declares: {chains()}. Split the job: write the first joins' output to a table and "
        "join it in a second job"
    )
