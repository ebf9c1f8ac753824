"""Tables of any age: jobs that begin at a start version of sources weeks old, before and after
OPTIMIZE, VACUUM and log clean-up, run live, replayed and backfilled from the CLI.

The sources are real Delta tables whose commits are dated 40 days back to today (tests/aging.py),
so Delta itself refuses to read their early change feed, as it would on a production table.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from types import SimpleNamespace

import pytest
import yaml
from aging import age_table, vacuum, write_commits
from conftest import at
from harness import (
    EVERYTHING,
    FIXED_GRACE,
    FIXED_HI,
    FIXED_HOW,
    FIXED_LO,
    FIXED_PARTS,
    SIDES,
    create_tables,
    events,
    job,
    read,
    read_output,
    read_side,
    with_output,
    write_commit,
)
from reference import Event, reference

from streamjoin import delta_io
from streamjoin.backfill import attempts, run_slice
from streamjoin.cli import main
from streamjoin.errors import HistoryNotRetainedError, JobError
from streamjoin.index import update
from streamjoin.jobfile import load_job
from streamjoin.plan import bind
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict
from streamjoin.timeutil import from_spark, to_micros

SCHEMA = "id string, k string, t timestamp, v int"
ROW_TRACKING = {"delta.enableRowTracking": "true"}
NOW = datetime.now(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None)
DAY = timedelta(days=1)


def day(n: float) -> datetime:
    """`n` days from this hour (negative: in the past), naive UTC, whole seconds."""
    return NOW + timedelta(days=n)


def commit_plan(seed: int) -> dict[str, list[tuple[datetime, list[tuple]]]]:
    """Per side, commits from 40 days back to a few hours ago: rows near their commit time, some
    hours late (grace is 1h), some with a NULL key."""
    rng = random.Random(seed)
    times = [
        day(-40),
        day(-39),
        *[day(-30 + 5 * i) for i in range(5)],
        *[day(-4 + 0.5 * i) for i in range(8)],
    ]
    plan, n = {}, 0
    for side, name in enumerate(SIDES):
        commits = []
        for when in times:
            when = when - timedelta(minutes=7 * side)  # interleave the two tables
            rows = []
            for _ in range(rng.randint(1, 3)):
                n += 1
                lateness = rng.choice([0, 0, 0, 10, 30, 200]) * 60
                key = rng.choice(["a", "b", "c", None] if rng.random() < 0.1 else ["a", "b", "c"])
                rows.append((f"{name}{n}", key, when - timedelta(seconds=lateness), rng.randint(0, 2)))
            commits.append((when, rows))
        plan[name] = commits
    return plan


def job_file(tmp_path, name: str, paths: dict[str, str], output: str, start_at: str | None) -> str:
    document = {
        "name": name,
        "from": "l",
        "start_at": start_at,
        "sources": {side: {"path": paths[side], "time": "t"} for side in SIDES},
        "joins": [{"join": "r", "type": "left", "on": "l.k = r.k", "within": "1h", "grace": "1h"}],
        "select": ["l.id AS lid", "r.id AS rid"],
        "output": {"path": output},
        "schedule": {"every": "1d"},
    }
    if start_at is None:
        del document["start_at"]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def cli(*args: str) -> int:
    return main(list(args))


def outputs(spark, root: str, names: tuple[str, ...]) -> dict[str, Counter]:
    return {n: read_output(spark, f"{root}/{n}") for n in names}


def since(rows: Counter, start: datetime) -> Counter:
    """The output rows whose output time lies at or after `start` (read_output gives seconds after BASE)."""
    cut = int((start - at(0)).total_seconds())
    return Counter({row: n for row, n in rows.items() if row[2] >= cut})


AGED = {**ROW_TRACKING, "delta.enableChangeDataFeed": "true"}
EVERYTHING_SINCE = (day(-60), day(2))  # wider than the tables' history


def chain_spec(paths: dict[str, str], output: str):
    """`l LEFT JOIN r WITHIN 1h` then `LEFT JOIN c WITHIN 1h` from day -4."""
    return spec_from_dict(
        {
            "name": "aged_chain",
            "start_at": day(-4).isoformat() + "Z",
            "sources": {name: {"path": paths[name], "time": "t"} for name in ("l", "r", "c")},
            "from": "l",
            "joins": [
                {"join": "r", "type": "left", "on": "l.k = r.k", "within": "1h", "grace": "1h"},
                {"join": "c", "type": "left", "on": "l.k = c.k", "within": "1h", "grace": "2h"},
            ],
            "select": ["l.id AS lid", "r.id AS rid", "c.id AS cid"],
            "output": {"path": output},
        }
    )


def table_rows(spark, location: str) -> Counter:
    """A table's rows, every column, as a multiset."""
    return Counter(tuple(r) for r in read(spark, location))


