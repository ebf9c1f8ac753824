"""History length: what a slice costs on tables 1, 7 and 28 days old (`python -m bench.history`).

Contract 8 (`../shared/DESIGN.md`, "tables of any age"): a slice costs what it holds, not what the
table has ever held. This benchmark writes, for every history length H of `--days`, two
append-only stream tables `l` and `r` holding H days of events at the same rate (one commit per
table every `--every` hours of event time, row tracking and change data feed on), and then, in
`--rounds` rounds, times with the real library:

1. one exact replay of the last full day [day H-1, day H) into a fresh output whose arrival index
   was built beforehand (as a daily slice runs): t(H) / t(smallest H);
2. at the largest H, a backfill of the last 7 days as daily slices (`plan_backfill` then
   `run_backfill`, no validation) against one replay of the same 7 days, each into a fresh output
   with its index built first: backfill / one replay, and the check that both wrote the same rows;
3. at the smallest and the largest H, the index step: append k new commits to each table and time
   `index.update` indexing them: seconds per new commit, largest H / smallest H.

Ratios are taken within a round and their medians reported, seconds beside them (medians too).
Every timed call is also broken down by phase (time spent in library functions, innermost first,
see `Phases`), so that a cost that grows with the history shows where it comes from.

The tables of all lengths are one history: the longest is written commit by commit, and when it
holds H days for a shorter H, the tables (and the index kept by a daily `index.update`) are
copied. Each copy then gets an end-of-stream commit per table (one row three hours after its last
day, matching nothing) so that every row of the last day is decided. The tables are kept under
`--work` and reused by a later run with the same workload (`--fresh` rewrites them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import SparkSession

from bench.run import machine
from streamjoin import backfill as backfill_mod
from streamjoin import delta_io, index, kernel
from streamjoin.arrival import Slice
from streamjoin.backfill import plan_backfill
from streamjoin.joins.interval import IntervalLink, TimeBounds
from streamjoin.plan import bind
from streamjoin.runners import replay as replay_mod
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.session import get_spark
from streamjoin.spec import JoinSpec, Output, Source

BENCH = Path(__file__).resolve().parent
BASE = datetime(2024, 3, 1, tzinfo=UTC)  # the first event time of every history
BASE_S = int(BASE.timestamp())
SIDES = ("l", "r")
COLUMNS = "id STRING, k STRING, t TIMESTAMP, v INT"
TARGETS = {"day": 1.2, "backfill": 1.3, "index": 1.2}  # the index target ("constant") read as within 1.2x
LAYOUT = 1  # bump when the tables written change, so that older ones are not reused


@dataclass(frozen=True)
class Workload:
    """Rows per hour per table, hours of event time per commit, distinct join keys."""

    rate: int = 2000
    every: int = 2
    keys: int = 2000

    @property
    def per_commit(self) -> int:
        return self.rate * self.every

    @property
    def commits_per_day(self) -> int:
        return 24 // self.every


def _timed(run) -> tuple[float, object]:
    began = time.perf_counter()
    value = run()
    return time.perf_counter() - began, value


# ---------------------------------------------------------------------------- where the time goes


class Phases:
    """Time spent in chosen library functions while a measured call runs, each function's own
    time (what it spent minus what the chosen functions it called spent). Spark is lazy: a scan
    is paid where an action runs, so "replay: scan and tally..." holds the slice's reads."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []
        self._main = threading.get_ident()
        self._patched: list[tuple[object, str, object]] = []

    def _wrap(self, function, label: str):
        def wrapped(*args, **kwargs):
            if threading.get_ident() != self._main:
                return function(*args, **kwargs)
            began = time.perf_counter()
            self._stack.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                inner = self._stack.pop()
                spent = time.perf_counter() - began
                self.totals[label] += spent - inner
                if self._stack:
                    self._stack[-1] += spent

        wrapped.__wrapped__ = function
        return wrapped

    def install(self) -> Phases:
        targets = [
            (delta_io, "require_change_feed", "check inputs: change feed on"),
            (delta_io, "check_retained", "check inputs: snapshot's files retained"),
            (delta_io, "oldest_version", "Delta: oldest version (log listing)"),
            (delta_io, "read_snapshot", "Delta: snapshot load (log replay)"),
            (delta_io, "history", "Delta: DESCRIBE HISTORY"),
            (delta_io, "latest_version", "Delta: latest version"),
            (delta_io, "exists", "Delta: is a table"),
            (index, "update", "index update: rest"),
            (index, "_read_stats", "index update: new commits' statistics"),
            (index._Stored, "heads", "index update: stored entries"),
            (index.Index, "newest", "index: frontier"),
            (index.Index, "timeline", "index: watermarks"),
            (kernel, "step", "kernel step (lateness, join, counts)"),
            (delta_io, "write_slice", "write slice (output, late rows)"),
            (delta_io, "append", "Delta appends (metrics, index, attempts)"),
            (replay_mod.ReplayPlan, "execute", "replay: scan and tally the slice's rows, count output"),
            (backfill_mod, "run_backfill", "backfill: rest (slices' records)"),
        ]
        for owner, name, label in targets:
            original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            self._patched.append((owner, name, original))
            setattr(owner, name, self._wrap(original, label))
        return self

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()

    @contextmanager
    def recording(self, into: dict):
        """Record the phases of the calls inside into `into` (label -> seconds, plus "other")."""
        self.totals.clear()
        began = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - began
            into.update({k: round(v, 3) for k, v in sorted(self.totals.items(), key=lambda kv: -kv[1])})
            into["other"] = round(spent - sum(self.totals.values()), 3)


