"""`streamjoin verify` on real runs: the live output against the exact replay, slice by slice."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import append, at
from delta.tables import DeltaTable
from pyspark.sql.types import StringType, StructField, StructType, TimestampType
from test_report import open_page, screenshot, shown

from streamjoin import delta_io, lease
from streamjoin.backfill import Slice
from streamjoin.cli import main
from streamjoin.errors import JobError
from streamjoin.jobfile import load_job
from streamjoin.report import build_report
from streamjoin.runners.live import LiveRunner
from streamjoin.timeutil import parse_instant
from streamjoin.verify import compare, verify

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


EXAMPLES = int(os.environ.get("STREAMJOIN_VERIFY_EXAMPLES", "200"))
ROWS = StructType([*EVENTS.fields[:2], StructField("event_time", TimestampType())])


def expected_check(live: list[tuple], replayed: list[tuple], keyed: bool) -> tuple[int, int, int]:
    """(missing, extra, differing) of one slice, from the multisets; with a key (the first column), a
    missing and an extra row of one key pair up as one differing row."""
    extra, missing = Counter(live) - Counter(replayed), Counter(replayed) - Counter(live)
    if not keyed:
        return sum(missing.values()), sum(extra.values()), 0
    by_key: dict[str, list[int]] = {}
    for rows, k in ((extra, 0), (missing, 1)):
        for row, n in rows.items():
            by_key.setdefault(row[0], [0, 0])[k] += n
    differing = sum(min(e, m) for e, m in by_key.values())
    return (
        sum(m for _, m in by_key.values()) - differing,
        sum(e for e, _ in by_key.values()) - differing,
        differing,
    )


def mutated(rows: list[tuple], draw: random.Random) -> list[tuple]:
    """The replay's rows after a few faults: values edited, rows lost, duplicated or added."""
    live = list(rows)
    for _ in range(draw.choice([0, 0, 1, 2, 3])):
        fault = draw.choice(["edit", "delete", "duplicate", "add"])
        if fault == "add" or not live:
            live.append(
                (f"x{draw.randrange(3)}", draw.choice(["p", None]), live[0][2] if live else rows[0][2])
            )
        elif fault == "edit":
            i = draw.randrange(len(live))
            live[i] = (live[i][0], draw.choice(["q", None, "v0"]), live[i][2])
        elif fault == "delete":
            live.pop(draw.randrange(len(live)))
        else:
            live.append(draw.choice(live))
    return live


@pytest.mark.parametrize("keyed", [True, False], ids=["output key", "no key"])
def test_compare_counts_what_each_side_holds_more_often(spark, keyed):
    """Kernel level: many generated slices, each its own example (one compare call for all), against
    the multiset reference. A slice's live rows minus its replayed rows is always extra minus missing."""
    draw = random.Random(21 + keyed)
    pieces = [Slice(parse_instant(at(i * HOUR)), parse_instant(at((i + 1) * HOUR))) for i in range(EXAMPLES)]
    live_rows, replayed_rows, expected = [], [], []
    for i in range(EXAMPLES):
        when = at(i * HOUR + draw.randrange(HOUR))
        replayed = [
            (f"k{draw.randrange(4)}", draw.choice(["v0", "v1", None]), when)
            for _ in range(draw.randrange(1, 5))
        ]
        live = mutated(replayed, draw)
        live_rows += live
        replayed_rows += replayed
        expected.append((*expected_check(live, replayed, keyed), len(live), len(replayed)))
    outside = [("k0", "v0", at(EXAMPLES * HOUR))]  # after the last slice: compared nowhere
    checks = compare(
        spark.createDataFrame(live_rows + outside, ROWS),
        spark.createDataFrame(replayed_rows, ROWS),
        "event_time",
        ("k",) if keyed else (),
        pieces,
    )
    found = [(c.missing, c.extra, c.differing, c.rows_live, c.rows_replayed) for c in checks]
    assert found == expected
    assert any(c.differing for c in checks) == keyed and any(c.equal for c in checks)
    assert all(not c.equal for c in checks if c.missing or c.extra)
    for check in checks:
        assert check.rows_live - check.rows_replayed == check.extra - check.missing
        assert len(check.examples) <= 5 and bool(check.examples) == (not check.equal)
        assert {e["kind"] for e in check.examples} <= {"missing", "extra", "differing"}


def test_verify_before_any_live_run_says_to_run_live_first(spark, live):
    root, _, spec = live
    never = replace(spec, output=replace(spec.output, path=str(root / "never")))
    with pytest.raises(
        JobError, match=r"job verified has no live run recorded in .*never_metrics; .*streamjoin stream"
    ):
        verify(spark, never, at(0), at(HOUR))
