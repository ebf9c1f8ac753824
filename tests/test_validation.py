"""Per-slice validation: real Great Expectations runs over Spark DataFrames, Data Docs on disk."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pendulum
import pytest
from pyspark.sql.types import (
    DoubleType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamjoin.arrival import Slice
from streamjoin.demo import JOBS_DIR, demo_job
from streamjoin.errors import JobError
from streamjoin.jobfile import job_files
from streamjoin.runners.options import RunOptions
from streamjoin.session import PROJECT_ROOT
from streamjoin.spec import Output, Quality, spec_from_dict
from streamjoin.validation import load_suite, suite_for, suites_folder, validate_slice

START, END = datetime(2024, 5, 1), datetime(2024, 5, 2)
OUTPUT = StructType(
    [
        StructField("order_id", StringType()),
        StructField("customer_id", StringType()),
        StructField("payment_id", StringType()),
        StructField("paid_amount", DoubleType()),
        StructField("event_time", TimestampType()),
    ]
)


def shop_job(tmp_path, **output_and_quality):
    """A LEFT interval join of orders with payments, its output key and quality as the demo job declares them."""
    spec = spec_from_dict(
        {
            "name": "shop_orders",
            "sources": {
                "orders": {"path": "orders", "time": "order_time"},
                "payments": {"path": "payments", "time": "paid_at"},
            },
            "from": "orders",
            "joins": [
                {
                    "join": "payments",
                    "type": "left",
                    "on": "orders.order_id = payments.order_id",
                    "within": "1h",
                }
            ],
            "select": [
                "orders.order_id",
                "orders.customer_id",
                "payments.payment_id",
                "payments.amount AS paid_amount",
            ],
            "output": {"path": str(tmp_path / "out" / "shop_orders"), "key": ["order_id"]},
            "quality": {
                "match_column": "payment_id",
                "min_match_rate": 0.75,
                "not_null": ["order_id", "customer_id"],
            },
        }
    )
    quality = output_and_quality.pop("quality", spec.meta.quality)
    return replace(spec, **output_and_quality, meta=replace(spec.meta, quality=quality))


def good_rows() -> list[tuple]:
    """Four orders of the slice, three of them paid: a match rate of 0.75, just enough."""
    return [
        ("o1", "c1", "p1", 10.0, datetime(2024, 5, 1, 0, 0)),
        ("o2", "c2", "p2", 20.0, datetime(2024, 5, 1, 9, 30)),
        ("o3", "c1", "p3", 30.0, datetime(2024, 5, 1, 17, 0)),
        ("o4", "c3", None, None, datetime(2024, 5, 1, 23, 59, 59)),
    ]


def test_a_valid_slice_passes_and_its_data_docs_page_names_the_suite(spark, tmp_path):
    spec = shop_job(tmp_path)
    result = validate_slice(spark, spec, spark.createDataFrame(good_rows(), OUTPUT), START, END)

    assert result.success and result.failed == ()
    assert result.suite == "shop_orders"
    assert result.evaluated == len(suite_for(spec)["expectations"]) == 6
    page = Path(result.docs)
    assert page.is_file() and page.suffix == ".html"
    assert page.is_relative_to(tmp_path / "out" / "shop_orders_quality" / "data_docs")  # the default site
    assert "shop_orders" in page.read_text()
    assert "20240501T000000Z-20240502T000000Z" in str(page)  # the page is the slice's own
    index = (tmp_path / "out" / "shop_orders_quality" / "data_docs" / "index.html").read_text()
    assert "shop_orders" in index
    assert not (Path.cwd() / "gx").exists() and not (PROJECT_ROOT / "gx").exists()


BROKEN = {
    # name: (change to the good rows, job change, expectation, column(s), observed text)
    "null key": (
        lambda rows: rows[:1] + [(None, "c2", "p2", 20.0, rows[1][4])] + rows[2:],
        {},
        "expect_column_values_to_not_be_null",
        "order_id",
        "1 of 4 rows NULL",
    ),
    "duplicate key": (
        lambda rows: rows + [("o2", "c9", "p9", 90.0, datetime(2024, 5, 1, 10))],
        {},
        "expect_column_values_to_be_unique",
        "order_id",
        "2 of 5 rows duplicated",
    ),
    "duplicate compound key": (
        lambda rows: rows + [("o2", "c2", "p9", 90.0, datetime(2024, 5, 1, 10))],
        {"key": ("order_id", "customer_id")},
        "expect_compound_columns_to_be_unique",
        "order_id, customer_id",
        "2 of 5 rows duplicated",
    ),
    "time outside the slice": (
        lambda rows: rows[:3] + [rows[3][:4] + (END,)],
        {},
        "expect_column_values_to_be_between",
        "event_time",
        "1 of 4 rows outside the range",
    ),
    "match rate below threshold": (
        lambda rows: rows[:2] + [("o3", "c1", None, None, rows[2][4])] + rows[3:],
        {},
        "expect_column_values_to_not_be_null",
        "payment_id, mostly=0.75",
        "2 of 4 rows NULL (50.0%)",
    ),
    "null in a not_null column": (
        lambda rows: [rows[0][:1] + (None,) + rows[0][2:]] + rows[1:],
        {},
        "expect_column_values_to_not_be_null",
        "customer_id",
        "1 of 4 rows NULL",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_each_broken_expectation_fails_with_a_message_naming_it_and_its_column(spark, tmp_path, case):
    change_rows, key_change, expectation, columns, observed = BROKEN[case]
    spec = shop_job(tmp_path)
    if key_change:
        spec = replace(spec, output=replace(spec.output, **key_change))
    site = tmp_path / "site"
    result = validate_slice(
        spark, spec, spark.createDataFrame(change_rows(good_rows()), OUTPUT), START, END, str(site)
    )

    assert not result.success
    assert len(result.failed) == 1, result.failed
    line = result.failed[0]
    assert line.startswith(f"{expectation}({columns}"), line
    assert observed in line, line
    assert Path(result.docs).is_file() and Path(result.docs).is_relative_to(
        site
    )  # failures get their page too


def test_the_time_range_message_shows_the_slice_bounds(spark, tmp_path):
    """Bounds with a time zone are instants: [01:00+02:00, next day 01:00+02:00) is [23:00, 23:00) UTC."""
    rows = [
        ("o1", "c1", "p1", 1.0, datetime(2024, 4, 30, 23, 30)),
        ("o2", "c1", "p2", 1.0, datetime(2024, 4, 30, 22, 59)),
    ]
    result = validate_slice(
        spark,
        shop_job(tmp_path, quality=Quality()),
        spark.createDataFrame(rows, OUTPUT),
        pendulum.datetime(2024, 5, 1, 1, tz="Europe/Berlin"),
        pendulum.datetime(2024, 5, 2, 1, tz="Europe/Berlin"),
        str(tmp_path / "site"),
    )

    assert result.failed == (
        (
            "expect_column_values_to_be_between(event_time, min_value=2024-04-30T23:00:00+00:00, "
            "max_value=2024-05-01T23:00:00+00:00, strict_max=True): 1 of 2 rows outside the range (50.0%), "
            "e.g. 2024-04-30T22:59:00"
        ),
    )


def test_an_empty_slice_is_valid(spark, tmp_path):
    result = validate_slice(
        spark, shop_job(tmp_path), spark.createDataFrame([], OUTPUT), START, END, str(tmp_path / "site")
    )
    assert result.success and result.failed == () and result.evaluated == 6


def test_a_column_the_output_lacks_is_a_job_error_naming_it(spark, tmp_path):
    spec = shop_job(tmp_path, quality=Quality(not_null=("customer_id", "customer_name")))
    with pytest.raises(JobError, match=r"customer_name, which the output lacks .*fix output.key / quality"):
        validate_slice(
            spark, spec, spark.createDataFrame(good_rows(), OUTPUT), START, END, str(tmp_path / "site")
        )


def test_a_job_writing_to_a_table_needs_a_site(spark, tmp_path):
    spec = shop_job(tmp_path, output=Output(table="shop_orders", key=("order_id",)))
    with pytest.raises(JobError, match="pass a site folder"):
        validate_slice(spark, spec, spark.createDataFrame(good_rows(), OUTPUT), START, END)


# ---------------------------------------------------------------- suites, no Spark session


@pytest.mark.parametrize("job", [p.stem for p in job_files(JOBS_DIR)])
def test_the_committed_suites_match_the_jobs(job):
    """Each suite starts with exactly the expectations its job derives; hand-written ones may follow."""
    spec = demo_job(job, "data/demo")
    committed, derived = load_suite(spec), suite_for(spec)
    assert committed == json.loads(
        (suites_folder() / f"{job}.json").read_text()
    )  # the file, not the fallback
    assert committed["name"] == derived["name"] == job
    assert committed["expectations"][: len(derived["expectations"])] == derived["expectations"], (
        f"expectations/{job}.json drifted from its job in jobs/; regenerate it (docs/validation.md)"
    )


def test_the_derived_suite_checks_key_quality_and_slice_bounds(tmp_path):
    suite = suite_for(shop_job(tmp_path, output=Output(path="out", key=("order_id", "customer_id"))))
    checks = [(e["type"], e["kwargs"]) for e in suite["expectations"]]
    assert checks == [
        ("expect_column_values_to_not_be_null", {"column": "event_time"}),
        (
            "expect_column_values_to_be_between",
            {
                "column": "event_time",
                "min_value": {"$PARAMETER": "slice_start"},
                "max_value": {"$PARAMETER": "slice_end"},
                "strict_max": True,
            },
        ),
        ("expect_column_values_to_not_be_null", {"column": "order_id"}),
        ("expect_column_values_to_not_be_null", {"column": "customer_id"}),
        ("expect_compound_columns_to_be_unique", {"column_list": ["order_id", "customer_id"]}),
        ("expect_column_values_to_not_be_null", {"column": "payment_id", "mostly": 0.75}),
    ]


def test_an_edited_suite_file_is_used_and_a_broken_one_is_refused(tmp_path):
    spec = shop_job(tmp_path)
    edited = {
        "name": "shop_orders",
        "expectations": [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "order_id"}}],
    }
    (tmp_path / "shop_orders.json").write_text(json.dumps(edited))
    assert load_suite(spec, str(tmp_path)) == edited
    assert load_suite(spec, str(tmp_path / "none")) == suite_for(spec)

    (tmp_path / "shop_orders.json").write_text(json.dumps({**edited, "name": "other"}))
    with pytest.raises(JobError, match="named 'other'; name it 'shop_orders'"):
        load_suite(spec, str(tmp_path))
    (tmp_path / "shop_orders.json").write_text('{"name": "shop_orders", "expectations": [{"kwargs": {}}]}')
    with pytest.raises(JobError, match="expectation 1 needs 'type'"):
        load_suite(spec, str(tmp_path))
    (tmp_path / "shop_orders.json").write_text("{not json")
    with pytest.raises(JobError, match="not valid JSON"):
        load_suite(spec, str(tmp_path))


def test_importing_the_module_does_not_import_great_expectations():
    code = "import sys, streamjoin.validation; sys.exit('great_expectations' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False, cwd=PROJECT_ROOT).returncode == 0


def test_an_expectation_of_unknown_type_in_an_edited_suite_is_a_job_error(spark, tmp_path, monkeypatch):
    """GE itself only logs such an expectation and drops it: the slice would pass unchecked."""
    monkeypatch.setenv("STREAMJOIN_EXPECTATIONS", str(tmp_path))  # where an edited suite is read
    typo = {
        "name": "shop_orders",
        "expectations": [{"type": "expect_column_values_to_be_not_null", "kwargs": {"column": "order_id"}}],
    }
    (tmp_path / "shop_orders.json").write_text(json.dumps(typo))
    with pytest.raises(
        JobError, match="expectation 1 has unknown type 'expect_column_values_to_be_not_null'"
    ):
        validate_slice(
            spark,
            shop_job(tmp_path),
            spark.createDataFrame(good_rows(), OUTPUT),
            START,
            END,
            str(tmp_path / "site"),
        )


def test_values_from_the_data_reach_the_data_docs_page_as_text(spark, tmp_path, browser):
    """A key value that is HTML (here a script) and breaks the uniqueness expectation: the Data Docs
    page shows it as text, in a real browser, and the script never runs."""
    payload = "<script>document.title='xss-data'</script>"
    rows = good_rows() + [
        (payload, "c8", "p8", 80.0, datetime(2024, 5, 1, 11)),
        (payload, "c9", "p9", 90.0, datetime(2024, 5, 1, 12)),
    ]
    result = validate_slice(spark, shop_job(tmp_path), spark.createDataFrame(rows, OUTPUT), START, END)
    assert not result.success and any(payload in line for line in result.failed)  # our own message: raw text
    page = Path(result.docs)
    assert payload not in page.read_text()
    browser.get(page.as_uri())
    assert browser.title != "xss-data"
    shown = browser.find_element("tag name", "body").text
    assert "document.title='xss-data'" in shown  # the value is there, to be read


CDN = re.compile(r'(?:src|href)="(https?://[^"]+)"')


def test_data_docs_serve_their_styles_and_scripts_from_the_site_and_work_offline(spark, tmp_path, browser):
    """Issue 81, item 8: Great Expectations' pages load Bootstrap, jQuery and bootstrap-table from
    CDNs; this machine reaches none, as a user's air-gapped one. The index and the slice's page
    point at the site's own copies (fetched by set-up), so the index lists the validation and the
    pages are styled, in a real browser."""
    result = validate_slice(spark, shop_job(tmp_path), spark.createDataFrame(good_rows(), OUTPUT), START, END)
    site = tmp_path / "out" / "shop_orders_quality" / "data_docs"
    for page in (site / "index.html", Path(result.docs)):
        loaded = [
            url for url in CDN.findall(page.read_text()) if url.endswith((".js", ".css")) or "npm/" in url
        ]
        assert loaded == [], f"{page.name} still loads {loaded}"
    browser.get((site / "index.html").as_uri())
    assert browser.execute_script(
        "return typeof jQuery === 'function' && typeof jQuery.fn.bootstrapTable === 'function'"
    )
    assert (
        "shop_orders" in browser.find_element("tag name", "body").text
    )  # the table, filled by bootstrap-table
    shot = PROJECT_ROOT / "build" / "screenshots" / "data_docs_index_offline.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot))
    browser.get(Path(result.docs).as_uri())
    font = browser.execute_script("return getComputedStyle(document.body).fontFamily")
    assert "apple-system" in font or "Segoe UI" in font  # Bootstrap 4's font stack, not the browser's default


def test_data_docs_without_the_fetched_files_keep_the_cdn_and_say_so(spark, tmp_path, monkeypatch):
    """Set-up not run (an installed package, no `setup-docs-assets`): the pages are built as Great
    Expectations writes them, and a warning says how to read them offline."""
    monkeypatch.setenv("STREAMJOIN_DOCS_ASSETS", str(tmp_path / "not-fetched"))
    with pytest.warns(UserWarning, match="streamjoin setup-docs-assets"):
        result = validate_slice(
            spark, shop_job(tmp_path), spark.createDataFrame(good_rows(), OUTPUT), START, END
        )
    assert result.success and "https://code.jquery.com/jquery-3.7.1.min.js" in Path(result.docs).read_text()


# ---------------------------------------------------------------- links of a chain: a collapse is invalid

VIEWS = StructType(
    [
        StructField("view", StringType()),
        StructField("campaign", StringType()),
        StructField("currency", StringType()),
        StructField("t", TimestampType()),
    ]
)
CAMPAIGNS = StructType([StructField("id", StringType()), StructField("tier", StringType())])
RATES = StructType([StructField("currency", StringType()), StructField("rate", DoubleType())])
HOUR = 3600


def campaign_chain(root, **quality) -> dict:
    """Views enriched with their campaign, then their currency's rate: two table links."""
    return {
        "name": "views_enriched",
        "sources": {
            "views": {"path": f"{root}/views", "time": "t"},
            "campaigns": {"path": f"{root}/campaigns", "kind": "table", "key": ["id"], "clock_skew": "0s"},
            "rates": {"path": f"{root}/rates", "kind": "table", "key": ["currency"], "clock_skew": "0s"},
        },
        "from": "views",
        "joins": [
            {"join": "campaigns", "type": "left", "on": "views.campaign = campaigns.id"},
            {"join": "rates", "type": "left", "on": "views.currency = rates.currency"},
        ],
        "select": ["views.view", "campaigns.tier", "rates.rate"],
        "output": {"path": f"{root}/out", "key": ["view"]},
        "quality": {"link_min_rows": 5, **quality},
    }


