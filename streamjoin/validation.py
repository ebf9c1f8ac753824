"""Per-slice validation of a job's output with Great Expectations (docs/validation.md).

Each job has one expectation suite: `expectations/<job>.json` when that file exists, else the suite
derived from the job (`suite_for`). The slice bounds reach the suite as the suite parameters
`slice_start` and `slice_end`, so a committed suite holds no dates. Every validation stores its
result beside the site and rebuilds the Data Docs, so each slice, failed or not, has its own page.
A second, derived suite judges each link's match rate in the slice against the job's recent
slices (`link_rates`), so an enrichment that suddenly pads a third of its rows makes the slice
invalid.

Great Expectations is imported inside the functions: importing this module stays cheap for the
Airflow DAG files that import it.
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F

from streamjoin import datadocs, delta_io
from streamjoin.arrival import Slice
from streamjoin.errors import JobError
from streamjoin.jars import checkout
from streamjoin.metrics import spark_value
from streamjoin.slice_profile import BETWEEN, NOT_NULL, PROFILED, Observed, profile
from streamjoin.spec import JoinSpec, Quality
from streamjoin.timeutil import from_spark, parse_instant, to_micros

SLICE_START, SLICE_END = "slice_start", "slice_end"  # the suite parameters a validation is given
_SITE = "streamjoin"  # the Data Docs site's name inside the ephemeral context
_COLUMN_ARGUMENTS = ("column", "column_A", "column_B")
_QUIET_KWARGS = {"column", "column_list", "batch_id", "result_format", "catch_exceptions", "include_config"}
_UNEXPECTED = {  # how a failing row is called in a message, by expectation type
    "expect_column_values_to_not_be_null": "NULL",
    "expect_column_values_to_be_unique": "duplicated",
    "expect_compound_columns_to_be_unique": "duplicated",
    "expect_column_values_to_be_between": "outside the range",
}


@dataclass(frozen=True)
class ValidationResult:
    """The outcome of validating one slice's output against the job's suite."""

    suite: str  # suite name (the job name)
    success: bool
    failed: tuple[str, ...]  # one readable line per failed expectation: what, column(s), observed value
    evaluated: int  # expectations evaluated
    docs: str | None  # path of the Data Docs HTML page of this validation (or the site index)
    # every expectation evaluated, passed or not: (passed, what it checks and what was observed);
    # the data-quality page shows these, so it needs no Data Docs (which load from the web)
    checks: tuple[tuple[bool, str], ...] = ()


def suite_for(spec: JoinSpec) -> dict:
    """The default suite derived from the job, in Great Expectations' suite JSON (name, expectations)."""
    time, key, quality = spec.output.time, spec.output.key, spec.meta.quality
    expectations = [
        _expectation(
            "expect_column_values_to_not_be_null", {"column": time}, "every output row has an event time"
        ),
        _expectation(
            "expect_column_values_to_be_between",
            {
                "column": time,
                "min_value": {"$PARAMETER": SLICE_START},
                "max_value": {"$PARAMETER": SLICE_END},
                "strict_max": True,
            },
            "a slice holds only rows of its own interval [slice_start, slice_end)",
        ),
    ]
    checked = {time}
    for column in key:
        if column not in checked:
            checked.add(column)
            expectations.append(
                _expectation("expect_column_values_to_not_be_null", {"column": column}, "output key column")
            )
    if len(key) == 1:
        expectations.append(
            _expectation(
                "expect_column_values_to_be_unique", {"column": key[0]}, "the output key identifies a row"
            )
        )
    elif key:
        expectations.append(
            _expectation(
                "expect_compound_columns_to_be_unique",
                {"column_list": list(key)},
                "the output key identifies a row",
            )
        )
    for column in quality.not_null:
        if column not in checked:
            checked.add(column)
            expectations.append(
                _expectation(
                    "expect_column_values_to_not_be_null",
                    {"column": column},
                    "quality.not_null: outer-join padding never fills it",
                )
            )
    if quality.match_column and quality.min_match_rate > 0:
        expectations.append(
            _expectation(
                "expect_column_values_to_not_be_null",
                {"column": quality.match_column, "mostly": quality.min_match_rate},
                f"at least {quality.min_match_rate:.0%} of rows found a partner (quality.min_match_rate)",
            )
        )
    return {"name": spec.name, "expectations": expectations}


