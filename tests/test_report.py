"""The data-quality page, opened in Debian's headless chromium: charts, numbers and links as a reader sees them."""

from __future__ import annotations

import json
import struct
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from conftest import at
from harness import create_tables, job, read_output, with_output, write_commit

from streamjoin import delta_io
from streamjoin.backfill import run_slice
from streamjoin.errors import JobError
from streamjoin.report import build_report, docs_link
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.session import PROJECT_ROOT
from streamjoin.timeutil import from_spark

FAR_AHEAD = 13 * 365 * 86_400  # seconds after BASE (2024): about 2037
SLICES = [(at(0), at(100)), (at(100), at(200)), (at(200), at(300))]
FIELDS = ("rows_in", "rows_out", "joined", "unmatched_emitted", "unmatched_dropped", "late", "rejected")

# (side, rows): each entry is one commit; the last two before the tail arrive late (event times far behind).
COMMITS = [
    (0, [("a1", "k1", 10, 1), ("a2", "k2", 20, 1), ("a3", "k3", 50, 1), ("a4", "k9", 60, 1)]),
    (1, [("b1", "k1", 15, 1), ("b2", "k2", 25, 1), ("b3", "k3", 55, 1)]),
    (0, [("a5", "k1", 110, 1), ("a6", "k2", 150, 1), ("a7", "k4", 180, 1)]),
    (1, [("b4", "k1", 112, 1), ("b5", "k4", 185, 1)]),
    (0, [("a8", "k1", 210, 1), ("a9", "k5", 250, 1), ("a10", None, 260, 1)]),
    # b12 is dated about ten years ahead of its commit: rejected (max_future), it moves no watermark
    (
        1,
        [
            ("b6", "k1", 215, 1),
            ("b7", "k5", 255, 1),
            ("b8", "k5", 290, 1),
            ("b11", "k6", None, 1),
            ("b12", "k1", FAR_AHEAD, 1),
        ],
    ),
    (0, [("a11", "k2", 22, 1), ("a12", "k4", 178, 1)]),  # late: would pair with b2 and b5
    (1, [("b9", "k9", 62, 1)]),  # late: would pair with a4
    (0, [("a13", "k1", 500, 1)]),  # the tail moves the frontier past every slice
    (1, [("b10", "k1", 500, 1)]),
]


@pytest.fixture(scope="module")
def replayed(spark, tmp_path_factory):
    """A left outer interval job with late and rejected rows: one live run, then three slices replayed in both
    modes (the first exact slice twice, first over older versions; the last exact one as a backfill attempt)."""
    root = tmp_path_factory.mktemp("report")
    paths = create_tables(spark, root)
    for side, rows in COMMITS:
        write_commit(spark, paths[side], rows)
    spec = job(root, paths, "left", 0, 10, 5)
    LiveRunner(spark, spec, str(root / "checkpoint")).run(900)
    replay(spark, spec, *SLICES[0], options=RunOptions(mode="exact", versions={"l": 1, "r": 1}))
    for mode in ("exact", "complete"):
        for start, end in SLICES[:2]:
            replay(spark, spec, start, end, RunOptions(mode=mode))
    replay(spark, spec, *SLICES[2], options=RunOptions(mode="complete"))
    outcome = run_slice(
        spark, spec, *SLICES[2], options=RunOptions(mode="exact")
    )  # a replay, validated and recorded as a backfill attempt
    assert outcome.ok, (outcome.error, outcome.validation)
    return spec


def clock_jumps() -> list[tuple[str, int, str]]:
    """(source, version, new clock) of each commit of COMMITS that moved the largest accepted event
    time so far (the first commit starts it): what the page's jump table lists, in commit order."""
    clock, versions, jumps = None, {0: 0, 1: 0}, []
    for side, rows in COMMITS:
        versions[side] += 1
        times = [t for _, key, t, _ in rows if key is not None and t is not None and t != FAR_AHEAD]
        top = max(times, default=None)
        if top is not None and clock is not None and top > clock:
            jumps.append(("lr"[side], versions[side], at(top).strftime("%Y-%m-%d %H:%M:%S")))
        clock = top if clock is None else max(clock, top or clock)
    return jumps