@pytest.fixture(scope="module")
def collapsed(spark, tmp_path_factory):
    """Six hourly slices of six views each; in the fifth, two views name a campaign the table does
    not have (a dimension load that missed a day): the campaign link pads a third of them. One
    backfill replays the six together (one metrics row each) and validates them in turn."""
    from conftest import append, at

    from streamjoin.backfill import plan_backfill, run_backfill

    root = tmp_path_factory.mktemp("collapse")
    append(spark, root / "campaigns", [("c1", "gold"), ("c2", "silver")], CAMPAIGNS)
    append(spark, root / "rates", [("EUR", 1.1)], RATES)
    for hour in range(6):
        campaigns = ["c1", "c2", "c1", "c2", "c9", "c9"] if hour == 4 else ["c1", "c2"] * 3
        views = [(f"v{hour}{n}", c, "EUR", at(hour * HOUR + 60 * n)) for n, c in enumerate(campaigns)]
        append(spark, root / "views", views, VIEWS)
    spec = spec_from_dict(campaign_chain(root))
    backfill = plan_backfill(spark, spec, Slice(at(0), at(6 * HOUR)), every="1h")
    outcomes = run_backfill(spark, backfill, options=RunOptions(site=str(root / "site")))
    return SimpleNamespace(root=root, spec=spec, outcomes=outcomes)


