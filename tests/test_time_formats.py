"""String event-time columns: `validate-job` parses a sample of the data with the job's time_format,
and rows whose time does not parse are rejected and counted, never silently away (issue 76, item 5)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import append, at
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from streamjoin import delta_io
from streamjoin.cli import main
from streamjoin.errors import JobError
from streamjoin.jobfile import load_job
from streamjoin.plan import bind, iso_8601_format, time_format_warnings
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay

IMPRESSIONS = StructType([StructField("id", StringType()), StructField("ts", TimestampType())])
CLICKS = StructType([StructField("id", StringType()), StructField("ts", StringType())])
WRONG = "yyyy-MM-dd HH:mm:ss"  # the reported mistake: these clicks are ISO 8601 with a T and a Z


def write_job(sources, folder, formats: dict[str, str] | None = None) -> str:
    """Impressions LEFT JOIN clicks within 30 minutes (tables under `sources`), the job file and its
    output in `folder`; `formats`: each source's time_format (default: clicks read with WRONG)."""
    formats = {"clicks": WRONG} if formats is None else formats
    job = {
        "name": "attribution",
        "sources": {
            name: {"path": str(sources / name), "time": "ts"}
            | ({"time_format": formats[name]} if name in formats else {})
            for name in ("impressions", "clicks")
        },
        "from": "impressions",
        "joins": [{"join": "clicks", "type": "left", "on": "impressions.id = clicks.id", "within": "30m"}],
        "select": ["impressions.id AS impression", "clicks.id AS click"],
        "output": {"path": str(folder / "out")},
    }
    path = folder / "attribution.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


@pytest.fixture(scope="module")
def history(spark, tmp_path_factory):
    """Both sources' history in their first commits (the job starts at version 0), then one later
    commit each: every click time an ISO 8601 string."""
    root = tmp_path_factory.mktemp("time_formats")
    append(spark, root / "impressions", [("i1", at(0)), ("i2", at(100))], IMPRESSIONS)
    append(spark, root / "clicks", [("i1", "2024-01-01T00:00:05Z"), ("i2", "2024-01-01T00:01:45Z")], CLICKS)
    append(spark, root / "impressions", [("i3", at(200))], IMPRESSIONS)
    append(spark, root / "clicks", [("i3", "2024-01-01T00:03:25Z")], CLICKS)
    return root


# ---------------------------------------------------------------- the suggested format, no Spark


@pytest.mark.parametrize(
    "value, pattern",
    [
        ("2026-12-02T08:22:22Z", "yyyy-MM-dd'T'HH:mm:ssX"),
        ("2026-12-02T08:22:22.123Z", "yyyy-MM-dd'T'HH:mm:ss[.SSSSSS]X"),
        ("2026-12-02T08:22:22+01:00", "yyyy-MM-dd'T'HH:mm:ssXXX"),
        ("2026-12-02T08:22:22+0100", "yyyy-MM-dd'T'HH:mm:ssXX"),
        ("2026-12-02T08:22:22", "yyyy-MM-dd'T'HH:mm:ss"),
        ("2026-12-02 08:22", "yyyy-MM-dd HH:mm"),
        ("2026-12-02", "yyyy-MM-dd"),
        ("02/12/2026 08:22", None),
        ("1796609814", None),
    ],
)
def test_an_iso_8601_value_gets_the_pattern_that_reads_it(value, pattern):
    assert iso_8601_format(value) == pattern


# ---------------------------------------------------------------- validate-job samples the data


def test_a_format_that_parses_none_of_the_sample_fails_naming_column_format_value_and_the_fix(
    spark, history, tmp_path
):
    plan = bind(spark, load_job(write_job(history, tmp_path)))
    with pytest.raises(JobError) as error:
        time_format_warnings(spark, plan)
    message = str(error.value)
    assert "source 'clicks'" in message
    assert f"time_format {WRONG!r} parses none of 3 values of event-time column 'ts'" in message
    assert "e.g. '2024-01-01T00:0" in message
    assert "every row would be rejected as unparseable_event_time" in message
    assert "write time_format: \"yyyy-MM-dd'T'HH:mm:ssX\"" in message


