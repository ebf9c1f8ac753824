"""Backfills: slicing (time zones, daylight saving), the CLI, faults mid-slice and re-runs of failed slices."""

from __future__ import annotations

import inspect
import json
import re
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pendulum
import pytest

from streamjoin import arrival, delta_io, verify
from streamjoin.arrival import Slice
from streamjoin.backfill import (
    FAILED,
    SUCCEEDED,
    attempts,
    cut,
    plan_backfill,
    run_backfill,
    run_slice,
    run_slices,
)
from streamjoin.cli import main
from streamjoin.demo import DAY, JOBS_DIR, generate, write_tables
from streamjoin.errors import EXIT_INVALID, JobError
from streamjoin.job import Job
from streamjoin.jobfile import load_job
from streamjoin.metrics import BUCKETS
from streamjoin.runners.hooks import after_write
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import plan_replay, replay, replay_slices
from streamjoin.session import PROJECT_ROOT

UTC = UTC


def hours(slices) -> list[float]:
    return [(s.end - s.start).total_seconds() / 3600 for s in slices]


# ---------------------------------------------------------------- slicing, no Spark


def test_daily_slices_follow_local_days_across_daylight_saving():
    berlin = "Europe/Berlin"
    spring = cut(
        pendulum.datetime(2024, 3, 30, tz=berlin), pendulum.datetime(2024, 4, 2, tz=berlin), "1d", berlin
    )
    assert hours(spring) == [24, 23, 24]  # 31 March has no 02:00
    autumn = cut(
        pendulum.datetime(2024, 10, 26, tz=berlin), pendulum.datetime(2024, 10, 29, tz=berlin), "1d", berlin
    )
    assert hours(autumn) == [24, 25, 24]  # 27 October has 02:00 twice
    assert [s.start for s in autumn] == [
        datetime(2024, 10, 25, 22, tzinfo=UTC),
        datetime(2024, 10, 26, 22, tzinfo=UTC),
        datetime(2024, 10, 27, 23, tzinfo=UTC),
    ]
    weekly = cut(
        pendulum.datetime(2024, 3, 25, tz=berlin), pendulum.datetime(2024, 4, 8, tz=berlin), "7d", berlin
    )
    assert hours(weekly) == [167, 168]


def test_hourly_slices_on_daylight_saving_days_and_partial_ends():
    berlin = "Europe/Berlin"
    day = cut(
        pendulum.datetime(2024, 3, 31, tz=berlin), pendulum.datetime(2024, 4, 1, tz=berlin), "1h", berlin
    )
    assert len(day) == 23 and set(hours(day)) == {1}
    day = cut(
        pendulum.datetime(2024, 10, 27, tz=berlin), pendulum.datetime(2024, 10, 28, tz=berlin), "1h", berlin
    )
    assert len(day) == 25 and set(hours(day)) == {1}
    # A start and an end between boundaries give shorter first and last slices; slices tile [start, end).
    odd = cut(datetime(2024, 5, 1, 0, 30, tzinfo=UTC), datetime(2024, 5, 1, 3, 15, tzinfo=UTC), "1h")
    assert hours(odd) == [0.5, 1, 1, 0.25]
    assert all(a.end == b.start for a, b in zip(odd, odd[1:], strict=False))
    # India is 5h30 ahead of UTC: its local days start at 18:30 UTC.
    kolkata = cut(datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 3, tzinfo=UTC), "1d", "Asia/Kolkata")
    assert [s.start.hour * 60 + s.start.minute for s in kolkata[1:]] == [18 * 60 + 30, 18 * 60 + 30]


@pytest.mark.parametrize(
    "every, message",
    [
        ("7h", "must divide a day"),
        ("36h", "not whole days"),
        ("0s", "must be positive"),
        ("soon", "is not a duration"),
    ],
)
def test_bad_cadence_says_what_to_write(every, message):
    with pytest.raises(JobError, match=message):
        cut(datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 2, tzinfo=UTC), every)


def test_unknown_time_zone_and_empty_range_are_refused():
    with pytest.raises(JobError, match="IANA name"):
        cut(datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 2, tzinfo=UTC), "1d", "Mars/Olympus")
    with pytest.raises(JobError, match="start must be before end"):
        cut(datetime(2024, 5, 2, tzinfo=UTC), datetime(2024, 5, 1, tzinfo=UTC), "1d")


def test_a_backfills_slices_are_the_slices_replay_verify_and_the_kernel_take():
    """One slice type: what `cut` makes is what the replay, verify and the metrics take, and the
    kernel's view of a group of them (`arrival.Slices`) has their bounds."""
    pieces = cut(datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 1, 3, tzinfo=UTC), "1h")
    assert all(type(p) is Slice for p in pieces) and Slice is verify.Slice
    assert arrival.Slices.of(pieces).bounds == (*(p.micros()[0] for p in pieces), pieces[-1].micros()[1])
    assert pieces[1] == Slice.of("2024-05-01T01:00", "2024-05-01T02:00")  # no zone: UTC