def replayed_chain(spark, root, paths: dict[str, str], name: str, cut: datetime | None = None) -> Counter:
    """The chain replayed into `name` over everything since the start (in two slices cut at `cut`); its rows."""
    spec = chain_spec(paths, f"{root}/{name}")
    for start, end in pairwise(
        EVERYTHING_SINCE if cut is None else (EVERYTHING_SINCE[0], cut, EVERYTHING_SINCE[1])
    ):
        replay(spark, spec, start, end)
    return table_rows(spark, f"{root}/{name}")


def live_chain(spark, root, paths: dict[str, str]) -> Counter:
    """The chain live from its start (one catch-up step); its rows."""
    spec = chain_spec(paths, f"{root}/chain_live")
    LiveRunner(spark, spec, f"{root}/chain_checkpoint").run(900)
    return table_rows(spark, spec.output.location)


def run_everything(spark, root, paths, tag: str, runs=("live", "day", "days", "all")) -> dict[str, Counter]:
    """From the CLI, those of `runs` asked for: live from day -4, a replay of the last day, a
    backfill of the last 3 days, a replay of everything since the start; their outputs (rows per
    output table)."""
    start = day(-4).isoformat() + "Z"
    jobs = {n: job_file(root, f"{tag}_{n}", paths, f"{root}/{tag}_{n}", start) for n in runs}
    if "live" in jobs:
        assert cli("stream", jobs["live"], "--checkpoint", f"{root}/{tag}_checkpoint") == 0
    if "day" in jobs:
        assert cli("replay", jobs["day"], "--start", day(-1).isoformat(), "--end", day(1).isoformat()) == 0
    if "days" in jobs:
        assert (
            cli(
                "backfill",
                jobs["days"],
                "--start",
                day(-3).date().isoformat(),
                "--end",
                (day(1)).date().isoformat(),
                "--no-validate",
            )
            == 0
        )
    if "all" in jobs:
        start, end = (when.isoformat() for when in EVERYTHING_SINCE)
        assert cli("replay", jobs["all"], "--start", start, "--end", end) == 0
    return outputs(spark, str(root), tuple(f"{tag}_{n}" for n in runs))