def test_the_suggested_format_reads_the_rows_and_the_job_joins_them(spark, history, tmp_path):
    """The pattern validate-job proposes is one the runners parse: every click joins."""
    spec = load_job(write_job(history, tmp_path, {"clicks": "yyyy-MM-dd'T'HH:mm:ssX"}))
    assert time_format_warnings(spark, bind(spark, spec)) == []
    metrics = replay(spark, spec, at(-60), at(3600), RunOptions(closed=True))
    assert metrics.sources["clicks"].joined == 3 and metrics.total("rejected") == 0


def test_a_format_that_misses_some_values_is_a_warning_with_the_count(spark, tmp_path):
    append(spark, tmp_path / "impressions", [("i1", at(0))], IMPRESSIONS)
    append(
        spark,
        tmp_path / "clicks",
        [("i1", "2024-01-01 00:00:05"), ("i2", "2024-01-01T00:00:06Z"), ("i3", None)],
        CLICKS,
    )
    (warning,) = time_format_warnings(spark, bind(spark, load_job(write_job(tmp_path, tmp_path))))
    assert warning.startswith(
        f"job 'attribution', source 'clicks': time_format {WRONG!r} does not parse 1 of 2 values"
    )  # NULLs are not sampled: they are rejected as null_event_time, whatever the format
    assert "e.g. '2024-01-01T00:00:06Z'; such rows are rejected as unparseable_event_time" in warning
    assert str(tmp_path / "out_rejected") in warning


def test_validate_job_runs_the_sample_but_structure_only_reads_no_rows(spark, history, tmp_path, capsys):
    job = write_job(history, tmp_path)
    assert main(["validate-job", job]) == 2
    assert "parses none of 3 values" in capsys.readouterr().err
    assert main(["validate-job", job, "--structure-only"]) == 0
    assert "parses none" not in capsys.readouterr().err


def test_time_format_on_a_column_that_is_not_a_string_is_refused(spark, history, tmp_path):
    """Ignored until now: a timestamp column is read as it is, whatever the format says."""
    job = write_job(history, tmp_path, {"impressions": WRONG, "clicks": "yyyy-MM-dd'T'HH:mm:ssX"})
    with pytest.raises(
        JobError,
        match=r"source 'impressions': time_format .* applies to a string column, but event-time column 'ts' "
        r"is a timestamp, read as it is; remove time_format",
    ):
        bind(spark, load_job(job))


# ---------------------------------------------------------------- at run time: rejected, and said


def test_rows_without_a_parseable_time_outside_the_replayed_range_are_named_with_the_range_to_replay(
    spark, history, tmp_path, capsys
):
    """The reported case: a replay of an event-time range wrote no click and said "rejected 0,
    adds up: yes". Rows without a usable time belong to the slice of their commit time (the
    history's: the start's), which the range does not hold; the replay now says so and how to
    see them, and that replay rejects every one of them, counted."""
    job = write_job(history, tmp_path)
    assert (
        main(["replay", job, "--start", at(-60).isoformat(), "--end", at(3600).isoformat(), "--closed"]) == 0
    )
    printed = capsys.readouterr().out
    assert "rejected 0" in printed  # this range holds none of them ...
    warning = next(line for line in printed.splitlines() if line.startswith("warning: source 'clicks'"))
    assert "3 row(s) without a usable event time (NULL, or not parseable with time_format" in warning
    assert "(history rows among them, at the job's start)" in warning
    assert "None of the 3 rows of 'clicks' so far has a usable event time" in warning

    start, end = warning.split("Replay --start ")[1].split(" to write them")[0].split(" --end ")
    assert main(["replay", job, "--start", start, "--end", end, "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["warnings"] == []  # ... the range it names holds all of them
    assert run["metrics"]["sources"]["clicks"]["rejected"] == 3 and run["metrics"]["balanced"]
    rejected = delta_io.read_snapshot(spark, str(tmp_path / "out_rejected"))
    assert sorted(json.loads(r["row"])["id"] for r in rejected.collect()) == ["i1", "i2", "i3"]
    assert {r["reason"] for r in rejected.collect()} == {"unparseable_event_time"}