def test_a_run_takes_its_options_as_one_object_and_no_test_hook():
    """Mode, versions and the rest travel as one RunOptions from the facade to the replay; an
    unknown mode is refused where the options are made; no public signature takes a test hook
    (tests set `streamjoin.runners.hooks.after_write`)."""
    with pytest.raises(JobError, match="mode 'fast' is unknown; use 'exact'"):
        RunOptions(mode="fast")
    loose = {"mode", "versions", "checked", "closed", "after_write"}
    for function in (replay, replay_slices, plan_replay, run_slice, run_slices, run_backfill, plan_backfill):
        assert not loose & set(inspect.signature(function).parameters), function.__name__
    for function in (LiveRunner.__init__, Job.replay, Job.run, Job.live, Job.replay_slice):
        assert "after_write" not in inspect.signature(function).parameters, function.__qualname__


# ---------------------------------------------------------------- backfills over the demo's data


ORDERS_PAYMENTS = ("orders", "payments")


@pytest.fixture(scope="module")
def demo_data(spark, tmp_path_factory):
    """The demo's day of orders and payments as Delta tables (no runs): the tables of the one job
    these tests run, orders_payments."""
    root = tmp_path_factory.mktemp("backfill")
    write_tables(spark, str(root / "demo"), generate(), only=ORDERS_PAYMENTS)
    return root


def job_with_output(root, name: str, output: str):
    spec = load_job(JOBS_DIR / f"{name}.yaml", root=root)
    return replace(spec, output=replace(spec.output, path=str(root / output)))


def rows(spark, location: str) -> Counter:
    return Counter(tuple(r) for r in delta_io.read_snapshot(spark, location).collect())


def write_job(root, name: str, output: str) -> str:
    """A copy of jobs/<name>.yaml writing to `output` (so two backfills can be compared)."""
    text = (JOBS_DIR / f"{name}.yaml").read_text()
    original = load_job(JOBS_DIR / f"{name}.yaml", root=".").output.path
    relative = original.split("/demo/", 1)[1]
    file = root / f"{output}.yaml"
    file.write_text(text.replace(f"demo/{relative}", output))
    return str(file)


def metrics_by_slice(spark, spec) -> dict:
    """Each slice's metrics row without what differs between runs (ids, start and run times)."""
    varying = {"run_id", "started_at", "recorded_at", "duration_s", "by_phase"}
    rows = delta_io.read_snapshot(spark, spec.output.side("metrics")).collect()
    assert len({(r.slice_start, r.slice_end) for r in rows}) == len(rows)  # one row per slice
    return {
        (r.slice_start, r.slice_end): {k: v for k, v in r.asDict().items() if k not in varying} for r in rows
    }