# ---------------------------------------------------------------------------- the tables


def _create(spark: SparkSession, path: Path) -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({COLUMNS}) USING delta "
        "TBLPROPERTIES ('delta.enableRowTracking' = 'true', 'delta.enableChangeDataFeed' = 'true')"
    )


def _append_period(spark: SparkSession, path: Path, side: str, period: int, w: Workload) -> None:
    """One commit: the rows of one period of event time. Keys are a hash of (side, period, row)
    over `w.keys` values; times spread evenly over the period; 1 row in 100 comes from up to 3 hours
    earlier (most of those are late by the one-hour grace)."""
    n, span = w.per_commit, w.every * 3600
    start = BASE_S + period * span
    salt = period * 104_729 + (0 if side == "l" else 31)
    frame = spark.range(0, n, 1, 1).selectExpr(
        f"concat('{side}-{period}-', id) AS id",
        f"concat('k', pmod(xxhash64('{side}', {period}, id), {w.keys})) AS k",
        f"timestamp_seconds({start} + (pmod(id * 7919 + {salt}, {n}) * {span}) div {n}"
        f" - IF(pmod(id, 100) = 7, pmod(id * 37 + {period}, 10800), 0)) AS t",
        "CAST(pmod(id, 1000) AS INT) AS v",
    )
    frame.write.format("delta").mode("append").save(str(path))


def _append_end(spark: SparkSession, path: Path, side: str, days: int) -> None:
    """The end-of-stream commit: one row three hours after the last day, matching nothing."""
    spark.range(0, 1, 1, 1).selectExpr(
        f"'{side}-end-{days}' AS id",
        f"'end-{side}' AS k",
        f"timestamp_seconds({BASE_S + days * 86_400 + 3 * 3600}) AS t",
        "CAST(0 AS INT) AS v",
    ).write.format("delta").mode("append").save(str(path))


def _both(pool: ThreadPoolExecutor, write) -> None:
    """`write(side)` for both tables at once (two commits in flight: Delta's commit protocol, not
    the data, is most of a small append's time)."""
    for future in [pool.submit(write, side) for side in SIDES]:
        future.result()


def job(tables: Path, output: Path, name: str = "history") -> JoinSpec:
    """l LEFT JOIN r ON l.k = r.k, r.t within 10 minutes of l.t, grace 1 hour, ids out."""
    return JoinSpec(
        name=name,
        sources=(
            Source("l", "stream", path=str(tables / "l"), time="t"),
            Source("r", "stream", path=str(tables / "r"), time="t"),
        ),
        start="l",
        joins=(
            IntervalLink(
                "r",
                type="left",
                on="l.k = r.k",
                bounds=TimeBounds(timedelta(minutes=-10), timedelta(minutes=10)),
                grace=timedelta(hours=1),
            ),
        ),
        output=Output(path=str(output)),
        select=("l.id AS lid", "r.id AS rid"),
    )