def test_a_slice_whose_table_link_pads_a_third_of_its_rows_is_invalid(spark, collapsed):
    statuses = [o.status for o in collapsed.outcomes]
    assert statuses == ["succeeded"] * 4 + ["invalid", "succeeded"]
    collapse = collapsed.outcomes[4]
    assert collapse.metrics.links[0].padded == 2  # the replay counted it; validation judges it
    assert collapse.validation.failed == (
        "link 1. LEFT JOIN campaigns: 4 of 6 rows matched (66.7%), below the floor 90.0% (median 100.0% of "
        "the job's last 4 valid slices, less the tolerance)",
    )
    checks = {line: ok for ok, line in collapse.validation.checks}
    assert checks[
        "link 2. LEFT JOIN rates: 6 of 6 rows matched (100.0%), at or above the floor 90.0% (median 100.0% of "
        "the job's last 4 valid slices, less the tolerance)"
    ]
    links_pages = list((collapsed.root / "site" / "validations" / "views_enriched_links").rglob("*.html"))
    assert len(links_pages) == 3  # GE's own page for each judged slice (the fourth to the sixth)


def test_the_first_slices_are_not_judged_until_enough_history_is_known(collapsed):
    lines = [line for ok, line in collapsed.outcomes[0].validation.checks if line.startswith("link ")]
    assert lines == [
        "link 1. LEFT JOIN campaigns: 6 of 6 rows matched (100.0%); not judged: 0 earlier valid slice(s) known, 3 needed",
        "link 2. LEFT JOIN rates: 6 of 6 rows matched (100.0%); not judged: 0 earlier valid slice(s) known, 3 needed",
    ]
    assert "floor" in collapsed.outcomes[3].validation.checks[-1][1]  # the fourth slice has three before it