def _expectation(kind: str, kwargs: dict[str, Any], why: str) -> dict:
    return {"type": kind, "kwargs": kwargs, "notes": why}


def suites_folder() -> Path:
    """Where the jobs' editable suites are: $STREAMJOIN_EXPECTATIONS; else expectations/ of the
    source checkout streamjoin runs from; else ./expectations (an installed package)."""
    if os.environ.get("STREAMJOIN_EXPECTATIONS"):
        return Path(os.environ["STREAMJOIN_EXPECTATIONS"])
    root = checkout()
    return (root if root else Path.cwd()) / "expectations"


def suite_path(spec: JoinSpec, folder: str | None = None) -> Path:
    """Where the job's editable suite lives: <folder or suites_folder()>/<job>.json."""
    return Path(folder or suites_folder()) / f"{spec.name}.json"


def load_suite(spec: JoinSpec, folder: str | None = None) -> dict:
    """The job's suite: expectations/<job>.json (or <folder>/<job>.json) if present, else `suite_for(spec)`."""
    path = suite_path(spec, folder)
    if not path.exists():
        return suite_for(spec)
    try:
        suite = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise JobError(
            f"suite {str(path)!r} is not valid JSON: {exc}; fix it or delete it to use the suite derived from the job"
        ) from None
    if not isinstance(suite, dict) or not isinstance(suite.get("expectations"), list):
        raise JobError(f"suite {str(path)!r} must be a JSON object with 'name' and a list of 'expectations'")
    if suite.get("name") != spec.name:
        raise JobError(
            f"suite {str(path)!r} is named {suite.get('name')!r}; name it {spec.name!r}, after its job"
        )
    for number, item in enumerate(suite["expectations"], 1):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("type"), str)
            or not isinstance(item.get("kwargs"), dict)
        ):
            raise JobError(
                f"suite {str(path)!r}: expectation {number} needs 'type' (e.g. expect_column_values_to_not_be_null) and 'kwargs'"
            )
    return suite


def default_site(spec: JoinSpec) -> str:
    """The Data Docs folder of a job: <output location>_quality/data_docs."""
    if not spec.output.path:
        raise JobError(
            f"job {spec.name!r} writes to table {spec.output.table!r}, which has no folder for Data Docs beside it; "
            "pass a site folder (backfill --site)"
        )
    return f"{spec.output.side('quality')}/data_docs"


def validate_slice(
    spark: SparkSession,
    spec: JoinSpec,
    output: DataFrame,
    start: datetime,
    end: datetime,
    site: str | None = None,
) -> ValidationResult:
    """Validate one slice's output [start, end) (naive times are UTC) and rebuild the Data Docs in `site`.

    An empty output is valid. A suite naming a column the output lacks raises JobError: every slice
    would fail alike, and the fix is in the job or the suite. Each link of the job is also judged
    against its recent slices (`link_rates`) when the slice's replay wrote its metrics. Great
    Expectations evaluates every expectation over `output` (a backfill's slices: `validate_slices`).
    """
    start, end = parse_instant(start, "slice start"), parse_instant(end, "slice end")
    batch = _Batch.open(spark, spec, output, site, [(start, end)])
    (result,) = batch.publish([batch.validated(0, output)])
    return result


def validate_slices(
    spark: SparkSession,
    spec: JoinSpec,
    rows: DataFrame,
    pieces: Sequence[Slice],
    site: str | None = None,
) -> list[ValidationResult]:
    """Validate consecutive slices together: `rows` holds their output (a slice's rows are those
    whose event time lies in it). Each slice gets the result, the checks and the Data Docs page
    `validate_slice` would give it, at the cost of one aggregation over `rows` for all of them
    (streamjoin.slice_profile), one read of the job's metrics and one Data Docs build: a slice
    that every expectation passes gets Great Expectations' result made from that aggregation; a
    slice that fails one, or whose suite has expectations the aggregation does not compute, is
    validated by Great Expectations over its own rows, as `validate_slice` does (docs/backfills.md)."""
    bounds = [(parse_instant(p.start, "slice start"), parse_instant(p.end, "slice end")) for p in pieces]
    batch = _Batch.open(spark, spec, rows, site, bounds)
    expectations = batch.suite["expectations"]
    found = profile(rows, spec.output.time, pieces, expectations, batch.parameters)
    results = []
    for k, observed in enumerate(found):
        known = [o for o in observed if o is not None]
        if _assembles(known, expectations):
            results.append(batch.assembled(k, known))
        elif known and not known[0].element_count:  # an empty slice, a suite not all profiled
            results.append(batch.validated(k, rows.where(F.lit(False))))
        else:
            time, (start, end) = F.col(f"`{spec.output.time}`"), batch.bounds[k]
            output = rows.where((time >= F.lit(spark_value(start))) & (time < F.lit(spark_value(end))))
            results.append(batch.validated(k, output))
    return batch.publish(results)