def latest_runs(spark, spec) -> tuple[dict, dict]:
    """From the metrics table itself: the latest replay row per (slice start, mode) and each one's run count."""
    rows = delta_io.read_snapshot(spark, spec.output.side("metrics")).where("runner = 'replay'").collect()
    grouped = defaultdict(list)
    for row in rows:
        grouped[(from_spark(row.slice_start).isoformat(), row.mode)].append(row)
    return (
        {key: max(runs, key=lambda r: r.started_at) for key, runs in grouped.items()},
        {key: len(runs) for key, runs in grouped.items()},
    )


def open_page(driver, page: Path) -> None:
    driver.get(page.as_uri())
    driver.get_log("browser")  # start from an empty log: only this page's messages are asserted


def severe(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def shown(driver, selector: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector).text.strip()


def number(text: str) -> int:
    return int(text.replace(",", ""))


def marks(driver, chart: str, series: str) -> dict[str, float]:
    """The plotted marks of one series: slice start -> value."""
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, f"svg#{chart} .mark[data-series='{series}']")
    return {m.get_attribute("data-slice"): float(m.get_attribute("data-value")) for m in found}


def screenshot(driver, name: str) -> Path:
    """A full-page PNG under build/screenshots/."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1500, height + 40)
    target = PROJECT_ROOT / "build" / "screenshots" / f"{name}_quality.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(target))
    driver.set_window_size(1500, 1000)
    return target


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_page_shows_every_slice_as_the_metrics_table_has_it(spark, replayed, browser, tmp_path):
    spec = replayed
    page = build_report(spark, spec, str(tmp_path / "report"))
    assert page == tmp_path / "report" / "index.html"
    open_page(browser, page)
    assert severe(browser) == []
    assert browser.title == "eq: data quality"
    latest, runs = latest_runs(spark, spec)
    starts = [from_spark(start).isoformat() for start, _ in SLICES]

    from selenium.webdriver.common.by import By

    charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert [c.get_attribute("id") for c in charts] == [
        "chart-rows",
        "chart-match-rate",
        "chart-late-rejected",
        "chart-lateness-cost",
    ]
    for chart in charts:  # every chart has a title, two axis labels and a legend entry per series
        assert chart.find_element(By.CSS_SELECTOR, ".title").text
        assert len(chart.find_elements(By.CSS_SELECTOR, ".axis-label")) == 2
        assert chart.find_elements(By.CSS_SELECTOR, ".legend")
    # One mark per slice per series, holding the latest exact run's numbers.
    exact = {start: latest[(start, "exact")] for start in starts}
    for chart, series in (
        ("chart-rows", "rows_in"),
        ("chart-rows", "rows_out"),
        ("chart-late-rejected", "late"),
        ("chart-late-rejected", "rejected"),
    ):
        assert marks(browser, chart, series) == {s: float(exact[s][series]) for s in starts}, series
    rates = marks(browser, "chart-match-rate", "match_rate")
    assert rates == pytest.approx(
        {
            s: exact[s].joined / (exact[s].joined + exact[s].unmatched_emitted + exact[s].unmatched_dropped)
            for s in starts
        }
    )
    costs = {s: latest[(s, "complete")].rows_out - latest[(s, "exact")].rows_out for s in starts}
    assert marks(browser, "chart-lateness-cost", "lateness_cost") == {s: float(c) for s, c in costs.items()}
    assert any(costs.values()), "the late rows should cost some output rows"
    assert sum(exact[s].late for s in starts) > 0 and sum(exact[s].rejected for s in starts) > 0

    # The table shows each slice's latest run per mode, exactly as the metrics table holds it.
    for (start, mode), row in latest.items():
        for field in FIELDS:
            assert (
                number(shown(browser, f"tr[data-slice='{start}'][data-mode='{mode}'] [data-field='{field}']"))
                == row[field]
            ), (start, mode, field)
        assert (
            number(shown(browser, f"tr[data-slice='{start}'][data-mode='{mode}'] [data-field='runs']"))
            == runs[(start, mode)]
        )
    assert (
        runs[(starts[0], "exact")] == 2 and latest[(starts[0], "exact")].rows_in == exact[starts[0]].rows_in
    )
    for start in starts:
        assert (
            number(shown(browser, f"tr[data-slice='{start}'] td[data-field='lateness_cost']")) == costs[start]
        )
    assert number(shown(browser, "[data-tile='lateness cost'] .value")) == sum(costs.values())
    # The backfill attempt shows its status; slices without one say so.
    assert (
        shown(browser, f"tr[data-slice='{starts[2]}'][data-mode='exact'] td[data-field='status']")
        == "succeeded"
    )
    assert (
        shown(browser, f"tr[data-slice='{starts[0]}'][data-mode='exact'] td[data-field='status']")
        == "no backfill"
    )
    # Its Data Docs link opens the page Great Expectations wrote, relative to the report's folder.
    link = browser.find_element(
        By.CSS_SELECTOR, f"tr[data-slice='{starts[2]}'][data-mode='exact'] [data-field='docs'] a"
    )
    assert link.get_attribute("href").startswith("file://")
    assert Path(unquote(urlparse(link.get_attribute("href")).path)).is_file()
    assert not link.get_dom_attribute("href").startswith("/")
    # Issue 18, item 6: the validation is on the page itself (Data Docs need the web): every
    # expectation with what was observed, as the record of attempts holds it; and the status,
    # validation and Data Docs cells show without scrolling at 1400 px.
    cell = f"tr[data-slice='{starts[2]}'][data-mode='exact'] td[data-field='validation']"
    checks = [c.get_attribute("textContent") for c in browser.find_elements(By.CSS_SELECTOR, f"{cell} li")]
    record = max(
        delta_io.read_snapshot(spark, spec.output.side("backfill")).collect(), key=lambda r: r.finished_at
    )
    held_checks = json.loads(record.validation_checks)
    assert checks == [("\u2713 " if c["passed"] else "\u2717 ") + c["check"] for c in held_checks]
    assert len(checks) >= 2 and all(c.startswith("\u2713 expect_") for c in checks)
    assert shown(browser, f"{cell} summary") == f"{len(checks)} of {len(checks)} expectations passed"
    browser.set_window_size(1400, 1000)
    width = browser.execute_script("return document.documentElement.clientWidth")
    for field in ("status", "validation", "docs"):
        right = browser.execute_script(
            "return document.querySelector(arguments[0]).getBoundingClientRect().right",
            f"tr[data-slice='{starts[2]}'][data-mode='exact'] [data-field='{field}']",
        )
        assert right <= width, (field, right, width)
    browser.set_window_size(1500, 1000)

    # Every row a guard stopped is counted by guard and source, as the side tables hold them.
    held = Counter()
    for side in ("late", "rejected"):
        for r in delta_io.read_snapshot(spark, spec.output.side(side)).collect():
            held[(r.reason, r.source)] += 1
    assert {("null_key", "l"), ("null_event_time", "r"), ("future_event_time", "r")} <= set(held)
    assert any(reason == "late" for reason, _ in held)
    rows = browser.find_elements(By.CSS_SELECTOR, "table#guards tbody tr")
    assert {
        (r.get_attribute("data-guard"), r.get_attribute("data-source")): number(
            r.find_element(By.CSS_SELECTOR, "td[data-field='rows']").text
        )
        for r in rows
    } == dict(held)

    # The commits that moved the event-time clock, as COMMITS' accepted rows move it.
    assert [
        (
            r.get_attribute("data-source"),
            int(r.get_attribute("data-version")),
            r.find_element(By.CSS_SELECTOR, "td[data-field='after']").text,
        )
        for r in browser.find_elements(By.CSS_SELECTOR, "table#jumps tbody tr")
    ] == clock_jumps()

    # The live run: one row per checkpoint, its totals over the micro-batches.
    live = delta_io.read_snapshot(spark, spec.output.side("metrics")).where("runner = 'live'").collect()
    assert live
    assert number(shown(browser, "table#live td[data-field='batches']")) == len(live)
    for field in ("rows_in", "rows_out", "late", "rejected"):
        assert number(shown(browser, f"table#live td[data-field='{field}']")) == sum(
            r[field] for r in live
        ), field

    assert (
        "match rate = joined / (joined + unmatched emitted + unmatched dropped)"
        in browser.find_element(By.TAG_NAME, "body").text
    )
    shot = screenshot(browser, spec.name)
    width, height = png_size(shot)
    assert width >= 1400 and height >= 1500 and shot.stat().st_size > 30_000, (
        width,
        height,
        shot.stat().st_size,
    )
    assert severe(browser) == []


def test_one_slice_without_rows_still_draws(spark, replayed, browser, tmp_path):
    spec = with_output(replayed, str(tmp_path / "empty_out"))
    replay(spark, spec, at(1000), at(1100), RunOptions(mode="exact"))  # no event falls in this slice
    page = build_report(spark, spec)
    assert page == Path(f"{spec.output.location}_quality/report/index.html")
    open_page(browser, page)
    assert severe(browser) == []
    start = from_spark(at(1000)).isoformat()

    from selenium.webdriver.common.by import By

    assert [c.get_attribute("id") for c in browser.find_elements(By.CSS_SELECTOR, "svg.chart")] == [
        "chart-rows",
        "chart-match-rate",
        "chart-late-rejected",
    ]
    assert marks(browser, "chart-rows", "rows_in") == {start: 0.0}
    assert marks(browser, "chart-late-rejected", "late") == {start: 0.0}
    assert marks(browser, "chart-match-rate", "match_rate") == {}  # no decided row: no rate to plot
    assert shown(browser, f"tr[data-slice='{start}'] td[data-field='match_rate']") == "–"
    assert shown(browser, f"tr[data-slice='{start}'] td[data-field='lateness_cost']") == "–"
    assert "No slice has both an exact and a complete run" in browser.find_element(By.TAG_NAME, "body").text
    assert not browser.find_elements(By.CSS_SELECTOR, "table#live")
    assert severe(browser) == []


def test_job_that_never_ran_says_to_replay_first(spark, replayed, tmp_path):
    spec = with_output(replayed, str(tmp_path / "never_ran"))
    with pytest.raises(JobError, match="no run metrics yet .* run a replay or a backfill first"):
        build_report(spark, spec)
    assert not (tmp_path / "never_ran_quality").exists()


def test_data_docs_link_is_relative_so_report_and_docs_move_together(tmp_path):
    docs = tmp_path / "out_quality" / "data_docs" / "validations" / "slice.html"
    assert docs_link(str(docs), tmp_path / "out_quality" / "report") == "../data_docs/validations/slice.html"
    assert docs_link("s3://bucket/docs/index.html", tmp_path) == "s3://bucket/docs/index.html"


def test_a_failed_validation_lists_every_expectation_with_the_failures_marked(tmp_path):
    """Pure: an invalid slice's cell names the failure, then every expectation, passed or not."""
    from streamjoin.report import Attempt, Slice, render_page

    spec = job(tmp_path, {0: str(tmp_path / "l"), 1: str(tmp_path / "r")}, "left", 0, 10, 5)
    failed = "expect_column_values_to_not_be_null(rid): 3 of 4 rows NULL (75.0%)"
    checks = [
        {"passed": True, "check": "expect_column_values_to_be_between(event_time): 0 of 4 rows outside"}
    ]
    checks.append({"passed": False, "check": failed})
    piece = Slice(at(0), at(100), attempts={"exact": Attempt("invalid", None, [failed], None, checks)})
    page = render_page(spec, [piece], [], tmp_path, [])
    assert f"<td class='wrap' data-field='validation'>{failed}<details class='checks'>" in page
    assert "<summary>1 of 2 expectations passed</summary>" in page
    assert f"<li class='failed'>&#10007; {failed}</li>" in page and "<li class='passed'>&#10003; " in page