def test_an_invalid_slice_is_not_part_of_the_baseline_and_a_rerun_is_judged_the_same(spark, collapsed):
    """Once recorded invalid, the collapsed slice stays out of the median a later slice is judged
    by; validating it again gives the same verdict (its own row is never its baseline)."""
    from streamjoin.backfill import slice_output
    from streamjoin.validation import link_rates

    collapse, after = collapsed.outcomes[4].slice, collapsed.outcomes[5].slice
    judged = link_rates(spark, collapsed.spec, after.start, after.end)
    assert [(r.link, r.history, r.floor) for r in judged] == [
        ("1. LEFT JOIN campaigns", 4, pytest.approx(0.9)),  # the first four: the fifth is invalid
        ("2. LEFT JOIN rates", 4, pytest.approx(0.9)),
    ]
    again = validate_slice(
        spark, collapsed.spec, slice_output(spark, collapsed.spec, collapse), collapse.start, collapse.end
    )
    assert again.failed == collapsed.outcomes[4].validation.failed
    assert link_rates(spark, collapsed.spec, after.end, after.end.add(hours=1)) == []  # not replayed yet


def test_the_rule_is_the_jobs_to_tune_or_turn_off(spark, collapsed):
    from streamjoin.backfill import slice_output

    piece = collapsed.outcomes[4].slice
    output = slice_output(spark, collapsed.spec, piece)
    for quality, valid in (({"link_history": 0}, True), ({"link_tolerance": 0.4}, True), ({}, False)):
        spec = spec_from_dict(campaign_chain(collapsed.root, **quality))
        result = validate_slice(spark, spec, output, piece.start, piece.end, str(collapsed.root / "site2"))
        assert result.success is valid, (quality, result.failed)
    with pytest.raises(JobError, match="link_tolerance 2.0 must lie between 0 and 1"):
        spec_from_dict(campaign_chain(collapsed.root, link_tolerance=2.0))