def _assembles(found: list[Observed], expectations: list[dict]) -> bool:
    """Whether a slice's result is made from what the aggregation `found`: every expectation was
    profiled and passed (an empty slice passes them all; `_numbers` words it as Great Expectations
    does)."""
    return len(found) == len(expectations) and all(
        o.passes(e) for o, e in zip(found, expectations, strict=True)
    )


@dataclass
class _Batch:
    """What validating one or more slices of a job shares: the suite, its checkpoint in one
    Great Expectations context, the slices' bounds and parameters, the job's link history read
    once, and the validations stored so far (their Data Docs are built once, `publish`)."""

    spark: SparkSession
    spec: JoinSpec
    suite: dict
    site: str
    context: Any
    checkpoint: Any
    bounds: list[tuple[datetime, datetime]]
    links: _LinkHistory | None
    stored: list[Any] = field(default_factory=list)
    pages: list[Any] = field(default_factory=list)  # each result's own validation, in order
    links_checkpoint: Any = None

    @classmethod
    def open(
        cls,
        spark: SparkSession,
        spec: JoinSpec,
        rows: DataFrame,
        site: str | None,
        bounds: list[tuple[datetime, datetime]],
    ) -> _Batch:
        """The suite loaded and checked against the rows' columns, the context and checkpoint made."""
        suite = load_suite(spec)
        _check_columns(suite, rows, suite_path(spec))
        site = site or default_site(spec)
        context = _context(site)
        checkpoint = _checkpoint(context, suite, suite_path(spec))
        links = _LinkHistory.read(spark, spec, bounds)
        return cls(spark, spec, suite, site, context, checkpoint, bounds, links)

    @property
    def parameters(self) -> list[dict[str, Any]]:
        """Each slice's suite parameters: its bounds."""
        return [{SLICE_START: spark_value(a), SLICE_END: spark_value(b)} for a, b in self.bounds]

    def run_id(self, k: int):
        from great_expectations.core.run_identifier import RunIdentifier

        start, end = self.bounds[k]
        return RunIdentifier(run_name=f"{start:%Y%m%dT%H%M%SZ}-{end:%Y%m%dT%H%M%SZ}")

    def validated(self, k: int, output: DataFrame) -> ValidationResult:
        """Slice k validated by Great Expectations over its rows `output`."""
        output.persist()
        try:
            result = self.checkpoint.run(
                batch_parameters={"dataframe": output},
                expectation_parameters=self.parameters[k],
                run_id=self.run_id(k),
            )
        finally:
            output.unpersist()
        identifier, validation = next(iter(result.run_results.items()))  # one definition, one result
        return self._judged(k, identifier, validation)

    def assembled(self, k: int, observed: list[Observed]) -> ValidationResult:
        """Slice k's result made from what each expectation found in it (all passed)."""
        identifier, validation = _result_of(
            self.suite, observed, self.parameters[k], self.run_id(k), "streamjoin"
        )
        return self._judged(k, identifier, validation)

    def _judged(self, k: int, identifier, validation) -> ValidationResult:
        """The slice's result: the suite's checks, then its links' (assumed rows, match rates)."""
        checks = [(bool(r.success), _describe(r)) for r in validation.results]
        self._store(identifier, validation)
        self.pages.append(identifier)
        evaluated = int(validation.statistics["evaluated_expectations"])
        this = self.links.this(self.bounds[k]) if self.links else None
        checks += _assumed_checks(self.spec, json.loads(this["by_link"])) if this else []
        judging = self.links and this and self.spec.meta.quality.link_history
        rates = self.links.rates(self.spec, self.bounds[k]) if judging and self.links else []
        if any(rate.floor is not None for rate in rates):
            judged = self._links_judged(k, rates)
            checks += [(ok, rate.line()) for ok, rate in zip(judged, rates, strict=True)]
            evaluated += 1
        else:
            checks += [(True, rate.line()) for rate in rates]
        return ValidationResult(
            suite=self.suite["name"],
            success=all(ok for ok, _ in checks),
            failed=tuple(line for ok, line in checks if not ok),
            evaluated=evaluated,
            docs=None,  # its page, once built (`publish`)
            checks=tuple(checks),
        )

    def _links_judged(self, k: int, rates: list[LinkRate]) -> list[bool]:
        """Per rate, whether it passed: Great Expectations' verdict over the judged links when one
        falls below its floor, else a result made from the rates (all at or above)."""
        judged = [r for r in rates if r.floor is not None]
        if self.links_checkpoint is None:
            self.links_checkpoint = _checkpoint(
                self.context,
                _links_suite(self.spec),
                Path("(derived from the job's metrics)"),
                "streamjoin_links",
            )
        if all(r.rate >= r.floor for r in judged if r.floor is not None):
            observed = [Observed(len(judged), 0, 0)]
            identifier, validation = _result_of(
                _links_suite(self.spec), observed, {}, self.run_id(k), "streamjoin_links"
            )
            self._store(identifier, validation)
            return [True] * len(rates)
        return _validate_links(self.spark, self.links_checkpoint, rates, self.run_id(k), self._store)

    def _store(self, identifier, validation) -> None:
        """Store the validation, every value taken from the data HTML-escaped (`_publish`)."""
        for item in validation.results:
            item.result = _escaped(item.result)
        self.context.validation_results_store.set(identifier, validation)
        self.stored.append(identifier)

    def publish(self, results: list[ValidationResult]) -> list[ValidationResult]:
        """Build the Data Docs pages of every validation stored, and the index, once; `results`
        (in the order they were made) with their pages."""
        _build_docs(self.context, self.stored, self.site)
        return [
            replace(result, docs=_page(self.context, identifier, self.site))
            for result, identifier in zip(results, self.pages, strict=True)
        ]


