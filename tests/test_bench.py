"""The benchmark at a tiny scale, as a smoke test: it runs end to end and its correctness checks hold.

Times are not asserted (they are the benchmark's business, bench/README.md); what is asserted is
what makes its ratios meaningful: the streamjoin replay in complete mode writes exactly the rows
of the hand-written PySpark query and of DuckDB, and the live catch-up writes the rows of the
exact replay.
"""

from __future__ import annotations

import json

from bench import nexmark
from bench.run import main


def test_generator_rates_scale_with_the_history_not_the_rate():
    one, four = nexmark.Workload().at(1), nexmark.Workload().at(4)
    assert four.hours == 4 * one.hours
    assert {t: 4 * n for t, n in one.rows().items()} == four.rows()


def test_tiny_benchmark_agrees_with_the_yardsticks_and_writes_its_report(spark, tmp_path):
    out = tmp_path / "results"
    code = main([
        "--scales", "0.25", "--rounds", "1", "--queries", "q20,bid_tiers", "--live-scales", "0.25",
        "--work", str(tmp_path / "work"), "--out", str(out),
    ])
    results = json.loads((out / "results.json").read_text())["results"]
    assert code == 0
    assert [r["query"] for r in results] == ["q20", "bid_tiers"]
    for r in results:
        assert r["same_as_handwritten"] is True, r["query"]
        assert r["same_as_duckdb"] is True, r["query"]
        assert r["live"]["same_as_replay"] is True, r["query"]
        assert r["rows_out"] > 0
        assert set(r["times"]) == {"replay", "handwritten", "floor", "duckdb"}
    report = (out / "report.md").read_text()
    assert "| 0.25x | q20 |" in report and "replay / hand-written" in report
    assert "live / replay" in report
    assert (out / "scaling.svg").read_text().startswith("<svg")