@pytest.fixture(scope="module")
def aged(spark, tmp_path_factory):
    """Three row-tracked stream tables whose first commit is 40 days old (default retention
    properties), and what the jobs on them write while they are young, then after months of
    production (OPTIMIZE, VACUUM, a log that keeps only the last 5 days): two-table jobs from the
    CLI, the young jobs again, and a chain of the three."""
    root = tmp_path_factory.mktemp("aged")
    plan = commit_plan(7)
    plan["c"] = [  # a third stream, its commits a few minutes before l's
        (when - timedelta(minutes=3), [("c" + row[0][1:], *row[1:]) for row in rows])
        for when, rows in commit_plan(12)["l"]
    ]
    paths = {}
    for name, commits in plan.items():
        paths[name] = str(root / name)
        write_commits(spark, paths[name], commits, SCHEMA, AGED)
    with pytest.raises(
        Exception, match="DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION"
    ):
        delta_io.read_changes(spark, paths["l"], 3, 0).collect()  # what every run did before the index

    # While young: live and a replay of everything, and the chain live (the day's replay, the
    # backfill and the chain's replays run once, on the aged tables below, against the young live
    # outputs: the harder case, the same checks).
    young = run_everything(spark, root, paths, "young", runs=("live", "all"))
    young_chain = live_chain(spark, root, paths)
    for name in paths.values():
        age_table(spark, name, log_retention="interval 5 days")
    retained = {name: delta_io.oldest_retained(spark, paths[name]).version for name in SIDES}
    # A job indexed before replays again from its index (which outlived Delta's log).
    start, end = (when.isoformat() for when in EVERYTHING_SINCE)
    assert cli("replay", f"{root}/young_all.yaml", "--start", start, "--end", end) == 0
    young_again = read_output(spark, f"{root}/young_all")
    return SimpleNamespace(
        root=root,
        paths=paths,
        young=young,
        retained=retained,
        young_again=young_again,
        aged=run_everything(spark, root, paths, "aged"),
        young_chain=young_chain,
        aged_chain={
            "whole": replayed_chain(spark, root, paths, "chain_whole"),
            "sliced": replayed_chain(spark, root, paths, "chain_sliced", cut=day(-2)),
        },
    )


def test_jobs_start_on_a_forty_day_old_table_and_survive_its_aging(spark, tmp_path, aged):
    root, paths = aged.root, aged.paths
    live, everything = (aged.young[f"young_{n}"] for n in ("live", "all"))
    assert sum(live.values()) >= 10 and any(r[1] is None for r in live) and any(r[1] for r in live)
    assert live == everything, "the live run differs from the exact replay of everything since the start"
    late = read_side(spark, f"{root}/young_live_late")
    assert late and late == read_side(spark, f"{root}/young_all_late")

    # After OPTIMIZE, VACUUM and the log clean-up ...
    assert all(version > 2 for version in aged.retained.values()), "the early log was not cleaned up"
    # ... the jobs indexed before keep working from their index (it outlived Delta's log) ...
    assert aged.young_again == everything
    # ... and new jobs starting at the same time give the rows the young live run wrote.
    assert aged.aged["aged_live"] == live and aged.aged["aged_all"] == everything
    assert since(live, day(-1)) == aged.aged["aged_day"], "the last day's replay differs from the live output"
    cut = datetime.combine(day(-3).date(), datetime.min.time())
    assert since(live, cut) == aged.aged["aged_days"], "the 3-day backfill differs from the live output"
    # A new job without a start cannot begin at version 0 any more, and says what to do.
    no_start = job_file(tmp_path, "nostart", paths, f"{root}/nostart", None)
    with pytest.raises(JobError, match="no longer holds version 0.*start_at"):
        update(spark, bind(spark, load_job(no_start)))
    assert cli("index", no_start, "--from", "l=0,r=0") == 2
    assert cli("index", no_start, "--from", day(-2).isoformat()) == 0


def test_a_chain_of_three_streams_on_forty_day_old_tables_before_and_after_aging(aged):
    """The chain of `chain_spec` on the three tables: the live run while they were young (one
    catch-up step) equals the replay of everything since the start after OPTIMIZE, VACUUM and log
    clean-up, and two slices replayed apart then add up to it (each reads its pinned snapshot
    filtered on the margins of both links)."""
    whole = aged.aged_chain["whole"]
    assert sum(whole.values()) >= 10 and any(r[1] is None for r in whole) and any(r[2] for r in whole)
    assert aged.young_chain == whole, "the young live run differs from the exact replay of the aged tables"
    assert aged.aged_chain["sliced"] == whole, "two slices differ from one replay"