def _assumed_checks(spec: JoinSpec, links: list[dict]) -> list[tuple[bool, str]]:
    """Per link of the slice (`links`, its metrics' `by_link`) with rows looked up in its table's
    earliest known state (a backfill run with --assume-earliest-known), a check that fails unless
    `quality.allow_assumed`."""
    allowed = spec.meta.quality.allow_assumed
    return [
        (
            allowed,
            f"link {link['link']}: {link['assumed']} rows looked up in the table's earliest known state, "
            "before what it can serve (--assume-earliest-known)"
            + (
                "; allowed by quality.allow_assumed"
                if allowed
                else "; set quality.allow_assumed: true to accept them"
            ),
        )
        for link in links
        if link.get("assumed")
    ]


@dataclass(frozen=True)
class LinkRate:
    """One link of the job in one slice: its match rate and the floor it is judged against, from
    the job's recent slices (`link_rates`); `floor` None: not judged, `why_not` says why."""

    link: str
    reached: int
    matched: int
    baseline: float | None = None  # median match rate of the slices in `history`
    history: int = 0  # slices the baseline is the median of
    floor: float | None = None
    why_not: str = ""

    @property
    def rate(self) -> float:
        return self.matched / self.reached if self.reached else 1.0

    def line(self) -> str:
        what = f"link {self.link}: {self.matched} of {self.reached} rows matched ({self.rate:.1%})"
        if self.floor is None:
            return f"{what}; not judged: {self.why_not}"
        return (
            f"{what}, {'at or above' if self.rate >= self.floor else 'below'} the floor {self.floor:.1%} "
            f"(median {self.baseline:.1%} of the job's last {self.history} valid slices, less the tolerance)"
        )


def link_rates(spark: SparkSession, spec: JoinSpec, start: datetime, end: datetime) -> list[LinkRate]:
    """Each link's match rate in the slice [start, end) (matched of the rows it decided: `_decided`),
    from the job's metrics (the replay's row for the slice), with the floor it must reach: the
    median rate of the link in the job's last `quality.link_history` slices before it (replays of the same mode, each slice's latest, none
    recorded invalid or failed by a backfill, each with at least `link_min_rows` rows at the link),
    less `max(link_tolerance, three standard errors of a slice of this size at that rate)`. Judged
    once `link_min_history` such slices exist and the link reached `link_min_rows` rows here.
    Empty when the job has no metrics of the slice or `link_history` is 0."""
    if not spec.meta.quality.link_history:
        return []
    bounds = (parse_instant(start, "slice start"), parse_instant(end, "slice end"))
    history = _LinkHistory.read(spark, spec, [bounds])
    return history.rates(spec, bounds) if history and history.this(bounds) else []