def test_the_floor_leaves_room_for_chance_in_a_small_slice(spark, tmp_path):
    """A link matching 80% of rows: 16 of 25 (64%) in a slice is chance (three standard errors,
    24 points, exceed the tolerance), 256 of 400 is a fall (the tolerance's 10 points decide).
    Rows looked up in a table's earliest known state (`assumed`) are no part of the rate."""
    from streamjoin.metrics import LinkCounts, RunMetrics, to_frame
    from streamjoin.validation import link_rates

    spec = spec_from_dict(campaign_chain(tmp_path))
    hours = [(datetime(2024, 5, 1, h), datetime(2024, 5, 1, h + 1)) for h in range(7)]

    def run(hour: int, reached: int, matched: int, assumed: int = 0) -> RunMetrics:
        start, end = hours[hour]
        padded = reached - matched - assumed
        link = LinkCounts("1. LEFT JOIN campaigns", reached, matched, padded=padded, assumed=assumed)
        return RunMetrics(
            spec.name, "replay", "exact", f"r{hour}", end, slice_start=start, slice_end=end, links=[link]
        )

    runs = [run(h, 25, 20) for h in range(4)] + [run(4, 25, 16), run(5, 400, 256), run(6, 400, 256, 100)]
    to_frame(spark, runs).write.format("delta").save(spec.output.side("metrics"))
    (small,) = link_rates(spark, spec, *hours[4])
    (large,) = link_rates(spark, spec, *hours[5])
    assert small.baseline == large.baseline == 0.8
    assert small.floor == pytest.approx(0.8 - 3 * (0.8 * 0.2 / 25) ** 0.5) and small.rate >= small.floor
    assert large.floor == pytest.approx(0.7) and large.rate < large.floor
    assert large.history == 5  # the earlier slices, the small one among them: no backfill found it invalid
    (assumed,) = link_rates(spark, spec, *hours[6])
    assert (assumed.reached, assumed.matched) == (300, 256) and assumed.rate >= assumed.floor