def test_a_stream_source_that_rewrites_rows_is_refused(spark, tmp_path):
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("l1", "a", 1, 0), ("l2", "b", 2, 0)])
    write_commit(spark, paths[1], [("r1", "a", 1, 0)])
    spec = job(tmp_path, paths, "left", -5, 5, 0)
    replay(spark, spec, *EVERYTHING)
    spark.sql(f"DELETE FROM delta.`{paths[0]}` WHERE id = 'l2'")
    with pytest.raises(JobError, match="append-only, but version 2 is a DELETE"):
        replay(spark, spec, *EVERYTHING)


def test_without_row_tracking_a_slice_reads_only_the_change_files_it_needs(spark, tmp_path):
    """The change-feed path: a slice reads the versions the index says can hold its rows, so the
    files OPTIMIZE and VACUUM removed since do not matter to it; a replay that needs them says what
    to change."""
    paths = {}
    for side, name in enumerate(SIDES):
        paths[side] = str(tmp_path / name)
        spark.createDataFrame([], SCHEMA).write.format("delta").option(
            "delta.enableRowTracking", "false"
        ).save(paths[side])
    write_commit(
        spark, paths[0], [("l1", "a", 10, 0), ("l1b", "a", 11, 0)], files=2
    )  # two files: OPTIMIZE merges them
    write_commit(spark, paths[1], [("r1", "a", 12, 0), ("r1b", "a", 13, 0)], files=2)
    spec = job(tmp_path, paths, "left", -5, 5, 0)
    replay(spark, spec, *EVERYTHING)  # the job's index now holds versions 0 and 1
    for side in (0, 1):
        spark.sql(f"OPTIMIZE delta.`{paths[side]}`")
    for side in (0, 1):
        vacuum(spark, paths[side])
    write_commit(spark, paths[0], [("l2", "b", 500, 0)])
    write_commit(spark, paths[1], [("r2", "b", 501, 0)])
    write_commit(spark, paths[0], [("l3", "c", 2000, 0)])  # moves the frontier past r2
    assert not delta_io.row_tracking(spark, paths[0])

    replay(spark, spec, at(400), at(600))
    # (the first replay wrote nothing: r's rows were not settled then, and l's windows were open)
    assert read_output(spark, spec.output.path) == Counter({("l2", "r2", 501): 1})
    with pytest.raises(HistoryNotRetainedError, match="enableRowTracking"):
        replay(spark, spec, *EVERYTHING)


# ------------------------------------------------------------------------ live and slices from a start


def history_events(spark, paths, written, starts) -> list[Event]:
    """The reference's events: the job starts at one instant S, the latest of the sides' start
    commits; every row committed at or before S, on either side, is history and takes one shared
    position at S (they arrive at once: none is before another)."""
    times = {
        side: {c.version: to_micros(from_spark(c.timestamp)) for c in delta_io.history(spark, paths[side])}
        for side in (0, 1)
    }
    instant = max(times[side][starts[side]] for side in (0, 1))
    return [
        replace(e, pos=(instant, -1, -1)) if times[e.side][e.pos[2]] <= instant else e
        for e in events(spark, paths, written)
    ]


def test_live_equals_replay_and_slices_add_up_from_a_start_version(spark, tmp_path):
    """The fixed example (tests/harness.py) with its first part as history before the start: the
    live runner (catch-up, then micro-batches) equals the exact replay and the reference (history
    at the start's position), and two slices equal one replay."""
    how, lo, hi, grace = FIXED_HOW, FIXED_LO, FIXED_HI, FIXED_GRACE
    before = [(side, rows) for side, rows, _ in FIXED_PARTS[0]]
    after = [(side, rows) for part in FIXED_PARTS[1:] for side, rows, _ in part]
    cut, trigger = 12, 2
    root = tmp_path
    paths = create_tables(spark, root)
    versions, written = {0: 0, 1: 0}, []
    for side, rows in before:
        write_commit(spark, paths[side], rows)
        versions[side] += 1
        written.append((side, versions[side], rows))
    starts = dict(versions)
    spec = job(root, paths, how, lo, hi, grace)
    spec = replace(spec, sources=tuple(replace(s, start_at=starts[i]) for i, s in enumerate(spec.sources)))
    for i, (side, rows) in enumerate(after):
        write_commit(spark, paths[side], rows)
        versions[side] += 1
        written.append((side, versions[side], rows))
        if i == trigger:
            LiveRunner(spark, spec, f"{root}/checkpoint").run()
    LiveRunner(spark, spec, f"{root}/checkpoint").run()

    whole, sliced = with_output(spec, f"{root}/whole"), with_output(spec, f"{root}/sliced")
    replay(spark, whole, *EVERYTHING)
    replay(spark, sliced, EVERYTHING[0], at(cut))
    replay(spark, sliced, at(cut), EVERYTHING[1])
    expected, _ = reference(history_events(spark, paths, written, starts), lo, hi, grace, how)
    assert read_output(spark, f"{root}/whole") == expected, "the exact replay differs from the reference"
    assert read_output(spark, spec.output.path) == expected, "the live output differs from the exact replay"
    assert read_output(spark, f"{root}/sliced") == expected, "two slices differ from one replay"
    for side in ("late", "rejected"):
        assert read_side(spark, spec.output.side(side)) == read_side(spark, f"{root}/whole_{side}"), side


