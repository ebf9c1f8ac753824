"""Window joins (TUMBLE, HOP) end to end on Delta tables, in both runners, and the jobs they refuse.

1. RisingWave's window-join query (003: `TUMBLE(s1, ts, INTERVAL '1' MINUTE) JOIN TUMBLE(s2, ...)
   ON s1.id = s2.id AND s1.window_start = s2.window_start`, watermarks 20 s behind) as FULL, on
   the rows of docs/design-window-joins.md's Example 1 (the seed prints no data): the live runner
   run between the commits writes what the exact replay writes, row for row with the windows,
   and both account for every input row as the example says.
2. A HOP window (10 minutes, size 30), LEFT: a row lies in three windows, pairs once per shared
   window and is padded once per window without a partner (the design's Example 2).
3. Window jobs that cannot run fail before any data moves, saying what to change.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from conftest import append, at
from harness import live_accounting, read, source_counts
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType

from streamjoin import kernel
from streamjoin.errors import JobError, UnsupportedJobError
from streamjoin.plan import bind, describe
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay
from streamjoin.spec import spec_from_dict

TEN = 10 * 3600  # 10:00:00 on the test clock (seconds after BASE)
ROWS = StructType(
    [
        StructField("id", IntegerType()),
        StructField("value", IntegerType()),
        StructField("ts", TimestampType()),
    ]
)


def clock(minute: int, second: int) -> int:
    return TEN + 60 * minute + second


# ============================================================================ 1. RisingWave's TUMBLE

# Example 1: (source, id, value, 10:MM:SS), one commit each; the last is a heartbeat (NULL id:
# rejected, yet it moves its source's clock, so every row before it is settled).
TUMBLE_COMMITS = [
    ("s1", 1, 10, (0, 5)),
    ("s2", 1, 100, (0, 50)),
    ("s1", 1, 12, (0, 40)),
    ("s2", 2, 200, (0, 59)),
    ("s1", 2, 20, (1, 0)),
    ("s1", 1, 11, (1, 10)),
    ("s2", 1, 101, (1, 30)),
    ("s1", 3, 30, (1, 35)),
    ("s2", 3, 300, (2, 5)),
    ("s1", 7, 70, (3, 30)),
    ("s2", 8, 800, (3, 31)),
    ("s1", None, None, (3, 31)),
]
LIVE_RUNS = (5, 8, len(TUMBLE_COMMITS) - 1)  # after commits 6, 9 and the heartbeat
# (id1, value1, id2, value2, window_start minute, event time): three pairs, four padded rows.
TUMBLE_FULL = Counter(
    {
        (1, 10, 1, 100, 0, clock(0, 50)): 1,
        (1, 12, 1, 100, 0, clock(0, 50)): 1,
        (1, 11, 1, 101, 1, clock(1, 30)): 1,
        (None, None, 2, 200, 0, clock(0, 59)): 1,
        (2, 20, None, None, 1, clock(1, 0)): 1,
        (3, 30, None, None, 1, clock(1, 35)): 1,
        (None, None, 3, 300, 2, clock(2, 5)): 1,
    }
)
TUMBLE_ACCOUNTING = {
    "s1": {"rows_in": 7, "rejected": 1, "late": 0, "joined": 3, "unmatched_emitted": 2, "unmatched_dropped": 0, "open": 1, "unsettled": 0},
    "s2": {"rows_in": 5, "rejected": 0, "late": 0, "joined": 2, "unmatched_emitted": 2, "unmatched_dropped": 0, "open": 1, "unsettled": 0},
}  # fmt: skip


def tumble_spec(root, runner: str):
    return spec_from_dict(
        {
            "name": f"risingwave_tumble_{runner}",
            "sources": {name: {"path": str(root / name), "time": "ts"} for name in ("s1", "s2")},
            "from": "s1",
            "joins": [
                {
                    "join": "s2",
                    "type": "full",
                    "on": "s1.id = s2.id AND s1.window_start = s2.window_start",
                    "window": {"tumble": "1m"},
                    "grace": "20s",
                }
            ],
            "select": [
                "s1.id AS id1",
                "s1.value AS value1",
                "s2.id AS id2",
                "s2.value AS value2",
                "coalesce(s1.window_start, s2.window_start) AS window_start",
                "coalesce(s1.window_end, s2.window_end) AS window_end",
            ],
            "output": {"path": str(root / f"out_{runner}")},
        }
    )


def tumble_rows(rows) -> Counter:
    found = Counter()
    for r in rows:
        assert (r.window_end - r.window_start).total_seconds() == 60, r
        minute = int((r.window_start - at(TEN)).total_seconds() // 60)
        found[(r.id1, r.value1, r.id2, r.value2, minute, int((r.event_time - at(0)).total_seconds()))] += 1
    return found


@pytest.fixture(scope="module")
def tumble(spark, tmp_path_factory):
    """Example 1's commits, with live runs of the FULL join between them, and an exact replay."""
    root = tmp_path_factory.mktemp("risingwave_tumble")
    live = tumble_spec(root, "live")
    runner, written = None, {}
    for index, (source, key, value, (minute, second)) in enumerate(TUMBLE_COMMITS):
        append(spark, root / source, [(key, value, at(clock(minute, second)))], ROWS)
        if index in LIVE_RUNS:
            runner = runner or LiveRunner(spark, live, str(root / "checkpoint"))
            runner.run(900)
            written[index] = tumble_rows(read(spark, live.output.location))
    spec = tumble_spec(root, "replay")
    metrics = replay(spark, spec, at(TEN), at(TEN + 600), RunOptions(mode="exact"))
    return SimpleNamespace(live=live, written=written, replay=spec, metrics=metrics)