def _append_periods(
    spark: SparkSession, pool: ThreadPoolExecutor, folder: Path, periods: range, w: Workload
) -> None:
    """One commit per table per period, period after period; the two tables' commits of a period
    are written at once (Delta's commit protocol, not the data, is most of a small append's time),
    so which of the two comes first varies."""
    for period in periods:
        _both(pool, lambda side, period=period: _append_period(spark, folder / side, side, period, w))


@contextmanager
def _writing(spark: SparkSession):
    """While the benchmark writes its sources: Delta rebuilds a row-tracked table's state before
    every append (for the row-ID high-water mark); one partition does that fastest here."""
    key = "spark.databricks.delta.snapshotPartitions"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "1")
    try:
        yield
    finally:
        spark.conf.set(key, before) if before is not None else spark.conf.unset(key)


def write_histories(spark: SparkSession, w: Workload, days: list[int], root: Path) -> dict:
    """Write the longest history, copying it (tables and daily-kept index) at each shorter length;
    returns what was written: per length its versions, rows and commits, and the daily index steps."""
    longest = max(days)
    top = root / f"h{longest}"
    shutil.rmtree(root, ignore_errors=True)
    top.mkdir(parents=True)
    for side in SIDES:
        _create(spark, top / side)
    index_job = job(top, top / "idx")
    daily_index: list[float] = []
    began = time.perf_counter()
    with ThreadPoolExecutor(2) as pool, _writing(spark):
        for day in range(longest):
            _append_periods(
                spark, pool, top, range(day * w.commits_per_day, (day + 1) * w.commits_per_day), w
            )
            seconds, _ = _timed(lambda: index.update(spark, bind(spark, index_job)))
            daily_index.append(round(seconds, 3))
            if day + 1 in days and day + 1 != longest:
                for name in (*SIDES, "idx_index"):
                    shutil.copytree(top / name, root / f"h{day + 1}" / name)
            print(
                f"[write] day {day + 1}/{longest}: {2 * w.commits_per_day} commits, index step {seconds:.1f} s, "
                f"{time.perf_counter() - began:.0f} s so far",
                flush=True,
            )
        tables = {}
        for h in days:
            folder = root / f"h{h}"
            _both(pool, lambda side, folder=folder, h=h: _append_end(spark, folder / side, side, h))
            index.update(spark, bind(spark, job(folder, folder / "idx")))
            versions = {side: delta_io.latest_version(spark, str(folder / side)) for side in SIDES}
            tables[str(h)] = {
                "versions": versions,
                "commits_per_table": h * w.commits_per_day + 1,
                "rows": 2 * (h * w.commits_per_day * w.per_commit + 1),
                "data_files_per_table": h * w.commits_per_day + 1,
                "index_files": len(list((folder / "idx_index").glob("*.parquet"))),
            }
    return {"tables": tables, "daily_index_s": daily_index, "write_s": round(time.perf_counter() - began, 1)}


def _with_index(root: Path, h: int, output: Path) -> None:
    """Give a fresh output the arrival index its job keeps over the history of length `h` (brought
    up to date once a day while the tables were written, then to their end): a daily job's index."""
    shutil.copytree(root / f"h{h}" / "idx_index", Path(f"{output}_index"))


# ---------------------------------------------------------------------------- the measurements


def _same_rows(spark: SparkSession, a: str, b: str) -> bool:
    left = delta_io.read_snapshot(spark, a)
    right = delta_io.read_snapshot(spark, b).select(*left.columns)
    return left.exceptAll(right).isEmpty() and right.exceptAll(left).isEmpty()


def _day(h: int) -> datetime:
    return BASE + timedelta(days=h)