@dataclass(frozen=True)
class _LinkHistory:
    """The job's replays that links are judged by, read once for consecutive slices: each slice's
    own metrics row (its latest replay: mode, `by_link`), and the earlier slices' rows that may be
    a baseline (same modes, with links, none recorded invalid or failed by a backfill), newest
    first; rows hold their bounds as UTC microseconds."""

    own: dict[tuple[int, int], dict]
    earlier: list[dict]

    @classmethod
    def read(
        cls, spark: SparkSession, spec: JoinSpec, bounds: list[tuple[datetime, datetime]]
    ) -> _LinkHistory | None:
        """From the job's metrics (None: none written, or written before runs counted links)."""
        metrics = spec.output.side("metrics")
        if not delta_io.exists(spark, metrics):
            return None
        table = delta_io.read_snapshot(spark, metrics)
        if "by_link" not in table.columns:
            return None
        first, last = spark_value(bounds[0][0]), spark_value(bounds[-1][1])
        latest = Window.partitionBy("slice_start", "slice_end").orderBy(F.col("started_at").desc())
        runs = (
            table.where((F.col("job") == spec.name) & (F.col("runner") == "replay"))
            .where(F.col("slice_end") <= F.lit(last))
            .withColumn("_attempt", F.row_number().over(latest))
            .where(F.col("_attempt") == 1)
            .select("slice_start", "slice_end", "mode", "by_link")
        )
        own = {
            (r["start"], r["end"]): r
            for r in map(_bounded, runs.where(F.col("slice_start") >= F.lit(first)).collect())
        }
        modes = sorted({r["mode"] for r in own.values()})
        before = runs.where(F.col("mode").isin(modes) & F.col("by_link").isNotNull())
        before = _valid(spark, spec, before.where(F.col("slice_end") <= F.lit(spark_value(bounds[-1][0]))))
        limit = 10 * spec.meta.quality.link_history + len(bounds)
        earlier = before.orderBy(F.col("slice_start").desc()).limit(limit).collect() if modes else []
        return cls(own, [_bounded(r) for r in earlier])

    def this(self, bounds: tuple[datetime, datetime]) -> dict | None:
        """The slice's own row, if its replay counted links."""
        row = self.own.get((to_micros(bounds[0]), to_micros(bounds[1])))
        return row if row and row["by_link"] else None

    def rates(self, spec: JoinSpec, bounds: tuple[datetime, datetime]) -> list[LinkRate]:
        """`link_rates` of the slice, judged by the rows before it."""
        this, start = self.this(bounds), to_micros(bounds[0])
        assert this is not None
        quality = spec.meta.quality
        earlier = [
            json.loads(r["by_link"]) for r in self.earlier if r["end"] <= start and r["mode"] == this["mode"]
        ][: 10 * quality.link_history]
        return [_rate(quality, link, earlier) for link in json.loads(this["by_link"])]


def _bounded(row: Row) -> dict:
    """A metrics row with its bounds as UTC microseconds."""
    values = row.asDict()
    values["start"], values["end"] = (to_micros(from_spark(row[c])) for c in ("slice_start", "slice_end"))
    return values


def _valid(spark: SparkSession, spec: JoinSpec, runs: DataFrame) -> DataFrame:
    """`runs` less the slices a backfill found invalid or could not run (their latest attempt)."""
    record = spec.output.side("backfill")
    if not delta_io.exists(spark, record):
        return runs
    last = Window.partitionBy("slice_start", "slice_end").orderBy(F.col("finished_at").desc())
    refused = (
        delta_io.read_snapshot(spark, record)
        .withColumn("_attempt", F.row_number().over(last))
        .where((F.col("_attempt") == 1) & (F.col("status") != "succeeded"))
        .select("slice_start", "slice_end")
    )
    return runs.join(refused, ["slice_start", "slice_end"], "left_anti")