def test_risingwave_tumble_replayed(spark, tumble):
    """Id 2 (10:00:59 and 10:01:00) and id 3 (10:01:35 and 10:02:05) lie in different windows: no
    pair, each side padded when its window closes; ids 7 and 8 wait for theirs to close."""
    assert tumble_rows(read(spark, tumble.replay.output.location)) == TUMBLE_FULL
    assert tumble.metrics.balanced()
    assert source_counts(tumble.metrics) == TUMBLE_ACCOUNTING
    assert tumble.metrics.rows_out == sum(TUMBLE_FULL.values())


def test_risingwave_tumble_live_writes_what_the_replay_writes(spark, tumble):
    assert tumble_rows(read(spark, tumble.live.output.location)) == TUMBLE_FULL
    # After commit 6 only commits 1-4 are settled (s2 has nothing newer): clock 10:00:59, window
    # 10:00 still open, only its pairs are out. After commit 9 commits 1-8 are (clock 10:01:35,
    # watermark 10:01:15): window 10:00 has closed and id 2's right row is padded.
    pairs = Counter({k: n for k, n in TUMBLE_FULL.items() if k[0] is not None and k[2] is not None})
    assert tumble.written[LIVE_RUNS[0]] == {k: n for k, n in pairs.items() if k[4] == 0}
    assert tumble.written[LIVE_RUNS[1]] == pairs + Counter({(None, None, 2, 200, 0, clock(0, 59)): 1})
    accounting, _ = live_accounting(spark, tumble.live.output.location)
    assert accounting == TUMBLE_ACCOUNTING


# ============================================================================ 2. HOP, LEFT

KEYED = StructType(
    [StructField("name", StringType()), StructField("key", IntegerType()), StructField("t", TimestampType())]
)
# Example 2: (source, row, key, 10:MM), one commit each; the last is a heartbeat.
HOP_COMMITS = [
    ("persons", "P2", 2, 5),
    ("persons", "P1", 1, 12),
    ("auctions", "a1", 1, 25),
    ("auctions", "a2", 1, 41),
    ("persons", "P3", 3, 89),
    ("auctions", "a3", 9, 90),
    ("persons", None, None, 90),
]
# (person, auction, window start minute after 10:00, event time minute): P1 and a1 share two
# windows; P1 is padded in its third, P2 in all three; a2 shares no window with P1.
HOP_LEFT = Counter(
    {
        ("P1", "a1", 0, 25): 1,
        ("P1", "a1", 10, 25): 1,
        ("P1", None, -10, 12): 1,
        ("P2", None, -20, 5): 1,
        ("P2", None, -10, 5): 1,
        ("P2", None, 0, 5): 1,
    }
)
HOP_ACCOUNTING = {
    "persons": {"rows_in": 4, "rejected": 1, "late": 0, "joined": 1, "unmatched_emitted": 1, "unmatched_dropped": 0, "open": 1, "unsettled": 0},
    "auctions": {"rows_in": 3, "rejected": 0, "late": 0, "joined": 1, "unmatched_emitted": 0, "unmatched_dropped": 1, "open": 1, "unsettled": 0},
}  # fmt: skip


def hop_spec(root, runner: str):
    return spec_from_dict(
        {
            "name": f"hop_{runner}",
            "sources": {name: {"path": str(root / name), "time": "t"} for name in ("persons", "auctions")},
            "from": "persons",
            "joins": [
                {
                    "join": "auctions",
                    "type": "left",
                    "on": "persons.key = auctions.key",
                    "window": {"hop": "10m", "size": "30m"},
                    "grace": "5m",
                }
            ],
            "select": ["persons.name AS person", "auctions.name AS auction", "persons.window_start"],
            "output": {"path": str(root / f"out_{runner}")},
        }
    )


