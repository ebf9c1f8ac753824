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
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F

from streamjoin import datadocs, delta_io
from streamjoin.errors import JobError
from streamjoin.jars import checkout
from streamjoin.metrics import spark_value
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import parse_instant

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
    against its recent slices (`link_rates`) when the slice's replay wrote its metrics.
    """
    suite = load_suite(spec)
    _check_columns(suite, output, suite_path(spec))
    site = site or default_site(spec)
    start, end = parse_instant(start, "slice start"), parse_instant(end, "slice end")
    context = _context(site)
    checkpoint = _checkpoint(context, suite, suite_path(spec))
    from great_expectations.core.run_identifier import RunIdentifier

    run = RunIdentifier(run_name=f"{start:%Y%m%dT%H%M%SZ}-{end:%Y%m%dT%H%M%SZ}")
    output.persist()
    try:
        result = checkpoint.run(
            batch_parameters={"dataframe": output},
            expectation_parameters={SLICE_START: spark_value(start), SLICE_END: spark_value(end)},
            run_id=run,
        )
    finally:
        output.unpersist()
    identifier, validation = next(iter(result.run_results.items()))  # one validation definition, one result
    checks = [(bool(r.success), _describe(r)) for r in validation.results]
    _publish(context, identifier, validation, site)
    evaluated = int(validation.statistics["evaluated_expectations"])
    found = _slice_runs(spark, spec, start, end)  # read once: the assumed rows and the link rates
    checks += _assumed_checks(spec, json.loads(found[1]["by_link"])) if found else []
    rates = _rates(spark, spec, found[0], found[1], start) if found and spec.meta.quality.link_history else []
    if any(rate.floor is not None for rate in rates):
        judged = _validate_links(spark, context, spec, rates, run, site)
        checks += [(ok, rate.line()) for ok, rate in zip(judged, rates, strict=True)]
        evaluated += 1
    else:
        checks += [(True, rate.line()) for rate in rates]
    return ValidationResult(
        suite=suite["name"],
        success=all(ok for ok, _ in checks),
        failed=tuple(line for ok, line in checks if not ok),
        evaluated=evaluated,
        docs=_page(context, identifier, site),
        checks=tuple(checks),
    )


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
    found = _slice_runs(spark, spec, start, end)
    if found is None:
        return []
    return _rates(spark, spec, found[0], found[1], parse_instant(start, "slice start"))


def _slice_runs(
    spark: SparkSession, spec: JoinSpec, start: datetime, end: datetime
) -> tuple[DataFrame, Row] | None:
    """The job's replays of slices ending by `end` (each slice's latest run) and this slice's row
    (its mode and `by_link`); None when the metrics hold no links for the slice."""
    metrics = spec.output.side("metrics")
    if not delta_io.exists(spark, metrics):
        return None
    start, end = parse_instant(start, "slice start"), parse_instant(end, "slice end")
    latest = Window.partitionBy("slice_start", "slice_end").orderBy(F.col("started_at").desc())
    table = delta_io.read_snapshot(spark, metrics)
    if "by_link" not in table.columns:  # written before runs counted links: nothing to judge by
        return None
    runs = (
        table.where((F.col("job") == spec.name) & (F.col("runner") == "replay"))
        .where(F.col("slice_end") <= F.lit(spark_value(end)))
        .withColumn("_attempt", F.row_number().over(latest))
        .where(F.col("_attempt") == 1)
    )
    here = (F.col("slice_start") == F.lit(spark_value(start))) & (
        F.col("slice_end") == F.lit(spark_value(end))
    )
    this = runs.where(here).select("mode", "by_link").first()
    if this is None or not this["by_link"]:
        return None
    return runs, this


def _rates(
    spark: SparkSession, spec: JoinSpec, runs: DataFrame, this: Row, start: datetime
) -> list[LinkRate]:
    """`link_rates` from the job's replays (`_slice_runs`) and this slice's row."""
    quality = spec.meta.quality
    before = runs.where(
        (F.col("slice_end") <= F.lit(spark_value(start)))
        & (F.col("mode") == this["mode"])
        & F.col("by_link").isNotNull()
    )
    record = spec.output.side("backfill")
    if delta_io.exists(spark, record):  # slices a backfill found invalid (or could not run) are no baseline
        last = Window.partitionBy("slice_start", "slice_end").orderBy(F.col("finished_at").desc())
        refused = (
            delta_io.read_snapshot(spark, record)
            .withColumn("_attempt", F.row_number().over(last))
            .where((F.col("_attempt") == 1) & (F.col("status") != "succeeded"))
            .select("slice_start", "slice_end")
        )
        before = before.join(refused, ["slice_start", "slice_end"], "left_anti")
    earlier = [
        json.loads(r["by_link"])
        for r in before.orderBy(F.col("slice_start").desc())
        .select("by_link")
        .limit(10 * quality.link_history)
        .collect()
    ]
    rates = []
    for link in json.loads(this["by_link"]):
        reached, matched = _decided(link), int(link["matched"])
        past = [
            p["matched"] / _decided(p)
            for links in earlier
            for p in links
            if p["link"] == link["link"] and _decided(p) >= max(quality.link_min_rows, 1)
        ][: quality.link_history]
        rate = LinkRate(link["link"], reached, matched, history=len(past))
        if reached < max(quality.link_min_rows, 1):
            rates.append(
                replace(rate, why_not=f"{reached} rows reached it, fewer than {quality.link_min_rows}")
            )
        elif len(past) < max(quality.link_min_history, 1):
            rates.append(
                replace(
                    rate,
                    why_not=f"{len(past)} earlier valid slice(s) known, {quality.link_min_history} needed",
                )
            )
        else:
            baseline = statistics.median(past)
            noise = 3 * math.sqrt(baseline * (1 - baseline) / reached)
            rates.append(
                replace(rate, baseline=baseline, floor=baseline - max(quality.link_tolerance, noise))
            )
    return rates


def _decided(link: dict) -> int:
    """The rows a link decided (matched, padded or dropped): those it reached, less the ones looked
    up in a table's earliest known state (`assumed`), which say nothing of its match rate."""
    return int(link["reached"]) - int(link.get("assumed") or 0)