def test_a_replay_reading_past_the_live_run_is_refused_where_both_would_write(spark, replayed):
    """Last in this file: it commits a row the module's live run has not read. A replay over it
    would write rows the live run writes when it reads that commit; the refusal names the live
    run's versions and how far its output is final (watermark 495 s less the 10 s margin)."""

    def third_slice() -> Counter:  # the rows the module's exact backfill attempt wrote there
        return Counter(
            {row: n for row, n in read_output(spark, replayed.output.location).items() if 200 <= row[2] < 300}
        )

    written = third_slice()
    write_commit(spark, replayed.source("l").location, [("a14", "k1", 250, 1)])  # late: lands in [200, 300)
    with pytest.raises(
        JobError,
        match=r"a live run writes output .* which had read l=5,r=5\); this replay reads further \(l=6\), and the "
        r"live run may still write rows into \[2024-01-01T00:03:20\+00:00, 2024-01-01T00:05:00\+00:00\): both "
        r"would write them\. Its output is final up to event time 2024-01-01T00:08:05\+00:00.* replay with "
        r"--versions l=5,r=5",
    ):
        replay(spark, replayed, *SLICES[2])
    with pytest.raises(JobError, match=r"may still write rows into \[2024-01-01T00:08:20\+00:00"):
        replay(spark, replayed, at(500), at(600))  # rows the live run holds (b10, unsettled) lie there
    replay(spark, replayed, *SLICES[0])  # finished, and no unread commit reaches it
    replay(
        spark, replayed, *SLICES[2], options=RunOptions(versions={"l": 5, "r": 5})
    )  # what the live run had read
    assert third_slice() == written and written  # the rows live wrote, each once