def _rate(quality: Quality, link: dict, earlier: list[list[dict]]) -> LinkRate:
    """One link of the slice (`by_link`'s entry), judged by the earlier slices' links."""
    reached, matched = _decided(link), int(link["matched"])
    past = [
        p["matched"] / _decided(p)
        for links in earlier
        for p in links
        if p["link"] == link["link"] and _decided(p) >= max(quality.link_min_rows, 1)
    ][: quality.link_history]
    rate = LinkRate(link["link"], reached, matched, history=len(past))
    if reached < max(quality.link_min_rows, 1):
        return replace(rate, why_not=f"{reached} rows reached it, fewer than {quality.link_min_rows}")
    if len(past) < max(quality.link_min_history, 1):
        return replace(
            rate, why_not=f"{len(past)} earlier valid slice(s) known, {quality.link_min_history} needed"
        )
    baseline = statistics.median(past)
    noise = 3 * math.sqrt(baseline * (1 - baseline) / reached)
    return replace(rate, baseline=baseline, floor=baseline - max(quality.link_tolerance, noise))


def _decided(link: dict) -> int:
    """The rows a link decided (matched, padded or dropped): those it reached, less the ones looked
    up in a table's earliest known state (`assumed`), which say nothing of its match rate."""
    return int(link["reached"]) - int(link.get("assumed") or 0)


def _links_suite(spec: JoinSpec) -> dict:
    """The derived suite a slice's judged links are validated by: each match rate at or above its floor."""
    return {
        "name": f"{spec.name}_links",
        "expectations": [
            _expectation(
                "expect_column_pair_values_a_to_be_greater_than_b",
                {"column_A": "match_rate", "column_B": "floor", "or_equal": True},
                "no link's match rate falls below its recent slices' (quality.link_history, link_tolerance)",
            )
        ],
    }


def _validate_links(spark: SparkSession, checkpoint, rates: list[LinkRate], run, store) -> list[bool]:
    """Great Expectations' verdict on the judged links (`_links_suite`), its result handed to
    `store` (it gets its own Data Docs page); per rate, whether it passed (True for a link not judged)."""
    from streamjoin.frames import local_frame

    judged = [r for r in rates if r.floor is not None]
    frame = local_frame(
        spark,
        [(r.link, r.reached, r.matched, r.rate, r.floor) for r in judged],
        "link string, reached long, matched long, match_rate double, floor double",
    )
    result = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=run)
    identifier, validation = next(iter(result.run_results.items()))
    store(identifier, validation)
    below = {r.link for r in judged if r.floor is not None and r.rate < r.floor}
    if not validation.success and not below:  # GE found what the rates did not: fail them all
        below = {r.link for r in judged}
    return [r.link not in below for r in rates]


def _check_columns(suite: dict, output: DataFrame, path: Path) -> None:
    present = set(output.columns)
    for item in suite["expectations"]:
        kwargs = item["kwargs"]
        named = [kwargs[a] for a in _COLUMN_ARGUMENTS if isinstance(kwargs.get(a), str)] + list(
            kwargs.get("column_list") or []
        )
        missing = [c for c in named if c not in present]
        if missing:
            raise JobError(
                f"suite {suite['name']!r}: {item['type']} checks column(s) {', '.join(missing)}, which the output lacks "
                f"(output columns: {', '.join(output.columns)}); fix output.key / quality in the job, or edit {str(path)!r}"
            )


def _context(site: str):
    """An ephemeral GE context whose validation results and Data Docs persist beside `site`."""
    # Quiet before the first import: GE logs its registrations at INFO while importing (hundreds
    # of lines in an Airflow task log); problems reach the caller as results or JobError.
    logging.getLogger("great_expectations").setLevel(logging.CRITICAL)
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    defaults = InMemoryStoreBackendDefaults()
    stores = dict(defaults.stores)
    stores[defaults.validation_results_store_name] = {
        "class_name": "ValidationResultsStore",
        "store_backend": {
            "class_name": "TupleFilesystemStoreBackend",
            "base_directory": str(Path(site).parent / "validations"),
        },
    }
    sites = {
        _SITE: {
            "class_name": "SiteBuilder",
            "show_how_to_buttons": False,
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": site},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        }
    }
    config = DataContextConfig(
        store_backend_defaults=defaults,
        stores=stores,
        data_docs_sites=sites,
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
    )
    return gx.get_context(mode="ephemeral", project_config=config)


def _checkpoint(context, suite: dict, path: Path, source: str = "streamjoin"):
    """A checkpoint that validates a Spark DataFrame against `suite` (its result is stored); each
    suite of one context needs its own data `source` name."""
    import great_expectations as gx
    from great_expectations.core.expectation_suite import ExpectationSuite
    from great_expectations.exceptions import GreatExpectationsError

    for number, item in enumerate(suite["expectations"], 1):
        try:
            accepted = len(ExpectationSuite(name=suite["name"], expectations=[item]).expectations)
        except (TypeError, ValueError, GreatExpectationsError) as exc:
            raise JobError(
                f"suite {str(path)!r}: expectation {number} ({item['type']}) is not valid: {exc}"
            ) from None
        if not accepted:  # GE drops an expectation of an unknown type with only a log line
            raise JobError(
                f"suite {str(path)!r}: expectation {number} has unknown type {item['type']!r}; see the Great "
                "Expectations gallery for the names, e.g. expect_column_values_to_not_be_null"
            )
    expectation_suite = ExpectationSuite(**suite)
    batch = (
        context.data_sources.add_spark(name=source)
        .add_dataframe_asset(name="slice")
        .add_batch_definition_whole_dataframe("output")
    )
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=suite["name"], data=batch, suite=context.suites.add(expectation_suite))
    )
    return context.checkpoints.add(
        gx.Checkpoint(
            name=suite["name"],
            validation_definitions=[definition],
            actions=[],  # Data Docs are built after the values are escaped (`_publish`)
            result_format="SUMMARY",
        )
    )