def _validate_links(
    spark: SparkSession, context, spec: JoinSpec, rates: list[LinkRate], run, site: str
) -> list[bool]:
    """Great Expectations' verdict on the judged links (`expect_column_pair_values_a_to_be_greater_than_b`:
    each link's match rate at or above its floor), stored with its own Data Docs page; per rate,
    whether it passed (True for a link not judged)."""
    from streamjoin.frames import local_frame

    judged = [r for r in rates if r.floor is not None]
    frame = local_frame(
        spark,
        [(r.link, r.reached, r.matched, r.rate, r.floor) for r in judged],
        "link string, reached long, matched long, match_rate double, floor double",
    )
    suite = {
        "name": f"{spec.name}_links",
        "expectations": [
            _expectation(
                "expect_column_pair_values_a_to_be_greater_than_b",
                {"column_A": "match_rate", "column_B": "floor", "or_equal": True},
                "no link's match rate falls below its recent slices' (quality.link_history, link_tolerance)",
            )
        ],
    }
    checkpoint = _checkpoint(
        context, suite, Path("(derived from the job's metrics)"), source="streamjoin_links"
    )
    result = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=run)
    identifier, validation = next(iter(result.run_results.items()))
    _publish(context, identifier, validation, site)
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


def _publish(context, identifier, validation, site: str) -> None:
    """Store the validation with every value taken from the data HTML-escaped, then build its Data
    Docs page and point it and the index at the site's own copies of their styles and scripts
    (`streamjoin.datadocs`). Great Expectations writes some of those values (the unexpected values
    of a failed expectation) into its pages as they are, so a value such as `<script>...</script>`
    in the output would run in the reader's browser."""
    for item in validation.results:
        item.result = _escaped(item.result)
    context.validation_results_store.set(identifier, validation)
    context.build_data_docs(site_names=[_SITE], resource_identifiers=[identifier])
    pages = {Path(site) / "index.html", Path(_page(context, identifier, site) or Path(site) / "index.html")}
    if not datadocs.localize(site, sorted(p for p in pages if p.is_file())):
        warnings.warn(
            "Data Docs pages load their styles and scripts from public CDNs and show empty or unstyled "
            "offline: run `streamjoin setup-docs-assets` once to serve them from the site",
            stacklevel=2,
        )


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