def worst_case_page(tmp_path: Path) -> Path:
    """A page with every column the slice table can have, seven-digit counts, a long validation
    failure, a chain's links, live runs, verifications and a clock jump of 7h15m25.144930s."""
    from streamjoin.report import COUNTS, Attempt, Slice, SliceRun, render_page

    spec = job(tmp_path, {0: str(tmp_path / "l"), 1: str(tmp_path / "r")}, "left", 0, 10, 5)
    counts = {name: 1_234_567 + i for i, name in enumerate(COUNTS)}
    links = [
        {"link": f"{n}. JOIN clicks_{n}", "reached": 9_876_543, "matched": 8_765_432, "open": 2_100}
        for n in (1, 2)
    ]
    failure = "expect_column_values_to_not_be_null(campaign_id): 123,456 of 1,234,567 rows NULL (10.0%)"
    checks = [{"passed": False, "check": failure}]
    pieces = [
        Slice(
            at(3600 * h),
            at(3600 * (h + 1)),
            runs={
                mode: SliceRun(counts, at(3600 * h + 60), 12.5, 3, links) for mode in ("exact", "complete")
            },
            attempts={"exact": Attempt("invalid", None, [failure], "docs/v.html", checks)},
        )
        for h in range(24)
    ]
    live = [
        {
            "run_id": "streamjoin-clicks-d71190fb-4dbd-463a-9a29-0533817f3b55",
            "started_at": at(60 * b),
            "batch": b,
            **counts,
            "by_link": json.dumps(links),
        }
        for b in range(3)
    ]
    verified = [
        {
            "slice_start": at(0),
            "slice_end": at(3600),
            "rows_live": 1_234_567,
            "rows_replayed": 1_234_568,
            "missing": 1,
            "extra": 0,
            "differing": 0,
            "verified_at": at(7200),
            "live_batch": 41,
            "versions": json.dumps({"clicks": 1234, "impressions": 5678, "campaigns": 91}),
            "equal": False,
            "examples": json.dumps([{"kind": "missing", "key": {"id": "x" * 40}}]),
        }
    ]
    jump = ((7 * 3600 + 15 * 60 + 25) * 10**6) + 144_930
    jumps = [{"source": "clicks", "version": 1234, "commit_ts": 0, "before": 0, "after": jump}]
    stopped = [{"reason": "late", "source": "clicks", "count": 1_234_567}]
    page = tmp_path / "worst" / "index.html"
    page.parent.mkdir()
    page.write_text(render_page(spec, pieces, live, page.parent, stopped, jumps, verified))
    return page