def test_slices_replayed_together_or_apart_equal_one_replay(spark, demo_data, capsys):
    """The same 12 hours cut into 5 slices on 3-hour boundaries (the first one hour long), replayed
    all together (the default batch) and in batches of 2, 2 and 1: both write what one replay
    writes, and every slice's metrics row is the same whichever slices shared its replay, with its
    rows_out the rows of its interval. Cuts at every hour and across daylight saving are decided by
    `cut`, tested above without Spark; slices at any boundary add up at the kernel's level
    (tests/test_kernel_interval.py)."""
    root = demo_data
    together, in_pairs, daily = (
        write_job(root, "orders_payments", "every3h"),
        write_job(root, "orders_payments", "every3h_pairs"),
        write_job(root, "orders_payments", "daily"),
    )
    window = ["--start", "2024-04-30T20:00Z", "--end", "2024-05-01T08:00Z"]
    dry_run = ["backfill", daily, *window, "--every", "1d", "--timezone", "Europe/Berlin", "--dry-run"]
    assert main(["--root", str(root), *dry_run]) == 0
    out = capsys.readouterr().out
    assert "2 slice(s)" in out and "orders: version" in out and "payments: version" in out
    assert "payments: 0s before, 1h after" in out and "orders: 1h before, 0s after" in out
    assert (
        "2024-05-01T00:00:00+02:00 .. 2024-05-01T10:00:00+02:00" in out
    )  # the second, partial slice, local time
    assert not delta_io.exists(spark, str(root / "daily"))  # a dry run writes nothing

    three_hourly = [*window, "--every", "3h", "--no-validate"]
    assert main(["--root", str(root), "backfill", together, *three_hourly]) == 0
    shown = capsys.readouterr()
    assert "5 of 5 slice(s) succeeded" in shown.out
    # Issue 18, item 4: a log names each stage as it starts, and the table fits 100 columns, with
    # the rows still held (open or unsettled) beside rows in and out.
    for stage in (
        "checking the pinned versions",
        "replaying 5 slice(s) 2024-04-30 20:00",
        "recording 5 attempt(s)",
    ):
        assert stage in shown.err, (stage, shown.err)
    table = shown.out.split("5 of 5 slice(s) succeeded")[0].splitlines()
    assert len(table) >= 9 and all(len(line) <= 100 for line in table), shown.out
    assert "held" in shown.out and "2024-05-01 00:00 \u2192 03:00" in shown.out
    assert main(["--root", str(root), "backfill", in_pairs, *three_hourly, "--batch", "2"]) == 0
    assert "5 of 5 slice(s) succeeded" in capsys.readouterr().out
    assert main(["--root", str(root), "backfill", in_pairs, *three_hourly, "--batch", "0"]) == 2
    assert "a batch of 0 slices is empty" in capsys.readouterr().err

    whole = job_with_output(root, "orders_payments", "whole")
    replay(spark, whole, datetime(2024, 4, 30, 20, tzinfo=UTC), datetime(2024, 5, 1, 8, tzinfo=UTC))
    expected = rows(spark, whole.output.location)
    assert sum(expected.values()) > 20
    assert rows(spark, str(root / "every3h")) == expected
    assert rows(spark, str(root / "every3h_pairs")) == expected

    spec = load_job(together, root=root)
    by_slice = metrics_by_slice(spark, spec)
    assert by_slice == metrics_by_slice(spark, load_job(in_pairs, root=root))
    output = delta_io.read_snapshot(spark, spec.output.location).collect()
    for (start, end), m in by_slice.items():
        assert m["rows_out"] == sum(start <= r[spec.output.time] < end for r in output)
        assert m["rows_in"] + m["carried_in"] == sum(m[b] for b in BUCKETS)
    assert sum(m["rows_out"] for m in by_slice.values()) == sum(expected.values())
    # The side tables too. A replay whose slice has no late (or rejected) row, over a side table
    # that holds none there, leaves that table alone rather than replace nothing with nothing.
    pairs = load_job(in_pairs, root=root)
    (*_, (last_start, last_end)), written = sorted(by_slice), []
    for side in ("late", "rejected"):
        assert rows(spark, pairs.output.side(side)) == rows(spark, whole.output.side(side)), side
        assert rows(spark, pairs.output.side(side)) and not by_slice[(last_start, last_end)][side], side
    with after_write(lambda location, batch: written.append(location)):
        replay(spark, pairs, last_start, last_end)
    assert written == [pairs.output.location], written
    assert rows(spark, pairs.output.location) == expected
    recorded = attempts(spark, spec).collect()
    assert len(recorded) == 5 and {r.status for r in recorded} == {SUCCEEDED}
    assert len({r.versions for r in recorded}) == 1 and len({r.backfill_id for r in recorded}) == 1
    assert {(r.slice_start, r.slice_end): r.rows_out for r in recorded} == {
        k: m["rows_out"] for k, m in by_slice.items()
    }


def test_slice_killed_mid_write_then_only_failed_rerun(spark, demo_data, capsys):
    """A fault after the slice's output is committed but before its side tables and metrics: the
    slice is recorded as failed, the others go on, and --only-failed re-runs just that slice with the
    versions the backfill pinned, leaving the output equal to one replay with no duplicates."""
    root = demo_data
    file = write_job(root, "orders_payments", "faulty")
    spec = load_job(file, root=root)
    start, end = DAY, DAY + timedelta(hours=6)
    backfill = plan_backfill(spark, spec, Slice(start, end), every="2h")
    doomed = backfill.slices[1]

    def crash(location: str, batch: None) -> None:
        if location == spec.output.location and current["slice"] == doomed:
            raise RuntimeError("disk full (injected by the test)")

    current = {}
    outcomes = []
    for piece in backfill.slices:
        current["slice"] = piece
        with after_write(crash):
            outcomes += run_backfill(spark, backfill, [piece], RunOptions(validate=False))
    assert [o.status for o in outcomes] == [SUCCEEDED, FAILED, SUCCEEDED]
    assert "disk full (injected by the test)" in outcomes[1].error

    # More commits arrive after the backfill pinned its versions: the re-run must not read them.
    more = generate(seed=11)
    write_tables(spark, str(root / "demo"), more, slice(0, 6), only=ORDERS_PAYMENTS)
    args = [
        "--root",
        str(root),
        "backfill",
        file,
        "--start",
        start.isoformat(),
        "--end",
        end.isoformat(),
        "--every",
        "2h",
        "--only-failed",
        "--no-validate",
    ]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--only-failed: 1 of 3 slice(s) would run" in out
    for name, version in backfill.versions.items():
        assert f"{name}: version {version}" in out
    assert main(args) == 0
    assert "1 of 1 slice(s) succeeded" in capsys.readouterr().out
    assert main(args) == 0
    assert "nothing to run" in capsys.readouterr().out

    whole = job_with_output(root, "orders_payments", "faulty_whole")
    replay(spark, whole, start, end, RunOptions(versions=backfill.versions))
    expected = rows(spark, whole.output.location)
    got = rows(spark, spec.output.location)
    assert got == expected and max(got.values()) == 1
    latest = {}
    for r in sorted(attempts(spark, spec).collect(), key=lambda r: r.finished_at):
        latest[r.slice_start] = r
    assert {r.status for r in latest.values()} == {SUCCEEDED} and len(latest) == 3