# ---------------------------------------------------------------- many slices validated in one pass


def hours_of(hours: int) -> list[Slice]:
    return [
        Slice(pendulum.instance(datetime(2024, 5, 1, h)), pendulum.instance(datetime(2024, 5, 1, h + 1)))
        for h in range(hours)
    ]


def three_hours() -> list[tuple]:
    """Hour 0 valid (one order unpaid: a match rate of 0.75, allowed), hour 1 with a NULL key and a
    duplicated one (and a NULL customer), hour 2 empty, hour 3 valid again."""
    at = lambda h, m: datetime(2024, 5, 1, h, m)  # noqa: E731
    return [
        ("o1", "c1", "p1", 10.0, at(0, 0)),
        ("o2", "c2", "p2", 20.0, at(0, 10)),
        ("o3", "c1", "p3", 30.0, at(0, 20)),
        ("o4", "c3", None, None, at(0, 59)),
        (None, "c1", "p5", 1.0, at(1, 0)),
        ("o6", None, "p6", 1.0, at(1, 5)),
        ("o6", "c2", "p7", 1.0, at(1, 6)),
        ("o8", "c2", "p8", 1.0, at(1, 7)),
        ("o9", "c4", "p9", 1.0, at(3, 30)),
    ]


@pytest.mark.parametrize("key", [("order_id",), ("order_id", "customer_id")])
def test_slices_validated_together_read_as_each_validated_alone(spark, tmp_path, key):
    """The same statuses, failure messages (Great Expectations' own, with example values) and
    check lines as validating each slice over its own rows, and a Data Docs page per slice."""
    from streamjoin.validation import validate_slices

    spec, pieces = shop_job(tmp_path, output=Output(path=str(tmp_path / "out"), key=key)), hours_of(4)
    rows = spark.createDataFrame(three_hours(), OUTPUT)
    together = validate_slices(spark, spec, rows, pieces, str(tmp_path / "together"))
    alone = [
        validate_slice(
            spark,
            spec,
            rows.where((rows.event_time >= p.start) & (rows.event_time < p.end)),
            p.start,
            p.end,
            str(tmp_path / "alone"),
        )
        for p in pieces
    ]

    assert [r.success for r in together] == [True, False, True, True]
    assert [r.checks for r in together] == [r.checks for r in alone]
    assert [(r.failed, r.evaluated, r.suite) for r in together] == [
        (r.failed, r.evaluated, r.suite) for r in alone
    ]
    duplicated = "2 of 4 rows duplicated (66.7%), e.g. 'o6'" if len(key) == 1 else "0 of 4 rows duplicated"
    assert f"unique({', '.join(key)}): {duplicated}" in " ".join(line for _, line in together[1].checks)
    assert (
        "payment_id, mostly=0.75): 1 of 4 rows NULL (25.0%), at most 25.0% allowed"
        in together[0].checks[-1][1]
    )
    pages = [Path(r.docs) for r in together]
    assert len(set(pages)) == 4 and all(
        p.is_file() and p.is_relative_to(tmp_path / "together") for p in pages
    )
    assert "20240501T000000Z-20240501T010000Z" in str(pages[0]) and "shop_orders" in pages[0].read_text()
    assert "shop_orders" in (tmp_path / "together" / "index.html").read_text()


