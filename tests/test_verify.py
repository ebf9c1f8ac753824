"""`streamjoin verify` on real runs: the live output against the exact replay, slice by slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import append, at
from delta.tables import DeltaTable
from pyspark.sql.types import StringType, StructField, StructType, TimestampType
from test_report import open_page, screenshot, shown

from streamjoin import delta_io, lease
from streamjoin.cli import main
from streamjoin.report import build_report
from streamjoin.runners.live import LiveRunner
from streamjoin.spec import load_job
from streamjoin.verify import verify

EVENTS = StructType(
    [StructField("k", StringType()), StructField("v", StringType()), StructField("t", TimestampType())]
)
HOUR = 3600
JOB = """
name: verified
sources:
  l: {path: l, kind: stream, time: t}
  r: {path: r, kind: stream, time: t}
from: l
joins:
  - join: r
    type: left
    on: l.k = r.k
    between: [-10s, 10s]
    grace: 30m
select: [l.v AS lv, r.v AS rv]
output:
  path: out
  key: [lv]
schedule:
  every: 1h
"""


def hour_rows(hour: int) -> tuple[list, list]:
    """Three left rows in the hour, the first two with a partner three seconds later."""
    left = [(f"k{hour}{i}", f"A{hour}{i}", at(hour * HOUR + 100 * (i + 1))) for i in range(3)]
    right = [(f"k{hour}{i}", f"B{hour}{i}", at(hour * HOUR + 100 * (i + 1) + 3)) for i in range(2)]
    return left, right


@pytest.fixture(scope="module")
def live(spark, tmp_path_factory):
    """Four hours of rows run live in two runs (the second run's commits close every window)."""
    root = tmp_path_factory.mktemp("verify")
    job_file = root / "verified.yaml"
    job_file.write_text(JOB)
    spec = load_job(job_file, root=root)
    for hour in range(4):
        left, right = hour_rows(hour)
        append(spark, root / "l", left, EVENTS)
        append(spark, root / "r", right, EVENTS)
        if hour == 1:
            LiveRunner(spark, spec, str(root / "ck")).run()
    append(spark, root / "l", [("kz", "Z", at(6 * HOUR))], EVENTS)
    append(spark, root / "r", [("kz", "z", at(6 * HOUR + 1))], EVENTS)
    LiveRunner(spark, spec, str(root / "ck")).run()
    return root, job_file, spec


def consistency_rows(spark, spec) -> list[dict]:
    rows = delta_io.read_snapshot(spark, spec.output.side("consistency")).collect()
    return [r.asDict() for r in rows]


def test_live_output_edited_by_hand_is_caught_in_its_slice(spark, live, browser, capsys):
    """A live run verified: every slice equal, nothing the user reads touched. Then one output row
    edited, one deleted and one duplicated: verify names each in its slice and exits 1; while a live
    runner holds the checkpoint, only what its last batch had written is judged; the page shows the
    differing slices beside the equal one."""
    root, job_file, spec = live
    out = spec.output
    output_version = delta_io.latest_version(spark, out.location)
    metrics_before = delta_io.read_snapshot(spark, out.side("metrics")).count()

    clean = verify(spark, spec, at(0), at(4 * HOUR), checkpoint=str(root / "ck"))
    assert clean.equal and len(clean.slices) == 4
    assert [(s.rows_live, s.rows_replayed) for s in clean.slices] == [(3, 3)] * 4
    assert clean.point.versions == {"l": 4, "r": 4} and not clean.point.running
    assert delta_io.latest_version(spark, out.location) == output_version, "verify wrote to the output"
    assert delta_io.read_snapshot(spark, out.side("metrics")).count() == metrics_before
    assert delta_io.read_snapshot(spark, clean.scratch).count() == 12  # the replay's rows, kept to look at
    recorded = consistency_rows(spark, spec)
    assert len(recorded) == 4 and all(r["equal"] and r["missing"] == r["extra"] == 0 for r in recorded)

    table = DeltaTable.forPath(spark, out.location)
    table.update("lv = 'A01'", {"rv": "'edited'"})  # slice 0
    table.delete("lv = 'A11'")  # slice 1
    copy = delta_io.read_snapshot(spark, out.location).where("lv = 'A22'")  # slice 2
    copy.write.format("delta").mode("append").save(out.location)

    held = Path(root, "ck", "streamjoin", "lease.json")
    token = lease.acquire(held, lambda: True)  # as a running live runner holds it
    try:
        running = verify(spark, spec, at(0), at(4 * HOUR), checkpoint=str(root / "ck"))
    finally:
        lease.release(held, token)
    assert running.point.running and running.equal, "edits after the live batch ended were judged"

    code = main(
        ["verify", str(job_file), "--root", str(root), "--start", "2024-01-01", "--end", "2024-01-01T04:00"]
        + ["--checkpoint", str(root / "ck"), "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and not report["equal"]
    found = [
        (s["missing"], s["extra"], s["differing"], s["rows_live"], s["rows_replayed"])
        for s in report["slices"]
    ]
    assert found == [(0, 0, 1, 3, 3), (1, 0, 0, 2, 3), (0, 1, 0, 4, 3), (0, 0, 0, 3, 3)]
    edited = report["slices"][0]["examples"]
    assert edited == [
        {
            "kind": "differing",
            "key": {"lv": "A01"},
            "live": [
                {
                    "row": {
                        "lv": "A01",
                        "rv": "edited",
                        "event_time": edited[0]["live"][0]["row"]["event_time"],
                    },
                    "copies": 1,
                }
            ],
            "replay": [{"row": {**edited[0]["live"][0]["row"], "rv": "B01"}, "copies": 1}],
        }
    ]
    assert [e["kind"] for s in report["slices"] for e in s["examples"]] == ["differing", "missing", "extra"]

    latest = {
        r["slice_start"]: r for r in consistency_rows(spark, spec) if r["verify_id"] == report["verify_id"]
    }
    assert [latest[k]["equal"] for k in sorted(latest)] == [False, False, False, True]

    page = build_report(spark, spec, str(root / "report"))
    open_page(browser, page)
    from selenium.webdriver.common.by import By

    rows = browser.find_elements(By.CSS_SELECTOR, "table#consistency tbody tr")
    statuses = [r.find_element(By.CSS_SELECTOR, "[data-field='status']").text for r in rows]
    assert statuses == ["DIFFERS", "DIFFERS", "DIFFERS", "equal"]
    assert shown(browser, "#consistency-verdict").startswith("3 of 4 verified slice(s) differ")
    marks = browser.find_elements(By.CSS_SELECTOR, "svg#chart-consistency .mark")
    plotted = {(m.get_attribute("data-series"), m.get_attribute("data-value")) for m in marks}
    assert {("differing", "1"), ("missing", "1"), ("extra", "1")} <= plotted
    screenshot(browser, "verified")