def measure_round(
    spark: SparkSession,
    phases: Phases,
    w: Workload,
    days: list[int],
    root: Path,
    runs: Path,
    tables: dict,
    number: int,
    steps: list[int],
    backfill_days: int,
) -> dict:
    """One round of the three measurements; returns seconds, counts and phases of each timed call."""
    record: dict = {"round": number, "day": {}, "backfill": None, "index_step": {}}
    here = runs / f"r{number}"
    order = days if number % 2 else list(reversed(days))  # alternate the order: load drifts
    for h in order:
        pinned = tables[str(h)]["versions"]
        spec = job(root / f"h{h}", here / f"h{h}" / "day")
        _with_index(root, h, here / f"h{h}" / "day")
        phase: dict = {}
        with phases.recording(phase):
            seconds, metrics = _timed(
                lambda spec=spec, h=h, pinned=pinned: replay(
                    spark, spec, _day(h - 1), _day(h), RunOptions(mode="exact", versions=pinned)
                )
            )
        record["day"][str(h)] = {
            "s": round(seconds, 3),
            "rows_in": metrics.total("rows_in"),
            "rows_out": metrics.rows_out,
            "late": metrics.total("late"),
            "phases": phase,
        }
        print(
            f"[round {number}] H={h}: day replay {seconds:.1f} s ({metrics.summary().split('|')[0].strip()}, "
            f"late {metrics.total('late')})",
            flush=True,
        )

    h = max(days)
    n = min(backfill_days, h)
    pinned = tables[str(h)]["versions"]
    start, end = _day(h - n), _day(h)
    backfill_spec = job(root / f"h{h}", here / f"h{h}" / "backfill")
    span_spec = job(root / f"h{h}", here / f"h{h}" / "span")
    for spec in (backfill_spec, span_spec):
        _with_index(root, h, Path(spec.output.location))
    backfill_phases: dict = {}
    with phases.recording(backfill_phases):
        backfill_s, outcomes = _timed(
            lambda: backfill_mod.run_backfill(
                spark,
                plan_backfill(
                    spark,
                    backfill_spec,
                    Slice(start, end),
                    every="1d",
                    timezone="UTC",
                    options=RunOptions(versions=pinned),
                ),
                options=RunOptions(validate=False),
            )
        )
    span_phases: dict = {}
    with phases.recording(span_phases):
        span_s, span = _timed(
            lambda: replay(spark, span_spec, start, end, RunOptions(mode="exact", versions=pinned))
        )
    same = all(o.ok for o in outcomes) and _same_rows(
        spark, backfill_spec.output.location, span_spec.output.location
    )
    record["backfill"] = {
        "days": h,
        "slices": len(outcomes),
        "s": round(backfill_s, 3),
        "one_replay_s": round(span_s, 3),
        "slice_s": [o.duration_s for o in outcomes],
        "statuses": [o.status for o in outcomes],
        "rows_out": sum(o.metrics.rows_out for o in outcomes if o.metrics),
        "one_replay_rows_out": span.rows_out,
        "same_output": same,
        "phases": backfill_phases,
        "one_replay_phases": span_phases,
    }
    print(
        f"[round {number}] H={h}: backfill of {len(outcomes)} daily slices {backfill_s:.1f} s, one replay {span_s:.1f} s, "
        f"same output: {same}",
        flush=True,
    )

    with ThreadPoolExecutor(2) as pool:
        for h in sorted({min(days), max(days)}):
            copy = here / f"h{h}" / "step"
            for name in (*SIDES, "idx_index"):
                shutil.copytree(root / f"h{h}" / name, copy / name)
            spec = job(copy, copy / "idx")  # its index is current: written up to the end-of-stream commits
            period = h * w.commits_per_day + 2
            record["index_step"][str(h)] = {}
            for k in steps:
                with _writing(spark):
                    _append_periods(spark, pool, copy, range(period, period + k), w)
                period += k
                plan = bind(spark, spec)
                phase = {}
                with phases.recording(phase):
                    seconds, _ = _timed(lambda plan=plan: index.update(spark, plan))
                record["index_step"][str(h)][str(k)] = {"s": round(seconds, 3), "phases": phase}
                print(
                    f"[round {number}] H={h}: index step for {k} new commit(s) per table {seconds:.1f} s",
                    flush=True,
                )
    return record


