"""The benchmark at a tiny scale, as a smoke test: it runs end to end and its correctness checks hold.

Times are not asserted (they are the benchmark's business, bench/README.md); what is asserted is
what makes its ratios meaningful: the streamjoin replay in complete mode writes exactly the rows
of the hand-written PySpark query and of DuckDB, and the live catch-up writes the rows of the
exact replay.
"""

from __future__ import annotations

import json
import os
import statistics

import pytest

from bench import fixed_cost, native, nexmark
from bench.run import main


def test_generator_scales_the_history_up_to_64_hours_then_the_rate():
    one, four, big = (nexmark.Workload().at(scale) for scale in (1, 4, 84))
    assert four.hours == 4 * one.hours
    assert {t: 4 * n for t, n in one.rows().items()} == four.rows()
    # 5 million bids in hourly commits: more rows per hour, not commits of several hours
    assert big.hours == nexmark.MAX_HOURS == 64
    assert {t: 84 * n for t, n in one.rows().items()} == big.rows()
    assert big.rows()["bids"] == 5_040_000


@pytest.mark.slow
def test_tiny_benchmark_agrees_with_the_yardsticks_and_writes_its_report(spark, tmp_path):
    out = tmp_path / "results"
    code = main(
        [
            "--scales",
            "0.25",
            "--rounds",
            "1",
            "--queries",
            "q20,bid_tiers",
            "--live-scales",
            "0.25",
            "--live-queries",
            "q20",
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(out),
            "--no-fixed-cost",  # measured by its own test below, at this scale and for one query
        ]
    )
    results = json.loads((out / "results.json").read_text())["results"]
    assert code == 0
    assert [r["query"] for r in results] == ["q20", "bid_tiers"]
    # Live only where asked (the live runner's own tests cover the temporal join live).
    assert results[0]["live"]["same_as_replay"] is True and results[1]["live"] is None
    for r in results:
        assert r["same_as_handwritten"] is True, r["query"]
        assert r["same_as_duckdb"] is True, r["query"]
        assert r["rows_out"] > 0
        assert set(r["times"]) == {"replay", "handwritten", "floor", "duckdb"}
        assert [set(p) for p in r["phases"]] == [{"prepare", "read", "join", "write"}] * len(
            r["times"]["replay"]
        )
    report = (out / "report.md").read_text()
    assert "| 0.25x | q20 |" in report and "replay / hand-written" in report
    # throughput per core, beside the peers' published figures: rows in / median replay s / cores
    q20 = results[0]
    per_core = q20["rows_in"] / statistics.median(q20["times"]["replay"]) / os.cpu_count()
    replay_table = report.split("## Replay against the engine floor")[1].split("\n## ")[0]
    row = next(line for line in replay_table.splitlines() if line.startswith("| 0.25x | q20 |"))
    assert row.rstrip(" |").endswith(f"{per_core:,.0f}")
    assert "live / replay" in report
    assert (out / "scaling.svg").read_text().startswith("<svg")


@pytest.mark.slow
def test_tiny_fixed_cost_counts_every_job_of_a_replay_and_writes_its_table(spark, tmp_path):
    """bench/fixed_cost.py at a quarter of its workload, one round of q20: the jobs counted per phase
    are the jobs its cause listing finds in a replay of the same slice, and both sides wrote rows."""
    out = tmp_path / "results"
    out.mkdir()
    argv = ["--rounds", "1", "--queries", "q20", "--causes", "q20", "--scale", "0.25"]
    assert fixed_cost.main([*argv, "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    saved = json.loads((out / "fixed_cost.json").read_text())
    (q20,) = saved["queries"]
    assert q20["rows_in"] > 0 and q20["rows_out"] > 0
    (phases,) = q20["replay_jobs"]
    assert set(phases) >= {"prepare", "read", "join", "write", "account"}
    assert sum(phases.values()) == len(saved["causes"]["jobs"]) > 0
    assert q20["handwritten_jobs"][0] > 0
    assert "| q20 |" in (out / "fixed_cost.md").read_text()


@pytest.mark.slow
def test_tiny_history_benchmark_backfill_equals_one_replay_and_writes_its_report(spark, tmp_path):
    """bench/history.py at a tiny size: two history lengths, one round; its correctness check (the
    backfill's daily slices write exactly the rows of one replay of the same days) holds."""
    from bench import history

    out = tmp_path / "results"
    code = history.main(
        [
            "--days",
            "1,2",
            "--rounds",
            "1",
            "--rate",
            "40",
            "--every",
            "24",
            "--steps",
            "1",
            "--no-warmup",
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ]
    )
    saved = json.loads((out / "history.json").read_text())
    assert code == 0
    (measured,) = saved["rounds"]
    backfill = measured["backfill"]
    assert backfill["same_output"] is True
    assert backfill["slices"] == 2 and backfill["statuses"] == ["succeeded"] * 2
    assert backfill["rows_out"] == backfill["one_replay_rows_out"] > 0
    assert set(measured["day"]) == {"1", "2"} and all(
        d["rows_in"] > 0 and d["rows_out"] > 0 for d in measured["day"].values()
    )
    assert set(measured["index_step"]) == {"1", "2"} and all(
        set(s) == {"1"} for s in measured["index_step"].values()
    )
    assert saved["summary"]["backfill"]["same_output"] is True
    report = (out / "history.md").read_text()
    assert "t(H) / t(1 d)" in report and "backfill / one replay" in report and "| 2 d |" in report


@pytest.mark.slow
def test_tiny_verify_benchmark_finds_live_equal_to_the_replay_and_writes_its_table(spark, tmp_path):
    from bench.verify import main as verify_main

    out = tmp_path / "results"
    assert (
        verify_main(["--scale", "0.25", "--rounds", "1", "--work", str(tmp_path / "work"), "--out", str(out)])
        == 0
    )
    result = json.loads((out / "verify.json").read_text())
    assert result["rows_out"] > 0 and result["slices_whole"] == 3
    assert set(result["ratios"]) == {"day", "whole"}
    assert "| one day | 1 |" in (out / "verify.md").read_text()


@pytest.mark.slow
def test_tiny_native_comparison_writes_the_same_pairs_as_sparks_own_join(spark, tmp_path):
    out = tmp_path / "results"
    code = native.main(
        ["--rows", "20", "--rounds", "1", "--steps", "2", "--work", str(tmp_path / "w"), "--out", str(out)]
    )
    saved = json.loads((out / "native.json").read_text())
    assert code == 0
    ((rows, summary),) = saved["summary"].items()
    assert rows == "20" and summary["same_pairs"] is True
    (measured,) = saved["rounds"]["20"]
    assert measured["pairs"] > 0 and len(measured["streamjoin"]) == len(measured["native"]) == 2
    assert "| 20 |" in (out / "native.md").read_text()
