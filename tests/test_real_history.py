"""Acceptance: a backfill over a production-shaped history (tests/real_history.py) writes, row for
row, what the generator's own truth says, after weeks of backdated commits, nightly MERGEs, a
changelog dimension, weekly OPTIMIZE and VACUUM at Delta's default retention and a cleaned log.

The job's index starts 30 days before the history ends and is extended twice a week, as a
scheduler would run `streamjoin index` (more often than Delta's 7-day file retention, and so
before each weekly VACUUM); the backfill of the last 28 full days then runs a month after its
first day, when Delta no longer serves the in-place dimension's early versions."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import real_history
import yaml
from aging import clean_log

from streamjoin import delta_io, index
from streamjoin.arrival import Slice
from streamjoin.backfill import plan_backfill, run_backfill
from streamjoin.cli import main
from streamjoin.plan import bind
from streamjoin.spec import spec_from_dict

START_DAY, FIRST_DAY, END_DAY = 3, 3, 31  # the index starts on day 3; the backfill covers [3, 31)
INDEX_DAYS = (2, 6)  # the index step's days of the week (day % 7); day 6 is the weekly VACUUM's


def attribution(h: real_history.History, output: str) -> dict:
    """The chain: impressions LEFT JOIN clicks within 30 minutes, then the campaign's tier and the
    currency's rate as of the impression's time."""
    return {
        "name": "attribution",
        "sources": {
            "impressions": {"path": h.path("impressions"), "kind": "stream", "time": "ts", "key": ["imp_id"]},
            "clicks": {"path": h.path("clicks"), "kind": "stream", "time": "ts"},
            "campaigns": {
                "path": h.path("campaigns"),
                "kind": "table",
                "key": ["campaign"],
                "time": "updated_at",
            },
            "fx_rates": {
                "path": h.path("fx_rates"),
                "kind": "table",
                "key": ["currency"],
                "time": "valid_from",
                "changelog": True,
            },
        },
        "from": "impressions",
        "start_at": h.day(START_DAY).isoformat() + "Z",
        "joins": [
            {
                "join": "clicks",
                "type": "left",
                "on": "impressions.imp_id = clicks.imp_id",
                "between": ["0s", "30m"],
                "grace": "12h",
            },
            {
                "join": "campaigns",
                "type": "left",
                "on": "impressions.campaign = campaigns.campaign",
                "as_of": "impressions.ts",
                "grace": "2h",
            },
            {
                "join": "fx_rates",
                "type": "left",
                "on": "impressions.currency = fx_rates.currency",
                "as_of": "impressions.ts",
                "grace": "2h",
            },
        ],
        "select": ["impressions.imp_id", "clicks.click_id", "campaigns.tier", "fx_rates.rate"],
        "output": {"path": output},
    }


@pytest.fixture(scope="module")
def history(spark, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("real_history"))
    job = {}

    def index_step(h: real_history.History, d: int) -> None:  # the scheduled `streamjoin index JOB`
        if not job:  # bound once: the tables' columns never change
            job["spec"] = spec_from_dict(attribution(h, f"{root}/attribution"))
            job["plan"] = bind(spark, job["spec"])
        index.update(spark, job["plan"])

    steps = {d for d in range(real_history.DAYS) if d == START_DAY or (d > START_DAY and d % 7 in INDEX_DAYS)}
    h = real_history.write(spark, root, index_step, steps)
    for name in ("impressions", "clicks", "campaigns", "fx_rates"):
        clean_log(spark, h.path(name))
    return h, job["spec"]


def test_a_month_old_backfill_writes_the_truth(spark, history):
    h, job = history
    backfill = plan_backfill(spark, job, Slice(h.day(FIRST_DAY), h.day(END_DAY)), every="1d")
    outcomes = run_backfill(spark, backfill)
    assert [o.status for o in outcomes] == ["succeeded"] * (END_DAY - FIRST_DAY)
    written = spark.read.format("delta").load(job.output.location)
    got = Counter((r["imp_id"], r["click_id"], r["tier"], r["rate"]) for r in written.collect())
    expected = real_history.truth(h, h.day(FIRST_DAY), h.day(END_DAY))
    assert sum(expected.values()) > 800
    missing, extra = Counter(expected) - got, got - Counter(expected)
    assert not missing and not extra, (
        f"{sum(missing.values())} rows missing, e.g. {list(missing)[:3]}; {sum(extra.values())} extra, e.g. {list(extra)[:3]}"
    )
    # No row was late: every history row arrived at the start, and later ones within the grace.
    assert (
        not delta_io.exists(spark, job.output.side("late"))
        or delta_io.read_snapshot(spark, job.output.side("late")).isEmpty()
    )


def test_a_job_started_today_refuses_a_month_back_unless_told_to_assume(spark, history, tmp_path, capsys):
    """A new job over the same tables, started now: the in-place dimension can be told only from
    today, so a backfill of the last 28 days is refused naming it (the streams and the changelog
    serve any time); with --assume-earliest-known its rows are counted as assumed at that link and
    the slices are not valid."""
    h, _ = history
    document = attribution(h, str(tmp_path / "today"))
    document["start_at"] = (datetime.now(UTC) - timedelta(minutes=5)).replace(tzinfo=None).isoformat() + "Z"
    job_file = tmp_path / "today.yaml"
    job_file.write_text(yaml.safe_dump(document))

    assert main(["validate-job", str(job_file)]) == 0
    said = capsys.readouterr().out
    assert "impressions  from any time: row tracking" in said
    assert "fx_rates     from any time: an append-only changelog with row tracking" in said
    assert re.search(r"campaigns    from \S+: Delta still keeps its start version \d+", said)

    first, end = h.day(END_DAY - 2).date().isoformat(), h.day(END_DAY).date().isoformat()
    command = ["backfill", str(job_file), "--start", first, "--end", end, "--every", "1d"]
    assert main([*command, "--dry-run"]) == 2
    refused = capsys.readouterr().err.splitlines()[0]  # the table of every source follows
    assert "campaigns from" in refused and "impressions" not in refused and "fx_rates" not in refused
    assert "--assume-earliest-known" in refused

    assert main([*command, "--assume-earliest-known", "--json"]) != 0  # its slices are invalid
    report = json.loads(capsys.readouterr().out)
    assert [s["status"] for s in report["slices"]] == ["invalid", "invalid"]
    for piece in report["slices"]:
        links = {link["link"]: link for link in piece["metrics"]["links"]}
        campaigns = next(link for name, link in links.items() if name.endswith("JOIN campaigns"))
        fx = next(link for name, link in links.items() if name.endswith("JOIN fx_rates"))
        assert campaigns["assumed"] == campaigns["reached"] > 0 and campaigns["padded"] == 0
        assert fx["assumed"] == 0 and fx["matched"] == fx["reached"]
        assert any("allow_assumed" in line for line in piece["validation"]["failed"])