def half_day_backfill(root, file: str) -> list[str]:
    """The arguments of `backfill FILE` over the demo's first half day, one 12-hour slice."""
    half_day = ["--start", "2024-05-01", "--end", "2024-05-01T12:00Z", "--every", "12h"]
    return ["--root", str(root), "backfill", file, *half_day]


def test_slice_breaking_its_suite_fails_the_backfill(spark, demo_data, capsys):
    """A job that demands a match rate its data cannot give: the slice is written but `invalid`,
    the command exits 3 (EXIT_INVALID: a re-run would validate the same rows, so a scheduler does
    not retry), the table names the failed expectation, and its Data Docs page exists."""
    root = demo_data
    file = write_job(root, "orders_payments", "strict")
    text = (
        Path(file)
        .read_text()
        .replace("name: orders_payments", "name: strict_orders")
        .replace("min_match_rate: 0.5", "min_match_rate: 0.99")
    )
    Path(file).write_text(text)
    spec = load_job(file, root=root)
    assert spec.name == "strict_orders" and spec.meta.quality.min_match_rate == 0.99
    args = half_day_backfill(root, file)
    assert main(args) == EXIT_INVALID
    out = capsys.readouterr().out
    assert "invalid" in out and "FAILED" in out and "payment_id" in out and "0 of 1 slice(s) succeeded" in out
    (attempt,) = attempts(spark, spec).collect()
    assert attempt.status == "invalid" and attempt.rows_out > 0
    assert any("payment_id" in message for message in json.loads(attempt.validation_failed))
    assert attempt.docs and Path(attempt.docs).exists() and "strict_orders" in Path(attempt.docs).read_text()


def test_slices_invalid_for_their_late_rows_say_what_would_change_them(spark, demo_data, capsys):
    """Issue 81, item 3: slices made invalid by their data (a 1-minute grace leaves rows late, the
    match rate falls short) are not sent to --only-failed, which would write the same rows: the
    backfill says what would change them (grace, the job's start) and repeats validate-job's warning."""
    root = demo_data
    file = write_job(root, "orders_payments", "late_orders")
    text = Path(file).read_text().replace("name: orders_payments", "name: late_orders")
    Path(file).write_text(
        text.replace("grace: 150m", "grace: 1m").replace("min_match_rate: 0.5", "min_match_rate: 0.9")
    )
    args = half_day_backfill(root, file)
    assert main(args) == EXIT_INVALID
    printed = capsys.readouterr()
    assert "0 of 1 slice(s) succeeded" in printed.out
    assert "--only-failed" in printed.err and "add --only-failed" not in printed.err
    assert (
        "1 slice(s) invalid: their rows fail the job's expectations, and a re-run over the same versions writes the same rows"
        in printed.err
    )
    late = re.search(
        r"(\d+) row\(s\) of those slices arrived late, left out of the join \((\S+)\): a longer grace keeps them \(join 1's grace is 1m\), or a later job start",
        printed.err,
    )
    assert late and int(late[1]) > 0 and late[2] == f"{root}/late_orders_late"
    assert "warning: join 1 (LEFT JOIN payments): " in printed.err and "Set grace to at least " in printed.err


def readme_python() -> str:
    """The README's Python code block, as a newcomer copies it."""
    text = (PROJECT_ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 1, "the README has one Python block; run every one of them here"
    return blocks[0]


def test_the_readmes_python_block_runs_as_written(spark, demo_data, tmp_path, monkeypatch, capsys):
    """Issue 18, item 1: after `make demo` (here: the demo's tables under ./data), the README's
    snippet runs unchanged from the repository's root, ISO strings included."""
    (tmp_path / "jobs").symlink_to(JOBS_DIR)
    (tmp_path / "data").symlink_to(demo_data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STREAMJOIN_ROOT", raising=False)
    exec(compile(readme_python(), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert re.search(r"orders_payments replay/exact: in [1-9]\d*, out [1-9]\d*", printed), printed