def hop_rows(rows) -> Counter:
    return Counter(
        (
            r.person,
            r.auction,
            int((r.window_start - at(TEN)).total_seconds() // 60),
            int((r.event_time - at(TEN)).total_seconds() // 60),
        )
        for r in rows
    )


def test_a_hopping_window_pairs_and_pads_per_window(spark, tmp_path):
    """Replayed and live (one available-now run after every commit): the same rows, per window."""
    for source, name, key, minute in HOP_COMMITS:
        append(spark, tmp_path / source, [(name, key, at(TEN + 60 * minute))], KEYED)
    spec = hop_spec(tmp_path, "replay")
    metrics = replay(spark, spec, at(TEN - 3600), at(TEN + 3 * 3600), RunOptions(mode="exact"))
    assert hop_rows(read(spark, spec.output.location)) == HOP_LEFT
    assert source_counts(metrics) == HOP_ACCOUNTING
    live = hop_spec(tmp_path, "live")
    LiveRunner(spark, live, str(tmp_path / "checkpoint")).run(900)
    assert hop_rows(read(spark, live.output.location)) == HOP_LEFT
    accounting, _ = live_accounting(spark, live.output.location)
    assert accounting == HOP_ACCOUNTING


# ============================================================================ 3. refused


def window_job(root, join: dict, sources: dict | None = None) -> dict:
    return {
        "name": "refused",
        "sources": sources or {name: {"path": str(root / name), "time": "ts"} for name in ("s1", "s2")},
        "from": "s1",
        "joins": [{"join": "s2", "on": "s1.id = s2.id", **join}],
        "output": {"path": str(root / "out")},
    }


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ({"window": {"tumble": "1m"}, "within": "1m"}, "give either 'window'"),
        ({"window": {"hop": "10m", "size": "25m"}}, "size 25m is not a multiple of hop 10m"),
        ({"window": {"hop": "10m"}}, "takes both 'hop' and 'size'"),
        ({"window": {"tumble": "1m", "size": "2m"}}, "takes only its size"),
        ({"window": {"tumble": "0s"}}, "must be positive"),
        ({"window": {"tumble": "1m"}, "emit": "eager"}, "remove 'emit: eager'"),
        ({"window": "1m"}, "is not a mapping"),
    ],
)
def test_window_settings_are_refused_before_any_data_moves(tmp_path, join, message):
    with pytest.raises(JobError, match=message):
        spec_from_dict(window_job(tmp_path, join))


def test_a_window_join_with_a_table_is_refused(tmp_path):
    sources = {
        "s1": {"path": str(tmp_path / "s1"), "time": "ts"},
        "s2": {"path": str(tmp_path / "s2"), "kind": "table", "key": ["id"]},
    }
    with pytest.raises(JobError, match="window joins pair rows of two streams"):
        spec_from_dict(window_job(tmp_path, {"window": {"tumble": "1m"}}, sources))


def test_window_jobs_the_sources_refuse(spark, tmp_path):
    """What `explain` says of a window join; refused: a source column named like a window column,
    a window join in a chain, equating a start with an end, a window join without a key equality."""
    for name in ("s1", "s2", "s3"):
        append(spark, tmp_path / name, [(1, 1, at(0))], ROWS)
    append(spark, tmp_path / "w", [(1, at(0), at(0))], StructType([StructField("id", IntegerType()), StructField("window_start", TimestampType()), StructField("ts", TimestampType())]))  # fmt: skip
    tumble_ = {"window": {"tumble": "1m"}}
    hopping = describe(
        bind(spark, spec_from_dict(window_job(tmp_path, {"window": {"hop": "1m", "size": "3m"}})))
    )
    assert "1. INNER JOIN s2 [window] ON s1.id = s2.id" in hopping
    assert "time windows: HOP 1m SIZE 3m (each row in 3 window(s)" in hopping
    clash = window_job(tmp_path, tumble_, {"s1": {"path": str(tmp_path / "w"), "time": "ts"}, "s2": {"path": str(tmp_path / "s2"), "time": "ts"}})  # fmt: skip
    with pytest.raises(JobError, match="column 'window_start' would be hidden"):
        bind(spark, spec_from_dict(clash))
    crossed = window_job(tmp_path, {**tumble_, "on": "s1.id = s2.id AND s1.window_start = s2.window_end"})
    with pytest.raises(JobError, match="equate like with like"):
        bind(spark, spec_from_dict(crossed))
    keyless = window_job(tmp_path, {**tumble_, "on": "s1.window_start = s2.window_start"})
    with pytest.raises(JobError, match="needs one"):
        bind(spark, spec_from_dict(keyless))
    chain = window_job(tmp_path, tumble_)
    chain["sources"]["s3"] = {"path": str(tmp_path / "s3"), "time": "ts"}
    chain["joins"].append({"join": "s3", "on": "s2.id = s3.id", "within": "1m"})
    with pytest.raises(UnsupportedJobError, match="cannot follow the window join"):
        kernel.family(bind(spark, spec_from_dict(chain)))