def test_validating_more_slices_together_costs_no_more_spark_jobs(spark, tmp_path):
    """One aggregation over the slices' rows, whatever their number and however many are empty:
    no Spark job per slice (an empty slice's result is assembled too, not Great Expectations run
    over no rows)."""
    from streamjoin.validation import validate_slices

    spec = shop_job(tmp_path)
    tracker = spark.sparkContext.statusTracker()

    def jobs_to_validate(hours: int, every: int = 1) -> int:
        rows = [
            (f"o{h}-{n}", "c1", "p1", 1.0, datetime(2024, 5, 1, h, n))
            for h in range(0, hours, every)
            for n in range(3)
        ]
        before = max(tracker.getJobIdsForGroup(None), default=-1)
        results = validate_slices(
            spark,
            spec,
            spark.createDataFrame(rows, OUTPUT),
            hours_of(hours),
            str(tmp_path / f"s{hours}-{every}"),
        )
        assert all(r.success for r in results) and len(results) == hours
        return max(tracker.getJobIdsForGroup(None)) - before

    assert jobs_to_validate(8) == jobs_to_validate(2) == jobs_to_validate(8, every=4)


@pytest.mark.parametrize("key", [("order_id",), ("order_id", "customer_id")])
def test_an_empty_slices_assembled_result_holds_what_great_expectations_reports(spark, tmp_path, key):
    """Over no rows, the result made for a slice holds, expectation by expectation, what Great
    Expectations' own run over no rows reports (no count of unexpected values for the not-NULL and
    range expectations, 0 for the uniqueness ones), so its checks and Data Docs page read alike."""
    from streamjoin import validation
    from streamjoin.slice_profile import profile

    spec = shop_job(tmp_path, output=Output(path=str(tmp_path / "out"), key=key))
    (piece,) = hours_of(1)
    empty = spark.createDataFrame([], OUTPUT)
    batch = validation._Batch.open(spark, spec, empty, str(tmp_path / "site"), [(piece.start, piece.end)])
    run = batch.checkpoint.run(
        batch_parameters={"dataframe": empty},
        expectation_parameters=batch.parameters[0],
        run_id=batch.run_id(0),
    )
    ((_, theirs),) = run.run_results.items()
    (found,) = profile(empty, spec.output.time, [piece], batch.suite["expectations"], batch.parameters)
    _, ours = validation._result_of(batch.suite, found, batch.parameters[0], batch.run_id(0), "streamjoin")

    def read(validation_result) -> list[tuple]:
        return [(r.expectation_config.type, r.success, r.result) for r in validation_result.results]

    assert read(ours) == read(theirs)
    assert {r.expectation_config.type for r in ours.results} >= {
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_between",
    }
    assert ours.statistics == theirs.statistics