# ---------------------------------------------------------------------------- the summary and report


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def summarize(saved: dict) -> dict:
    """Medians over rounds: seconds, and ratios taken within each round."""
    rounds, days = saved["rounds"], saved["run"]["days"]
    smallest, largest = str(min(days)), str(max(days))
    summary: dict = {"day": {}, "backfill": None, "index_step": {}}
    for h in map(str, days):
        summary["day"][h] = {
            "s": _median(r["day"][h]["s"] for r in rounds),
            "ratio": _median(r["day"][h]["s"] / r["day"][smallest]["s"] for r in rounds),
            "rows_in": rounds[-1]["day"][h]["rows_in"],
            "rows_out": rounds[-1]["day"][h]["rows_out"],
        }
    b = [r["backfill"] for r in rounds]
    summary["backfill"] = {
        "days": b[0]["days"],
        "slices": b[0]["slices"],
        "s": _median(x["s"] for x in b),
        "one_replay_s": _median(x["one_replay_s"] for x in b),
        "ratio": _median(x["s"] / x["one_replay_s"] for x in b),
        "slice_s": _median(_median(x["slice_s"]) for x in b),
        "same_output": all(x["same_output"] for x in b),
        "rows_out": b[-1]["rows_out"],
    }
    for k in map(str, saved["run"]["steps"]):
        per = {h: _median(r["index_step"][h][k]["s"] / int(k) for r in rounds) for h in (smallest, largest)}
        summary["index_step"][k] = {
            "per_commit_s": per,
            "ratio": _median(
                (r["index_step"][largest][k]["s"] / r["index_step"][smallest][k]["s"]) for r in rounds
            ),
        }
    return summary


def _cell(value: float, target: float) -> str:
    return f"{value:.2f}" if value <= target else f"**{value:.2f}** (missed)"