def _build_docs(context, identifiers: list, site: str) -> None:
    """Build the Data Docs pages of the stored validations `identifiers` (their values were
    HTML-escaped as stored: Great Expectations writes some of them, the unexpected values of a
    failed expectation, into its pages as they are, so a value such as `<script>...</script>` in
    the output would run in the reader's browser), and the index; then point them at the site's
    own copies of their styles and scripts (`streamjoin.datadocs`)."""
    context.build_data_docs(site_names=[_SITE], resource_identifiers=identifiers)
    pages = {Path(site) / "index.html"}
    pages |= {
        Path(_page(context, identifier, site) or Path(site) / "index.html") for identifier in identifiers
    }
    if not datadocs.localize(site, sorted(p for p in pages if p.is_file())):
        warnings.warn(
            "Data Docs pages load their styles and scripts from public CDNs and show empty or unstyled "
            "offline: run `streamjoin setup-docs-assets` once to serve them from the site",
            stacklevel=2,
        )


def _result_of(suite: dict, observed: list[Observed], parameters: dict[str, Any], run, source: str):
    """Great Expectations' result of `suite` over a slice whose expectations all passed with the
    numbers `observed` (streamjoin.slice_profile), as its checkpoint stores it: its identifier and
    the validation result, ready for the store and Data Docs."""
    from great_expectations.core.expectation_validation_result import (
        ExpectationSuiteValidationResult,
        ExpectationValidationResult,
    )
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    batch_id = f"{source}-slice"
    results = [
        ExpectationValidationResult(
            success=True,
            expectation_config=ExpectationConfiguration(
                type=item["type"],
                kwargs={"batch_id": batch_id, **_bound_kwargs(item["kwargs"], parameters)},
                notes=item.get("notes"),
            ),
            result=_numbers(item["type"], found),
            exception_info={
                "raised_exception": False,
                "exception_traceback": None,
                "exception_message": None,
            },
        )
        for item, found in zip(suite["expectations"], observed, strict=True)
    ]
    count = len(results)
    validation = ExpectationSuiteValidationResult(
        success=True,
        results=results,
        suite_name=suite["name"],
        suite_parameters=parameters,
        statistics={
            "evaluated_expectations": count,
            "successful_expectations": count,
            "unsuccessful_expectations": 0,
            "success_percent": 100.0 if count else None,
        },
        meta={
            "great_expectations_version": _ge_version(),
            "batch_spec": {"batch_data": "SparkDataFrame"},
            "active_batch_definition": {
                "datasource_name": source,
                "data_connector_name": "fluent",
                "data_asset_name": "slice",
                "batch_identifiers": {"dataframe": "<DATAFRAME>"},
            },
            "run_id": run,
            "validation_time": run.run_time,
        },
        batch_id=batch_id,
    )
    identifier = ValidationResultIdentifier(ExpectationSuiteIdentifier(suite["name"]), run, batch_id)
    return identifier, validation


def _ge_version() -> str:
    import great_expectations as gx

    return gx.__version__