def test_a_vacuumed_source_is_reported_before_reading(spark, tmp_path):
    paths = create_tables(spark, tmp_path, row_tracking=True)  # replays read pinned snapshots
    write_commit(spark, paths[0], [("l1", "a", 1, 0)])
    write_commit(spark, paths[1], [("r1", "a", 1, 0)])
    write_commit(spark, paths[0], [("l2", "a", 2, 0)])
    write_commit(spark, paths[1], [("r2", "b", 100, 0)])  # moves the frontier past l2
    spec = job(tmp_path, paths, "left", -5, 5, 0)
    spark.sql(f"OPTIMIZE delta.`{paths[0]}`")
    vacuum(spark, paths[0])
    with pytest.raises(HistoryNotRetainedError, match="data file"):
        replay(spark, spec, *EVERYTHING, options=RunOptions(versions={"l": 2, "r": 1}))
    # A backfill slice whose files vanish after the backfill checked them: it stops the backfill
    # with the same message instead of being recorded as one more failed slice.
    with pytest.raises(HistoryNotRetainedError, match="data file"):
        run_slice(
            spark,
            spec,
            *EVERYTHING,
            options=RunOptions(versions={"l": 2, "r": 1}, validate=False, checked=True),
        )
    assert attempts(spark, spec) is None
    replay(spark, spec, *EVERYTHING)  # the latest versions are whole
    assert read_output(spark, spec.output.path) == Counter({("l1", "r1", 1): 1, ("l2", "r1", 2): 1})


def test_a_live_checkpoint_whose_next_commits_left_the_log_says_how_to_go_on(spark, tmp_path):
    """Live stopped after the first commits; later commits were written, then the log was cleaned
    up past them (a checkpoint left stopped longer than the log retention). Restarting it cannot
    read them: one streamjoin message says what to do, not Delta's page of Java frames."""
    plan = commit_plan(3)
    paths = {name: str(tmp_path / name) for name in SIDES}
    for name in SIDES:
        write_commits(
            spark, paths[name], plan[name][:2], SCHEMA, {**ROW_TRACKING, "delta.enableChangeDataFeed": "true"}
        )
    spec = load_job(job_file(tmp_path, "stopped", paths, str(tmp_path / "out"), None))
    checkpoint = str(tmp_path / "checkpoint")
    assert LiveRunner(spark, spec, checkpoint).run()
    for name in SIDES:
        write_commits(spark, paths[name], plan[name][2:7], SCHEMA)
        age_table(spark, paths[name], log_retention="interval 5 days")
        assert delta_io.oldest_retained(spark, paths[name]).version > 2
    with pytest.raises(HistoryNotRetainedError) as error:
        LiveRunner(spark, spec, checkpoint).run()
    message = str(error.value)
    assert "streamjoin handoff" in message and checkpoint in message
    assert "at org.apache" not in message and len(message) < 1200