def _phase_table(columns: dict[str, list[dict]]) -> list[str]:
    """Median seconds per phase over rounds, one column per measured call."""
    labels: dict[str, float] = defaultdict(float)
    for phases in columns.values():
        for p in phases:
            for label, seconds in p.items():
                labels[label] += seconds
    order = sorted(labels, key=lambda label: (label == "other", -labels[label]))
    lines = ["| phase | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label in order:
        cells = [f"{_median(p.get(label, 0.0) for p in phases):.2f}" for phases in columns.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    totals = [f"{_median(sum(p.values()) for p in phases):.2f}" for phases in columns.values()]
    lines.append("| **total** | " + " | ".join(totals) + " |")
    return lines


def write_report(path: Path, saved: dict) -> None:
    run, tables, rounds = saved["run"], saved["written"]["tables"], saved["rounds"]
    s = summarize(saved)
    days = run["days"]
    smallest, largest = str(min(days)), str(max(days))
    w = Workload(**run["workload"])
    b = s["backfill"]
    lines = [
        "# History length (tables of any age)",
        "",
        f"Run finished {run['finished']} ({run['minutes']} min: "
        + (
            f"tables reused from an earlier run that wrote them in {saved['written']['write_s'] / 60:.1f} min"
            if run["reused"]
            else f"tables {run['write_minutes']} min"
        )
        + f", measurements {run['measure_minutes']} min"
        + (" after an untimed warm-up replay" if run.get("warmup") else "")
        + f") on {run['machine']}; "
        f"{len(rounds)} rounds. Load average {run['load_before']} before, {run['load_after']} after: "
        "on a machine others may share, read the ratios (both sides of each ratio ran in the same round), "
        "not the seconds.",
        "",
        f"Workload: tables `l` and `r` (id, k, t, v; row tracking and change data feed on), {w.rate:,} rows an hour each, "
        f"one commit per table every {w.every} hours of event time ({w.per_commit:,} rows), keys from {w.keys:,} values, "
        "1 row in 100 up to 3 hours behind its commit's period. Job: `l LEFT JOIN r ON l.k = r.k`, r.t within "
        "[-10 min, +10 min] of l.t, grace 1 hour, `l.id AS lid, r.id AS rid`, exact mode.",
        "",
        "| history | commits per table | rows (l + r) | data files per table | last day: rows in | rows out |",
        "|---|---|---|---|---|---|",
    ]
    for h in map(str, days):
        t = tables[h]
        lines.append(
            f"| {h} d | {t['commits_per_table']:,} | {t['rows']:,} | {t['data_files_per_table']:,} | "
            f"{s['day'][h]['rows_in']:,} | {s['day'][h]['rows_out']:,} |"
        )
    lines += [
        "",
        f"## One daily slice against the history's length (target: {days[-1]} d / {days[0]} d within {TARGETS['day']})",
        "",
        "One exact replay of the history's last full day into a fresh output that has the job's arrival index "
        "(kept up to date once a day while the tables were written, as a daily job keeps it).",
        "",
        f"| history | replay s | t(H) / t({smallest} d) |",
        "|---|---|---|",
    ]
    for h in map(str, days):
        d = s["day"][h]
        lines.append(
            f"| {h} d | {d['s']:.1f} | {_cell(d['ratio'], TARGETS['day']) if h != smallest else '1.00'} |"
        )
    lines += [
        "",
        f"## A backfill of {b['slices']} daily slices against one replay of the same {b['slices']} days "
        f"(target: within {TARGETS['backfill']})",
        "",
        f"On the {b['days']}-day history, its last {b['slices']} days; each into a fresh output with the job's index.",
        "",
        "| slices | backfill s | one slice s (median) | one replay s | backfill / one replay | same rows |",
        "|---|---|---|---|---|---|",
        f"| {b['slices']} | {b['s']:.1f} | {b['slice_s']:.1f} | {b['one_replay_s']:.1f} | {_cell(b['ratio'], TARGETS['backfill'])} | "
        f"{'yes' if b['same_output'] else '**NO**'} ({b['rows_out']:,} rows) |",
        "",
        f"## The index step per new commit (target: constant; read here as {largest} d / {smallest} d within {TARGETS['index']})",
        "",
        "k new commits appended to each table of an up-to-date index, then `index.update` timed.",
        "",
        f"| new commits per table | s per commit, {smallest} d | s per commit, {largest} d | {largest} d / {smallest} d |",
        "|---|---|---|---|",
    ]
    for k, x in s["index_step"].items():
        lines.append(
            f"| {k} | {x['per_commit_s'][smallest]:.2f} | {x['per_commit_s'][largest]:.2f} | "
            f"{_cell(x['ratio'], TARGETS['index'])} |"
        )
    daily = saved["written"]["daily_index_s"]
    if len(daily) >= 2:
        week = max(1, min(7, len(daily) // 2))
        lines += [
            "",
            f"While the tables were written, the index was brought up to date once a day ({2 * w.commits_per_day} new "
            f"commits): median {_median(daily[1 : week + 1]):.1f} s over days 2 to {week + 1}, "
            f"{_median(daily[-week:]):.1f} s over the last {week} days (day 1 builds it: {daily[0]:.1f} s).",
        ]
    lines += [
        "",
        "## Where the time goes",
        "",
        "Median seconds per phase: each library function's own time (less the listed functions it called); "
        "Spark runs lazily, so a read is paid where its first action runs (for a replay, in "
        '"replay: scan and tally").',
        "",
    ]
    columns = {
        f"day replay {h} d": [r["day"][h]["phases"] for r in rounds]
        for h in dict.fromkeys([smallest, largest])
    }
    columns[f"backfill {b['slices']} d"] = [r["backfill"]["phases"] for r in rounds]
    columns[f"one replay {b['slices']} d"] = [r["backfill"]["one_replay_phases"] for r in rounds]
    k = str(max(run["steps"]))
    for h in dict.fromkeys([smallest, largest]):
        columns[f"index step k={k}, {h} d"] = [r["index_step"][h][k]["phases"] for r in rounds]
    lines += _phase_table(columns)
    lines.append("")
    path.write_text("\n".join(lines))
    print(f"report: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.history", description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", default="1,7,28", help="history lengths in days (default 1,7,28)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds; medians are reported")
    parser.add_argument(
        "--rate", type=int, default=Workload.rate, help="rows per hour per table (default 2000)"
    )
    parser.add_argument(
        "--every", type=int, default=Workload.every, help="hours of event time per commit (default 2)"
    )
    parser.add_argument(
        "--steps", default="1,10", help="new commits per table for the index step (default 1,10)"
    )
    parser.add_argument(
        "--backfill-days", type=int, default=7, help="daily slices of the backfill (default 7)"
    )
    parser.add_argument("--work", default="build/bench/history", help="scratch folder for the Delta tables")
    parser.add_argument("--out", default=str(BENCH / "results"), help="where history.json and history.md go")
    parser.add_argument("--fresh", action="store_true", help="rewrite the tables even if --work holds them")
    parser.add_argument(
        "--no-warmup", action="store_true", help="skip the untimed warm-up replay (smoke tests)"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite history.md from <out>/history.json"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report_only:
        write_report(out / "history.md", json.loads((out / "history.json").read_text()))
        return 0
    days = sorted({int(d) for d in args.days.split(",")})
    steps = sorted({int(k) for k in args.steps.split(",")})
    if 24 % args.every or not days or days[0] < 1 or args.rounds < 1:
        parser.error("--every must divide 24, --days be positive, --rounds at least 1")
    w = Workload(rate=args.rate, every=args.every)
    work = Path(args.work).resolve()
    began = time.perf_counter()
    load_before = [round(x, 1) for x in os.getloadavg()]
    spark = get_spark(app_name="streamjoin-bench-history")

    manifest = work / "tables" / "manifest.json"
    wanted = {"layout": LAYOUT, "workload": asdict(w), "days": days}
    written = json.loads(manifest.read_text()) if manifest.exists() and not args.fresh else None
    reused = written is not None and written.get("wanted") == wanted
    if not reused:
        print(
            f"[write] {max(days)} days of {w.rate:,} rows an hour per table, copies at {days[:-1]} days",
            flush=True,
        )
        written = write_histories(spark, w, days, work / "tables")
        written["wanted"] = wanted
        manifest.write_text(json.dumps(written, indent=1))
    write_minutes = round((time.perf_counter() - began) / 60, 1)

    runs = work / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    if (
        not args.no_warmup
    ):  # untimed: the first replay of a process pays for warming the JVM up (code loading, JIT)
        h = min(days)
        _with_index(work / "tables", h, runs / "warmup")
        replay(
            spark,
            job(work / "tables" / f"h{h}", runs / "warmup"),
            _day(h - 1),
            _day(h),
            RunOptions(mode="exact", versions=written["tables"][str(h)]["versions"]),
        )
    phases = Phases().install()
    measured = time.perf_counter()
    try:
        rounds = [
            measure_round(
                spark,
                phases,
                w,
                days,
                work / "tables",
                runs,
                written["tables"],
                i + 1,
                steps,
                args.backfill_days,
            )
            for i in range(args.rounds)
        ]
    finally:
        phases.uninstall()
    run = {
        "finished": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "minutes": round((time.perf_counter() - began) / 60, 1),
        "write_minutes": write_minutes,
        "measure_minutes": round((time.perf_counter() - measured) / 60, 1),
        "reused": reused,
        "warmup": not args.no_warmup,
        "machine": machine(),
        "load_before": load_before,
        "load_after": [round(x, 1) for x in os.getloadavg()],
        "days": days,
        "steps": steps,
        "workload": asdict(w),
        "command": "python -m bench.history " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    saved = {"run": run, "written": written, "rounds": rounds}
    saved["summary"] = summarize(saved)
    out.mkdir(parents=True, exist_ok=True)
    (out / "history.json").write_text(json.dumps(saved, indent=1))
    write_report(out / "history.md", saved)
    return 0 if saved["summary"]["backfill"]["same_output"] else 1


if __name__ == "__main__":
    sys.exit(main())