def _bound_kwargs(kwargs: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """The expectation's arguments with each suite parameter replaced by its value."""
    return {
        name: parameters[value["$PARAMETER"]] if isinstance(value, dict) and "$PARAMETER" in value else value
        for name, value in kwargs.items()
    }


# Over no rows, Great Expectations 1 reports no count of unexpected values (None) for these
# expectations, and 0 for the uniqueness ones (tests/test_validation.py compares the two).
_UNCOUNTED_WHEN_EMPTY = {NOT_NULL, BETWEEN}


def _numbers(kind: str, found: Observed) -> dict[str, Any]:
    """The `result` Great Expectations reports for an expectation of type `kind` that passed with
    the numbers `found` (a NULL is the only value a not-NULL expectation may find unexpected)."""
    rows, missing, unexpected = found.element_count, found.missing_count, found.unexpected_count
    nulls = [None] * min(unexpected, 20)
    counted = None if not rows and kind in _UNCOUNTED_WHEN_EMPTY else unexpected
    if kind == NOT_NULL:
        return {
            "element_count": rows,
            "unexpected_count": counted,
            "unexpected_percent": _percent(unexpected, rows),
            "partial_unexpected_list": nulls,
            "partial_unexpected_counts": [{"value": None, "count": unexpected}] if unexpected else [],
        }
    if kind not in PROFILED:  # the links' derived suite: a column pair, no missing values
        return {
            "element_count": rows,
            "unexpected_count": 0,
            "unexpected_percent": _percent(0, rows),
            "partial_unexpected_list": [],
            "missing_count": 0,
            "missing_percent": _percent(0, rows),
            "unexpected_percent_total": _percent(0, rows),
            "unexpected_percent_nonmissing": _percent(0, rows),
            "partial_unexpected_counts": [],
        }
    return {
        "element_count": rows,
        "unexpected_count": counted,
        "unexpected_percent": _percent(unexpected, rows - missing),
        "partial_unexpected_list": [],
        "missing_count": missing,
        "missing_percent": _percent(missing, rows),
        "unexpected_percent_total": _percent(unexpected, rows),
        "unexpected_percent_nonmissing": _percent(unexpected, rows - missing),
        "partial_unexpected_counts": [],
    }


def _percent(part: int, whole: int) -> float | None:
    return 100.0 * part / whole if whole else None


def _escaped(value: Any) -> Any:
    """`value` with every string in it HTML-escaped (dicts and lists walked)."""
    if isinstance(value, str):
        return html.escape(value, quote=True)
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_escaped(v) for v in value)
    return value


def _page(context, identifier, site: str) -> str | None:
    """The local path of this validation's Data Docs page, else the site index, if built."""
    urls = context.get_docs_sites_urls(resource_identifier=identifier, site_name=_SITE)
    url = urls[0].get("site_url") if urls else None
    if url and url.startswith("file://"):
        return url[len("file://") :]
    index = Path(site) / "index.html"
    return str(index) if index.exists() else None


def _describe(result) -> str:
    """One line for an evaluated expectation: its type, column(s) and settings, then what was observed."""
    config = result.expectation_config
    kwargs = config.kwargs
    columns = (
        kwargs.get("column")
        or ", ".join(kwargs.get("column_list") or [])
        or ", ".join(str(kwargs[a]) for a in _COLUMN_ARGUMENTS if a in kwargs)
    )
    settings = [f"{k}={_show(v)}" for k, v in kwargs.items() if k not in _QUIET_KWARGS]
    what = f"{config.type}({', '.join([columns, *settings]) if columns else ', '.join(settings)})"
    info = result.exception_info or {}
    if info.get("raised_exception"):
        return f"{what}: could not be evaluated: {info.get('exception_message')}"
    observed = result.result or {}
    if observed.get("unexpected_count") is not None:
        count, total = observed["unexpected_count"], observed.get("element_count")
        share = (
            f" ({observed['unexpected_percent']:.1f}%)"
            if observed.get("unexpected_percent") is not None
            else ""
        )
        examples = ", ".join(_show(e["value"]) for e in (observed.get("partial_unexpected_counts") or [])[:3])
        line = f"{what}: {count} of {total} rows {_UNEXPECTED.get(config.type, 'unexpected')}{share}"
        if kwargs.get("mostly") is not None:
            line += f", at most {1 - kwargs['mostly']:.1%} allowed"
        return line + (
            f", e.g. {examples}" if examples and config.type != "expect_column_values_to_not_be_null" else ""
        )
    return f"{what}: observed {_show(observed.get('observed_value'))}"


def _show(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    return repr(value) if isinstance(value, str) else str(value)
