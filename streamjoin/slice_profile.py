"""Many slices' expectations in one pass: the numbers Great Expectations reports for each
expectation of a suite (rows, missing values, unexpected values), per slice, from one aggregation
grouped by slice over the rows of a backfill's batch (docs/backfills.md, "Validation").

Only expectations whose numbers are counts of rows are profiled here (`PROFILED`): not NULL,
between two bounds (numbers or the slice bounds), unique, compound unique, each with `mostly` or
not. A suite's other expectations, or one of these with other arguments, are not profiled: the
slice is then validated by Great Expectations over its own rows, as is every slice a profiled
expectation fails (so a failure reads as Great Expectations words it, with example values).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from streamjoin.arrival import Slice, Slices

NOT_NULL = "expect_column_values_to_not_be_null"
BETWEEN = "expect_column_values_to_be_between"
UNIQUE = "expect_column_values_to_be_unique"
COMPOUND_UNIQUE = "expect_compound_columns_to_be_unique"
PROFILED = {  # expectation type -> the arguments it may have to be profiled
    NOT_NULL: {"column", "mostly"},
    BETWEEN: {"column", "min_value", "max_value", "strict_min", "strict_max", "mostly"},
    UNIQUE: {"column", "mostly"},
    COMPOUND_UNIQUE: {"column_list", "mostly"},
}
_SLICE = "_sj_profile_slice"


@dataclass(frozen=True)
class Observed:
    """What one expectation found in one slice, as Great Expectations counts it: the rows, those
    whose value is missing (NULL: not judged, except by the not-NULL expectation, whose rows these
    are) and those that fail it."""

    element_count: int
    missing_count: int
    unexpected_count: int

    def passes(self, expectation: dict) -> bool:
        """Whether the expectation holds: no unexpected row, or at least `mostly` of the judged
        rows expected (an empty slice passes)."""
        judged = self.element_count - (0 if expectation["type"] == NOT_NULL else self.missing_count)
        if judged == 0 or self.unexpected_count == 0:
            return True
        mostly = expectation["kwargs"].get("mostly")
        return mostly is not None and (judged - self.unexpected_count) / judged >= mostly


def profiled(expectation: dict, parameters: dict[str, Any]) -> bool:
    """Whether `profile` computes the expectation's numbers: a type of `PROFILED` with only the
    arguments it knows, bounds that are numbers or named slice parameters."""
    kind, kwargs = expectation["type"], expectation["kwargs"]
    if kind not in PROFILED or not set(kwargs) <= PROFILED[kind]:
        return False
    for name in ("min_value", "max_value"):
        value = kwargs.get(name)
        if isinstance(value, dict):
            if set(value) != {"$PARAMETER"} or value["$PARAMETER"] not in parameters:
                return False
        elif value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return False
    return True


def profile(
    rows: DataFrame,
    time_column: str,
    pieces: Sequence[Slice],
    expectations: Sequence[dict],
    parameters: Sequence[dict[str, Any]],
) -> list[list[Observed | None]]:
    """Per slice of `pieces` (its rows: those whose `time_column` lies in it), per expectation, what
    it found (None: not profiled, `profiled`); `parameters[k]` are slice k's suite parameters.
    One aggregation over `rows`, grouped by slice: its cost does not grow with the slices."""
    slices = Slices.of(pieces)
    numbered = rows.withColumn(_SLICE, slices.number(F.unix_micros(F.col(f"`{time_column}`"))))
    numbered = numbered.where(F.col(_SLICE).isNotNull())
    known = [k for k, e in enumerate(expectations) if profiled(e, parameters[0])]
    aggregates: list[Column] = []
    for k in known:
        numbered, counts = _counts(numbered, expectations[k], k, parameters, len(pieces))
        aggregates += counts
    found: dict[int, Any] = {}
    if aggregates:
        found = {row[_SLICE]: row for row in numbered.groupBy(_SLICE).agg(*aggregates).collect()}
    return [
        [_observed(found.get(s), k) if k in known else None for k in range(len(expectations))]
        for s in range(len(pieces))
    ]


def _observed(row: Any, k: int) -> Observed:
    if row is None:  # no row in the slice
        return Observed(0, 0, 0)
    return Observed(row[f"e{k}"], row[f"m{k}"], row[f"u{k}"])


def _counts(
    rows: DataFrame, expectation: dict, k: int, parameters: Sequence[dict[str, Any]], slices: int
) -> tuple[DataFrame, list[Column]]:
    """The rows (with a column the counts need, for the uniqueness expectations) and the three
    aggregates of expectation `k`: its rows, missing and unexpected, per slice."""
    kind, kwargs = expectation["type"], expectation["kwargs"]
    columns = [kwargs["column"]] if "column" in kwargs else list(kwargs["column_list"])
    values = [F.col(f"`{c}`") for c in columns]
    missing = values[0].isNull() if kind != COMPOUND_UNIQUE else _all(v.isNull() for v in values)
    if kind == NOT_NULL:
        unexpected = missing
    elif kind == BETWEEN:
        unexpected = ~missing & ~_within(values[0], kwargs, parameters, slices)
    else:  # unique, compound unique: a value (tuple) held by more than one row of the slice
        seen = f"_sj_seen{k}"
        rows = rows.withColumn(seen, F.count(F.lit(1)).over(Window.partitionBy(_SLICE, *values)))
        unexpected = ~missing & (F.col(seen) > 1)
    return rows, [
        F.count(F.lit(1)).alias(f"e{k}"),
        F.count_if(missing).alias(f"m{k}"),
        F.count_if(unexpected).alias(f"u{k}"),
    ]


def _within(value: Column, kwargs: dict, parameters: Sequence[dict[str, Any]], slices: int) -> Column:
    """`value` lies within the expectation's bounds (those named by a parameter: the row's slice's)."""
    inside = F.lit(True)
    for name, strict, above in (("min_value", "strict_min", True), ("max_value", "strict_max", False)):
        bound = kwargs.get(name)
        if bound is None:
            continue
        limit = _bound(bound, parameters, slices)
        if above:
            inside = inside & (value > limit if kwargs.get(strict) else value >= limit)
        else:
            inside = inside & (value < limit if kwargs.get(strict) else value <= limit)
    return inside


def _bound(bound: Any, parameters: Sequence[dict[str, Any]], slices: int) -> Column:
    """A bound as a column: a number, or the named parameter of the row's slice."""
    if not isinstance(bound, dict):
        return F.lit(bound)
    values = F.array(*[F.lit(parameters[s][bound["$PARAMETER"]]) for s in range(slices)])
    return F.element_at(values, F.col(_SLICE) + 1)


def _all(conditions) -> Column:
    result = F.lit(True)
    for condition in conditions:
        result = result & condition
    return result
