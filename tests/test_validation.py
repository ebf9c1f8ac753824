"""Per-slice validation: real Great Expectations runs over Spark DataFrames, Data Docs on disk."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pendulum
import pytest
from pyspark.sql.types import (
    DoubleType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamjoin.demo import JOBS_DIR, demo_job
from streamjoin.errors import JobError
from streamjoin.session import PROJECT_ROOT
from streamjoin.spec import Output, Quality, job_files, spec_from_dict
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
    return replace(spec, **output_and_quality)


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