def test_every_table_fits_a_1400_pixel_wide_window(browser, tmp_path):
    """At 1400 px no table of the fullest page scrolls sideways (every column of the slice table,
    `open` and `unsettled` included, is in view), durations read as their two largest units with
    the exact value on hover; the screenshot is kept with the test artifacts."""
    from selenium.webdriver.common.by import By

    open_page(browser, worst_case_page(tmp_path))
    try:
        browser.set_window_size(1400, 1000)
        overflowing = browser.execute_script(
            "return [...document.querySelectorAll('.table-wrap')]"
            ".filter(w => w.scrollWidth > w.clientWidth).map(w => w.querySelector('table').id)"
        )
        assert overflowing == [], overflowing
        headers = [
            th.text.replace("\n", " ") for th in browser.find_elements(By.CSS_SELECTOR, "#slices thead th")
        ]
        assert {"open / unsettled", "last run (runs)"} <= set(headers), headers
        width = browser.execute_script("return document.documentElement.clientWidth")
        first = browser.find_elements(By.CSS_SELECTOR, "#slices tbody tr:first-child [data-field]")
        assert {"open", "unsettled", "lookups", "runs", "docs"} <= {
            e.get_attribute("data-field") for e in first
        }
        assert all(0 < e.rect["x"] + e.rect["width"] <= width for e in first), [
            (e.get_attribute("data-field"), e.rect) for e in first
        ]
        jump = browser.find_element(By.CSS_SELECTOR, "table#jumps td[data-field='jump']")
        assert jump.text == "7h15m" and jump.get_attribute("title") == "7h15m25s144ms930us"
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1400, height + 40)
        target = PROJECT_ROOT / "build" / "screenshots" / "fullest_quality_1400.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(target)) and png_size(target)[0] == 1400
    finally:
        browser.set_window_size(1500, 1000)
    assert severe(browser) == []
