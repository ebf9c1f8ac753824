"""Runs the kernel (streamjoin/kernel.py) directly on in-memory DataFrames, many examples at once.

A property test of the join's decisions (lateness, watermarks, closing, padding) does not need
Delta tables or a streaming query: the kernel decides from rows tagged with their arrival positions
and a Timeline. Here the test plays the replay runner's part with the runner's own preparation
(`replay.ReplayPlan`'s margins and ranges, `replay.Read`, `replay.settled_up_to`) over in-memory
rows, a Timeline from `arrival.timeline` standing in for the arrival index, and hands the kernel
one step (the live runner's part calls `live.decide` itself).

Examples are stacked so that one kernel step decides hundreds of them: each example gets keys and
row ids of its own (so no row meets another example's), commit versions of its own (so each commit
keeps its own watermark), and its event times shifted so that its largest settled event time is the
same instant `PIVOT` in every example (so the one closing bound of the step, that largest time
minus grace, is each example's own). Lateness, matching and closing depend only on differences of
event times, so the shift changes nothing but the output times, which are shifted back.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

from conftest import BASE
from harness import BASE_MICROS, SCHEMA
from hypothesis import HealthCheck, Phase, assume
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType, TimestampType
from reference import LINK_BUCKETS, STREAM_BUCKETS, TABLE_BUCKETS, Change, Event

from streamjoin import arrival, changelog, kernel
from streamjoin.delta_io import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION
from streamjoin.frames import local_frame
from streamjoin.joins.base import MATCHED, Write
from streamjoin.metrics import LinkCounts, SourceCounts, links_balanced
from streamjoin.plan import Plan
from streamjoin.runners.live import PENDING, Batch, Progress, batch_commits, decide, table_input
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import Read, ReplayPlan, settled_up_to
from streamjoin.timeutil import from_micros

SETTINGS = {  # Hypothesis settings of the kernel-level tests (each test sets max_examples)
    "deadline": None,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
    "phases": [Phase.explicit, Phase.reuse, Phase.generate],  # shrinking re-runs Spark jobs
    "print_blob": True,
}


def slices_of(windows: list[tuple[int, int]]) -> arrival.Slices:
    """Consecutive slices given in UTC microseconds, as the replay hands them to the kernel."""
    return arrival.Slices.of(arrival.Slice(from_micros(a), from_micros(b)) for a, b in windows)


def replay_plan(plan: Plan, windows: Sequence[tuple[int, int]], mode: str, final: bool = False) -> ReplayPlan:
    """The replay runner's plan of consecutive slices `windows` (UTC microseconds), as
    `plan_replay` makes it but without versions to pin (the rows here are in memory): its margins,
    ranges and options are the runner's own."""
    pieces = tuple(arrival.Slice(from_micros(a), from_micros(b)) for a, b in windows)
    return ReplayPlan(plan, kernel.family(plan), pieces, RunOptions(mode=mode, closed=final), {})


@st.composite
def at_random(draw, strategy: st.SearchStrategy):
    """`strategy` without the example Hypothesis tries first in every run, its simplest: every
    choice at its minimum (each stacked example one commit of one row, the first join type, bounds
    0, no grace), the same degenerate history each time. A kernel-level replay costs about the same
    whatever it holds (its Spark jobs, not its rows), so a test whose few runs included that one
    spent a share of its time on a history that can find nothing new; rejected here, before any
    Spark work, every run a test pays for is drawn at random (docs/testing.md, "Example counts")."""
    assume(draw(st.integers(0, 2**32 - 1), label="not the simplest example") != 0)
    return draw(strategy)


PIVOT = 1_000_000  # seconds after BASE: every example's largest settled event time lands here
STRIDE = 10_000  # commit versions and commit seconds reserved per example
SETTLED = "_sj_test_settled"

Commit = tuple[int, list[tuple[str, str | None, int | None, int]]]  # (side, rows (id, key, seconds, v))

_ARRIVALS = StructType(
    [
        *SCHEMA.fields,
        StructField(COMMIT_VERSION, LongType()),
        StructField(COMMIT_TIMESTAMP, TimestampType()),
    ]
)
_ROWS = StructType([*_ARRIVALS.fields, StructField(SETTLED, BooleanType())])
_CHANGES = StructType(
    [
        *SCHEMA.fields,
        StructField(CHANGE_TYPE, StringType()),
        StructField(COMMIT_VERSION, LongType()),
        StructField(COMMIT_TIMESTAMP, TimestampType()),
    ]
)


@dataclass(frozen=True)
class Stacked:
    """Examples laid side by side: the kernel's input rows, and how to read its output back."""

    rows: dict[int, list[tuple]]  # side -> rows in _ROWS' shape, with the settled flag
    commits: list[arrival.CommitStats]  # settled commits of every example, in position order per example
    shift: dict[int, int]  # example -> seconds added to its event times
    events: list[list[Event]]  # example -> the reference's events (unshifted)
    any_settled: bool


def positioned(example: int, commits: Sequence[Commit]) -> list[Event]:
    """The reference's events of one example: commit j of side s at (j seconds, s, its version);
    row ids and keys carry the example's number, so that stacked examples never meet."""
    versions = {0: 0, 1: 0}
    events = []
    for j, (side, rows) in enumerate(commits):
        versions[side] += 1
        position = (_micros(example * STRIDE + j), side, example * STRIDE + versions[side])
        events += [
            Event(side, f"{example}/{i}", None if k is None else f"{example}:{k}", t, position, v)
            for i, k, t, v in rows
        ]
    return events


def stack(
    examples: Sequence[Sequence[Commit]],
    closed: bool = False,
    spread: bool = False,
    keyed: bool = True,
    align: int = 1,
) -> Stacked:
    """Lay out `examples` for one kernel step (see the module's docstring), BASE at
    `harness.BASE_MICROS`. `closed`: each example's input has ended, so all its rows are settled.
    `spread`: example e's largest time lands at PIVOT + e x STRIDE instead of PIVOT, so that
    examples lie far apart in time too (for joins without keys, CROSS; the step's one closing
    bound then fits only closed inputs). `keyed=False`: a join without keys (CROSS), in
    which a NULL key rejects nothing. `align`: shifts are multiples of it (seconds), so that time
    windows of that hop fall alike before and after the shift; an example's largest time then
    lands up to `align` before PIVOT (its clock at the step's end is PIVOT - shift)."""
    rows: dict[int, list[tuple]] = {0: [], 1: []}
    commits, shift, all_events, any_settled = [], {}, [], False
    for example, example_commits in enumerate(examples):
        events = positioned(example, example_commits)
        all_events.append(events)
        newest = arrival.newest_positions(arrival.CommitStats(e.pos, None, 1) for e in events)
        frontier = arrival.frontier(newest, 2)

        def accepted(e: Event) -> bool:
            return (e.key is not None or not keyed) and e.t is not None

        def settled(e: Event, frontier=frontier) -> bool:
            return closed or (frontier is not None and e.pos <= frontier)

        times = [e.t for e in events if accepted(e) and settled(e)]
        shift[example] = PIVOT + (example * STRIDE if spread else 0) - max(times) if times else 0
        shift[example] -= shift[example] % align
        any_settled = any_settled or bool(times)
        by_commit: dict[tuple[int, int, int], list[Event]] = {}
        for e in events:
            rows[e.side].append((*_arrival(e, shift[example]), settled(e)))
            if settled(e):
                by_commit.setdefault(e.pos, []).append(e)
        for position in sorted(by_commit):
            times_here = [e.t + shift[example] for e in by_commit[position] if accepted(e)]
            largest = BASE_MICROS + _micros(max(times_here)) if times_here else None
            commits.append(arrival.CommitStats(position, largest, 1))
    return Stacked(rows, commits, shift, all_events, any_settled)


def replay_step(
    spark: SparkSession,
    plan: Plan,
    stacked: Stacked,
    mode: str,
    windows: Sequence[tuple[int, int]] = (),
    final: bool = False,
) -> kernel.StepResult:
    """One kernel step over the settled rows of the stacked examples: a replay of everything, or
    with `windows` (consecutive slices, seconds after BASE, [start, end)) a replay of those slices
    together, given only the rows inside the join's margins around them, as the replay runner
    reads them. `final`: a replay of a closed input (stack the examples `closed`)."""
    sliced = [(BASE_MICROS + _micros(a), BASE_MICROS + _micros(b)) for a, b in windows]
    replay = replay_plan(plan, sliced, mode, final) if windows else None
    settled = {}
    for source in plan.streams:
        frame = local_frame(spark, stacked.rows[source.index], _ROWS)
        prepared = arrival.prepare(frame, source.index, source.raw_time(), source.event_time(), source.keys)
        accepted, _ = kernel.split_rejected(prepared)
        rows = accepted.where(F.col(SETTLED)).drop(SETTLED)
        if replay is not None:  # the rows the replay reads: in the join's margins around the slices
            rows = rows.where(arrival.in_reach(replay.ranges()[source.name], replay.span.micros()))
        settled[source.name] = rows
    before: dict[tuple[int, int], int | None] = {}
    through: dict[tuple[int, int], int | None] = {}
    for example_commits in _by_example(stacked.commits):
        line = arrival.timeline(example_commits, None)
        before.update(line.before)
        through.update(line.through)
    timeline = arrival.Timeline(
        before, BASE_MICROS + _micros(PIVOT) if stacked.any_settled else None, through
    )
    slices = arrival.ALL_TIME if replay is None else arrival.Slices.of(replay.slices)
    return kernel.step(spark, plan, kernel.StepInput(settled, timeline, mode, slices=slices, final=final))


def unstacked_output(output: DataFrame, stacked: Stacked) -> list[Counter]:
    """The step's output rows per example, as the reference writes them: (left id, right id, seconds)."""
    per_example: list[Counter] = [Counter() for _ in stacked.events]
    base = BASE_MICROS // 1_000_000
    for r in output.select("lid", "rid", F.unix_seconds("event_time").alias("t")).collect():
        example = int((r["lid"] or r["rid"]).split("/")[0])
        per_example[example][(r["lid"], r["rid"], r["t"] - base - stacked.shift[example])] += 1
    return per_example


DECIDED = ("late", "joined", "unmatched_emitted", "unmatched_dropped", "open")  # a step's own buckets


def assert_step_as_expected(
    result: kernel.StepResult, stacked: Stacked, expected: list, scenarios: Sequence, names=("l", "r")
) -> None:
    """One replay step over stacked scenarios wrote, per scenario, the rows the reference gives
    (`expected`: its (output, counts) per scenario), and counted its buckets summed over them."""
    got = unstacked_output(result.output, stacked)
    for example, ((output, _), actual) in enumerate(zip(expected, got, strict=True)):
        assert actual == output, f"scenario {example}: {scenarios[example]}"
    for side, name in enumerate(names):
        totals = {b: sum(counts[side][b] for _, counts in expected) for b in DECIDED}
        decided = result.counts[name]
        assert {b: getattr(decided, b) for b in DECIDED} == totals, name


def assert_slices_add_up(
    whole: kernel.StepResult, parts: list, stacked: Stacked, scenarios: Sequence, names=("l", "r")
) -> None:
    """Consecutive slices replayed apart wrote, per scenario, what the whole replay wrote, and
    their buckets add up to the whole's."""
    sliced = [unstacked_output(part.output, stacked) for part in parts]
    for example, expected in enumerate(unstacked_output(whole.output, stacked)):
        got = sum((piece[example] for piece in sliced), Counter())
        assert got == expected, f"scenario {example}: {scenarios[example]}"
    for name in names:
        for bucket in DECIDED:
            assert sum(getattr(part.counts[name], bucket) for part in parts) == getattr(
                whole.counts[name], bucket
            )


def batches(draw, events: Sequence[Event]) -> list[dict[int, int]]:
    """A cut of `events` into two to seven live micro-batches: how many of each side's next rows
    each batch brings (a commit may be cut, a batch may end inside one scenario and begin the
    next); batches without rows are dropped, as Spark runs none."""
    rows = {side: sum(1 for e in events if e.side == side) for side in (0, 1)}
    count = draw(st.integers(2, 7))
    cuts = {
        side: sorted(draw(st.lists(st.integers(0, rows[side]), min_size=count - 1, max_size=count - 1)))
        for side in (0, 1)
    }
    bounds = {side: [0, *cuts[side], rows[side]] for side in (0, 1)}
    drawn = [{side: bounds[side][i + 1] - bounds[side][i] for side in (0, 1)} for i in range(count)]
    return [b for b in drawn if any(b.values())]


@dataclass
class LiveRun:
    """What a sequence of live micro-batches decided, summed over the batches."""

    output: Counter
    counts: dict[int, dict[str, int]]  # side -> the reference's buckets
    frontiers: list[arrival.Position | None]


def laid_streams(examples: Sequence[Sequence[Commit]]) -> list[Event]:
    """Examples of two streams laid end to end as one history (see BAND below): example e's
    commits come e x BAND seconds later in commit time and its event times e x BAND seconds
    later; ids and keys carry its number. Until example e + 1's times pass them, its rows see
    only its own history; the clock's jump then closes what is still open."""
    versions = {0: 0, 1: 0}
    events = []
    for example, commits in enumerate(examples):
        shift = example * BAND
        for j, (side, rows) in enumerate(commits):
            versions[side] += 1
            position = (_micros(shift + j), side, versions[side])
            events += [
                Event(
                    side,
                    f"{example}/{i}",
                    None if k is None else f"{example}:{k}",
                    None if t is None else t + shift,
                    position,
                    v,
                )
                for i, k, t, v in rows
            ]
    return events


def live_steps(
    spark: SparkSession,
    plan: Plan,
    events: list[Event],
    batches: Sequence[dict[int, int]],
    history_end: arrival.Position | None = None,
) -> LiveRun:
    """Run `events` (one example, or examples laid end to end) through the live runner's `decide`, micro-batch by
    micro-batch: batch i brings the next `batches[i][side]` rows of each side in arrival order (a
    commit may be cut between batches, as maxFilesPerTrigger cuts it). The state a batch leaves
    is collected and handed to the next as new DataFrames, as the runner's parquet state would be.
    `history_end`: the last position of the job's history (events at or before it are history)."""
    rows = {side: sorted((e for e in events if e.side == side), key=lambda e: e.pos) for side in (0, 1)}
    total = {e.pos: sum(1 for o in events if o.pos == e.pos) for e in events}
    by_version = {(p[1], p[2]): n for p, n in total.items()}
    names = {s.index: s.name for s in plan.streams}
    operator = kernel.family(plan)
    taken = {0: 0, 1: 0}
    previous: Progress | None = None
    state: dict[str, DataFrame] | None = None
    run = LiveRun(Counter(), {side: Counter() for side in (0, 1)}, [])
    kept: dict[str, list] = {name: [] for name in names.values()}
    base = BASE_MICROS
    for batch_id, take in enumerate(batches):
        new = {}
        for side in (0, 1):
            arrived = rows[side][taken[side] : taken[side] + take[side]]
            taken[side] += take[side]
            frame = local_frame(spark, [_arrival(e) for e in arrived], _ARRIVALS)
            source = plan.source(names[side])
            new[source.name] = arrival.prepare(
                frame, side, source.raw_time(), source.event_time(), source.keys
            )
        commits = batch_commits(new, state)
        arrived = Batch(new, commits, state, previous)
        decision = decide(spark, plan, arrived, lambda s, v: by_version[(s, v)], history_end=history_end)
        for side, name in names.items():
            c = decision.counts[name]
            decided = decision.result.counts[name]
            run.counts[side].update(
                {
                    "rows_in": c.rows_in,
                    "rejected": c.rejected,
                    "late": decided.late,
                    "joined": decided.joined,
                    "unmatched_emitted": decided.unmatched_emitted,
                    "unmatched_dropped": decided.unmatched_dropped,
                }
            )
        for r in decision.result.output.select(
            "lid", "rid", F.unix_micros("event_time").alias("t")
        ).collect():
            run.output[(r["lid"], r["rid"], (r["t"] - base) // 1_000_000)] += 1
        kept = {name: frame.collect() for name, frame in decision.next_state.items()}
        state = {name: local_frame(spark, kept[name], decision.next_state[name].schema) for name in kept}
        open_rows = {
            name: state[name].where(~F.col(PENDING) & operator.open_in_state()).count() for name in kept
        }
        carried = {name: open_rows[name] + sum(1 for r in kept[name] if r[PENDING]) for name in kept}
        previous = Progress(
            batch_id, decision.result.max_event, decision.settling.newest, carried, decision.settling.partial
        )
        run.frontiers.append(decision.settling.frontier)
        for frame in decision.cached:
            frame.unpersist()
    for side, name in names.items():
        run.counts[side]["open"] = open_rows[name]
        run.counts[side]["unsettled"] = sum(1 for r in kept[name] if r[PENDING])
    return run


def _arrival(e: Event, shift: int = 0) -> tuple:
    """An event as the row a Delta stream would bring: its columns (event time `shift` seconds
    later), commit version and timestamp."""
    at = None if e.t is None else BASE + timedelta(seconds=e.t + shift)
    return (e.id, e.key, at, e.v, e.pos[2], BASE + timedelta(microseconds=e.pos[0]))


def _by_example(commits: list[arrival.CommitStats]) -> list[list[arrival.CommitStats]]:
    groups: dict[int, list[arrival.CommitStats]] = {}
    for c in commits:
        groups.setdefault(c.position.version // STRIDE, []).append(c)
    return list(groups.values())


def _micros(seconds: int) -> int:
    return seconds * 1_000_000


# ---------------------------------------------------------------------------- enrichment joins
#
# An enrichment join's decisions are not local to a key: a table's lateness follows its running
# largest version time over all its commits, and a stream row is decided by the table's horizon
# (its largest version time, or the newest commit). So examples are not stacked at one instant as
# above but laid end to end, BAND seconds apart in both commit time and event time: each example
# then sees only its own history (every earlier example's times lie far below its own), and the
# whole is itself one valid history, which the reference decides as a whole. Only the last
# examples' rows can still be open at the end; the live batches then cut the whole history.

BAND = 100_000  # seconds between two examples laid end to end


@dataclass(frozen=True)
class Laid:
    """Enrichment examples laid end to end as one history of a stream (side 0; or streams 0 and 1)
    and its tables (the next sides: the chain's tables in the order joined)."""

    stream: list[Event]  # the reference's view of every stream row
    tables: dict[int, list[Change]]  # side -> its changes
    stream_rows: dict[int, list[tuple]]  # stream side -> rows in _ARRIVALS' shape
    table_rows: dict[int, list[tuple]]  # side -> rows in _CHANGES' shape, as the change data feed brings them
    commits: list[tuple[int, int, int]]  # (side, version, rows) of every commit, in arrival order

    @property
    def table(self) -> list[Change]:
        """The one table of a single join."""
        return self.tables[1]


def stream_commit(draw, side: int, c: int, n: int, name: str, keys: tuple) -> tuple[tuple, int]:
    """A drawn commit of a stream (for Hypothesis composites; `draw` is theirs), its `c`-th: one to
    three rows (id, key, seconds | None, v) with event times around 3c, now and then a NULL time
    (and a NULL key where `keys` holds None). Ids are `name` + row number; `n` is the last number
    used, returned with the commit."""
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        n += 1
        key = draw(st.sampled_from(keys))
        t = None if draw(st.integers(0, 12)) == 0 else 3 * c + draw(st.integers(-6, 5))
        rows.append((f"{name}{n}", key, t, draw(st.integers(0, 2))))
    return (side, rows), n


def table_commit(
    draw, side: int, c: int, n: int, name: str, changelog: bool, present: dict, keys: tuple[str, ...]
) -> tuple[tuple, int]:
    """A drawn commit of a table (for Hypothesis composites; `draw` is theirs), its `c`-th: rows
    (id, key, seconds, v, change type) with event times around 3c and one change per key. A
    changelog gets inserts, now and then a tombstone (id and v None); a table updated in place gets
    inserts and update post-images, or one time in four a delete of one of its rows. `present` (key
    -> row) is the in-place table's rows and is kept up to date; ids are `name` + row number, `n`
    the last number used, which is returned with the commit."""
    if not changelog and present and draw(st.integers(0, 3)) == 0:
        return (side, [(*present.pop(draw(st.sampled_from(sorted(present)))), "delete")]), n
    rows, seen = [], set()
    for _ in range(draw(st.integers(1, 3))):
        n += 1
        key = draw(st.sampled_from(keys))
        t = 3 * c + draw(st.integers(-6, 5))
        if key in seen:
            continue
        seen.add(key)
        if changelog:
            tombstone = draw(st.integers(0, 4)) == 0
            rows.append((None, key, t, None, "insert") if tombstone else (f"{name}{n}", key, t, 0, "insert"))
        else:
            change = "update_postimage" if key in present else "insert"
            present[key] = (f"{name}{n}", key, t, 0)
            rows.append((*present[key], change))
    return (side, rows), n


def lay_end_to_end(
    examples: Sequence[Sequence[tuple[int, list]]],
    table_key: str,
    tables: int = 1,
    streams: int = 1,
    kinds: str | None = None,
) -> Laid:
    """`examples`: each a list of commits (side, rows): stream rows (id, key, seconds, v), table rows
    (id, key, seconds, v, change type). A table row is a tombstone when its change type is `delete`
    or its id is None. `streams`: how many stream sides (0 ..), `tables`: how many table sides
    after them the examples commit to; or `kinds`, a letter per side in the job's order, "s" a
    stream and "t" a table (e.g. "sts": a stream, a table, a stream). `table_key`: the tables'
    primary key: "k" (its key), "k,t" (key and time) or "k,id"."""
    kinds = kinds or "s" * streams + "t" * tables
    sides = range(len(kinds))
    stream, commits = [], []
    stream_rows: dict[int, list[tuple]] = {side: [] for side in sides if kinds[side] == "s"}
    changes: dict[int, list[Change]] = {side: [] for side in sides if kinds[side] == "t"}
    table_rows: dict[int, list[tuple]] = {side: [] for side in sides if kinds[side] == "t"}
    versions = dict.fromkeys(sides, 0)
    for example, example_commits in enumerate(examples):
        shift = example * BAND
        for j, (side, rows) in enumerate(example_commits):
            versions[side] += 1
            position = (_micros(shift + j), side, versions[side])
            committed = BASE + timedelta(seconds=shift + j)
            commits.append((side, versions[side], len(rows)))
            for row in rows:
                row_id = None if row[0] is None else f"{example}/{row[0]}"
                key = None if row[1] is None else f"{example}:{row[1]}"
                seconds = None if row[2] is None else row[2] + shift
                at = None if seconds is None else BASE + timedelta(seconds=seconds)
                if kinds[side] == "s":
                    stream.append(Event(side, row_id, key, seconds, position, row[3]))
                    stream_rows[side].append((row_id, key, at, row[3], versions[side], committed))
                    continue
                deleted = row[4] == "delete" or row_id is None
                primary = {"k": (key,), "k,t": (key, seconds), "k,id": (key, row_id)}[table_key]
                changes[side].append(Change(row_id, primary, seconds, position, deleted))
                table_rows[side].append((row_id, key, at, row[3], row[4], versions[side], committed))
    return Laid(stream, changes, stream_rows, table_rows, commits)


@dataclass
class Decided:
    """What a replay or a sequence of live batches decided: output rows (each stream's id, each
    table's id, seconds) and counts in the reference's buckets, for each source (by side)."""

    output: Counter
    sources: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    links: Counter = field(default_factory=Counter)  # (link number from 0, bucket) -> rows

    @property
    def stream(self) -> Counter:
        """The first stream's counts."""
        return self.sources[0]

    @property
    def table(self) -> Counter:
        """The one table's counts of a single join."""
        return self.sources[1]


def enrichment_replay(
    spark: SparkSession,
    plan: Plan,
    laid: Laid,
    mode: str,
    windows: Sequence[tuple[int, int]],
    final: bool = False,
) -> list[Decided]:
    """The replay runner's part for consecutive slices `windows` (whole seconds after BASE,
    [start, end)) replayed together, through its own plan (`replay_plan`: margins, ranges) and
    reads (`replay.Read`: settled rows, table inputs, counts per slice), over in-memory rows: the
    stream rows in the operator's margins around the slices, settled by their frontier
    (`replay.settled_up_to`; `final`: a closed input), each table's changes; one kernel step, timed
    by the commits (standing in for the arrival index); what each slice decided."""
    base = BASE_MICROS
    replay = replay_plan(plan, [(base + _micros(a), base + _micros(b)) for a, b in windows], mode, final)
    read = Read(arrival.Slices.of(replay.slices))
    frames = {s.name: _stream_frame(spark, plan, laid.stream_rows[s.index], s.index) for s in plan.streams}
    all_commits = [c for frame in frames.values() for c in arrival.commit_stats(frame)]
    newest = arrival.newest_positions(all_commits)
    frontier = settled_up_to(newest, len(plan.streams), None, final)
    for name, frame in frames.items():
        in_reach = arrival.in_reach(replay.ranges()[name], replay.span.micros())
        read.read_stream(name, frame.where(in_reach), frontier, replay.operator.reads_rows_once())
    timed = sorted((c for c in all_commits if frontier and c.position <= frontier), key=lambda c: c.position)
    clock = max((p.time for p in newest.values()), default=None)
    for table in plan.tables:
        changes = changelog.tag(local_frame(spark, laid.table_rows[table.index], _CHANGES), table)
        version = max((v for side, v, _ in laid.commits if side == table.index), default=0)
        read.read_table(table.name, changes, version, clock, None)
    timeline = replace(arrival.timeline(timed, None), end=frontier)
    result = kernel.step(spark, plan, read.inputs(timeline, replay.options))
    output = output_rows(result.output, base)
    per_slice = []
    for k, (a, b) in enumerate(windows):
        assert isinstance(a, int) and isinstance(b, int)  # output times are whole seconds after BASE
        decided = Decided(Counter({r: n for r, n in output.items() if a <= r[-1] < b}))
        for source in plan.sources:
            read_here = (
                SourceCounts(**read.streams[source.name].get()[k])
                if source.name in read.streams
                else read.table_counts[k][source.name]
            )
            decided.sources[source.index]["rows_in"] += read_here.rows_in
            decided.sources[source.index]["rejected"] += read_here.rejected
        _add(decided, plan, result.by_slice[k], list(result.counted(k).links))
        per_slice.append(decided)
    assert sum(output.values()) == sum(sum(d.output.values()) for d in per_slice)  # no row outside them
    for frame in result.cached:
        frame.unpersist()
    return per_slice


def enrichment_live(spark: SparkSession, plan: Plan, laid: Laid, cuts: Sequence[int]) -> Decided:
    """The live runner's part: micro-batches ending after commits `cuts` (indices into
    `laid.commits`, and one after the last commit). Each batch brings the stream rows of its
    commits and reads each table as of its newest commit so far (a table commit starts a batch
    too), through `live.decide` with the state the previous batch left."""
    base = BASE_MICROS
    changes = {
        table.index: changelog.tag(
            local_frame(spark, laid.table_rows[table.index], _CHANGES), table
        ).persist()
        for table in plan.tables
    }
    sizes = {(side, version): rows for side, version, rows in laid.commits}
    decided = Decided(Counter())
    previous: Progress | None = None
    state: dict[str, DataFrame] | None = None
    kept: dict[str, list] = {}
    last_links: list[LinkCounts] = []
    begin = 0
    for batch_id, end in enumerate(sorted({*cuts, len(laid.commits) - 1})):
        batch = laid.commits[begin : end + 1]
        begin = end + 1
        read = {
            table.index: max((v for s, v, _ in laid.commits[:begin] if s == table.index), default=0)
            for table in plan.tables
        }
        new = {}
        for stream in plan.streams:
            versions = {v for s, v, _ in batch if s == stream.index}
            rows = [r for r in laid.stream_rows[stream.index] if r[4] in versions]
            new[stream.name] = _stream_frame(spark, plan, rows, stream.index)

        def tables_for(newest, counts, rejected, cached, read=read, previous=previous):
            clock = max((p.time for p in newest.values()), default=None)
            return {
                table.name: table_input(
                    table.name,
                    changes[table.index].where(F.col(arrival.V) <= read[table.index]),
                    read[table.index],
                    previous.tables.get(table.index, -1) if previous else -1,
                    clock,
                    counts,
                    rejected,
                )
                for table in plan.tables
            }

        commits = batch_commits(new, state)
        decision = decide(
            spark, plan, Batch(new, commits, state, previous), lambda s, v: sizes[(s, v)], tables_for
        )
        for source in plan.sources:
            decided.sources[source.index]["rows_in"] += decision.counts[source.name].rows_in
            decided.sources[source.index]["rejected"] += decision.counts[source.name].rejected
        last_links = list(decision.result.counted(0).links)
        _add(decided, plan, decision.result.counts, last_links, with_open=False)
        decided.output.update(output_rows(decision.result.output, base))
        kept = {name: frame.collect() for name, frame in decision.next_state.items()}
        state = {name: local_frame(spark, kept[name], decision.next_state[name].schema) for name in kept}
        previous = Progress(
            batch_id,
            decision.result.max_event,
            decision.settling.newest,
            {s.name: sum(1 for r in kept[s.name] if r[PENDING] or not r[MATCHED]) for s in plan.streams},
            decision.settling.partial,
            read,
        )
        for frame in decision.cached:
            frame.unpersist()
    for frame in changes.values():
        frame.unpersist()
    for stream in plan.streams:
        left = kept[stream.name]
        decided.sources[stream.index]["open"] = sum(1 for r in left if not r[PENDING] and not r[MATCHED])
        decided.sources[stream.index]["unsettled"] = sum(1 for r in left if r[PENDING])
    for n, link in enumerate(last_links):
        decided.links[(n, "open")] = link.open
    return decided


def _stream_frame(spark: SparkSession, plan: Plan, rows: list[tuple], side: int = 0) -> DataFrame:
    stream = next(s for s in plan.streams if s.index == side)
    frame = local_frame(spark, rows, _ARRIVALS)
    return arrival.prepare(frame, stream.index, stream.raw_time(), stream.event_time(), stream.keys)


def output_rows(output: DataFrame, base: int) -> Counter:
    """Output rows as (each id column, seconds after BASE)."""
    ids = [c for c in output.columns if c != "event_time"]
    rows = output.select(*ids, F.unix_micros("event_time").alias("_t")).collect()
    return Counter((*(r[c] for c in ids), (r["_t"] - base) // 1_000_000) for r in rows)


def _add(
    decided: Decided,
    plan: Plan,
    counts: dict[str, SourceCounts],
    links: list[LinkCounts],
    with_open: bool = True,
) -> None:
    """Add one step's (or slice's) counts; `with_open`: its open rows too (a replay's; a live
    run's are those the last batch leaves)."""
    assert links_balanced(links), links
    for n, link in enumerate(links):
        decided.links.update({(n, bucket): getattr(link, bucket) for bucket in LINK_BUCKETS})
        if with_open:
            decided.links[(n, "open")] += link.open
    kept = ("late", "joined", "unmatched_emitted", "unmatched_dropped") + (("open",) if with_open else ())
    for stream in plan.streams:
        for bucket in kept:
            decided.sources[stream.index][bucket] += getattr(counts[stream.name], bucket)
    for table in plan.tables:
        for bucket in ("late", "applied"):
            decided.sources[table.index][bucket] += getattr(counts[table.name], bucket)


def slices(draw, examples: int) -> list[tuple[int, int]]:
    """The whole history [-BAND, examples * BAND) cut in three slices, inside two examples."""
    cuts = sorted(
        draw(st.integers(0, examples - 1)) * BAND + draw(st.integers(-8, 22), label="cut offset")
        for _ in range(2)
    )
    bounds = [-BAND, *cuts, examples * BAND]
    return list(zip(bounds, bounds[1:], strict=False))


def cuts(laid: Laid):
    """Where live micro-batches end: after one to five random commits (and after the last)."""
    return st.sets(st.integers(0, len(laid.commits) - 1), min_size=1, max_size=5).map(sorted)


def check_replay(
    spark,
    plan,
    laid: Laid,
    mode: str,
    windows,
    expected: Counter,
    stream: dict,
    tables: dict[int, dict] | None = None,
    links: list[dict] | None = None,
    final: bool = False,
) -> None:
    """A replay of the whole history decides as the reference (output, stream counts, and each
    table's counts by side when given); the slices' replays, summed, write and count what it does,
    and one replay of the slices together decides each as its own replay does (`final`: of a
    closed input). `links`: a chain's counts per link, as the reference counts them."""
    (whole,) = enrichment_replay(spark, plan, laid, mode, [(windows[0][0], windows[-1][1])], final)
    check_decided(whole, expected, stream, tables, links)
    sliced = Decided(Counter())
    parts = []
    for window in windows:
        (part,) = enrichment_replay(spark, plan, laid, mode, [window], final)
        parts.append(part)
        sliced.output.update(part.output)
        for side, counts in part.sources.items():
            sliced.sources[side].update(counts)
        sliced.links.update(part.links)
    assert sliced.output == whole.output, first_difference(sliced.output, whole.output)
    assert sliced.sources == whole.sources and sliced.links == whole.links
    assert enrichment_replay(spark, plan, laid, mode, windows, final) == parts


def check_live(
    spark,
    plan,
    laid: Laid,
    ends: list[int],
    expected: Counter,
    stream: dict,
    tables: dict[int, dict] | None = None,
    links: list[dict] | None = None,
) -> None:
    """Live micro-batches ending after commits `ends` decide, summed, as the reference."""
    check_decided(enrichment_live(spark, plan, laid, ends), expected, stream, tables, links)


def check_decided(
    decided: Decided,
    expected: Counter,
    stream: dict,
    tables: dict[int, dict] | None,
    links: list[dict] | None,
) -> None:
    """What a replay or live batches decided is the reference's: output, stream counts, and each
    table's and link's counts when given."""
    assert decided.output == expected, first_difference(decided.output, expected)
    assert buckets(decided.stream, STREAM_BUCKETS) == stream
    if tables is not None:
        assert {side: buckets(decided.sources[side], TABLE_BUCKETS) for side in tables} == tables
    if links is not None:
        assert per_link(decided.links, len(links)) == links


def per_link(counts: Counter, links: int) -> list[dict[str, int]]:
    """`Decided.links` in the reference's shape: each link's buckets."""
    return [{bucket: counts[(n, bucket)] for bucket in LINK_BUCKETS} for n in range(links)]


def buckets(counts: Counter, names: tuple[str, ...]) -> dict[str, int]:
    return {b: counts[b] for b in names}


def first_difference(got: Counter, expected: Counter) -> str:
    """The example whose output differs first, for the failure message."""
    extra, missing = got - expected, expected - got
    rows = sorted({*extra, *missing}, key=lambda r: str(r))
    example = str(rows[0][0] or rows[0][1]).split("/")[0]
    return (
        f"example {example}: extra {[r for r in extra if str(r[0] or r[1]).startswith(example + '/')]}, "
        f"missing {[r for r in missing if str(r[0] or r[1]).startswith(example + '/')]}"
    )


# ---------------------------------------------------------------------------- table-table joins
#
# A table-table result row changes only with its own key's rows, so examples (keys and row ids of
# their own) laid end to end (BAND seconds of commit time apart) decide as they would alone.

KV_CHANGES = StructType(
    [
        StructField("k", StringType()),
        StructField("v", StringType()),
        StructField(CHANGE_TYPE, StringType()),
        StructField(COMMIT_VERSION, LongType()),
        StructField(COMMIT_TIMESTAMP, TimestampType()),
    ]
)


@dataclass(frozen=True)
class LaidTables:
    """Examples of two changelogs laid end to end: each side's rows (KV_CHANGES' shape) and every
    commit (side, version, rows (key, value | None)) in arrival order."""

    rows: dict[int, list[tuple]]
    commits: list[tuple[int, int, list[tuple[str, str | None]]]]


def lay_tables_end_to_end(
    examples: Sequence[Sequence[tuple[int, list[tuple[str, str | None]]]]],
    tables: int = 2,
    values_are_keys: Sequence[int] = (),
) -> LaidTables:
    """`examples`: each a list of commits (side, rows (key, value | None)); None deletes the key.
    `values_are_keys`: the sides whose values name another table's keys (made the example's own,
    as its keys are)."""
    rows: dict[int, list[tuple]] = {side: [] for side in range(tables)}
    commits = []
    versions = dict.fromkeys(range(tables), 0)
    for example, example_commits in enumerate(examples):
        for j, (side, changes) in enumerate(example_commits):
            versions[side] += 1
            seconds = example * BAND + j
            keyed = [
                (f"{example}:{k}", f"{example}:{v}" if v is not None and side in values_are_keys else v)
                for k, v in changes
            ]
            commits.append((side, versions[side], keyed))
            committed = BASE + timedelta(seconds=seconds)
            rows[side] += [(k, v, "insert", versions[side], committed) for k, v in keyed]
    return LaidTables(rows, commits)


def tables_step(
    spark: SparkSession,
    plan: Plan,
    laid: LaidTables,
    upto: dict[int, int],
    seen: dict[int, int],
    after: int | None,
) -> kernel.StepResult:
    """One table-table step over each table up to version `upto[side]`, counting the changes after
    `seen[side]`, emitting the result changes settled after `after` (a live batch; a replay of
    everything is upto = the last versions, seen = -1, after = None)."""
    tables, counts, rejected = {}, {}, []
    for source in plan.tables:
        frame = local_frame(spark, laid.rows[source.index], KV_CHANGES)
        changes = changelog.tag(frame, source).where(F.col(arrival.V) <= upto[source.index])
        tables[source.name] = table_input(
            source.name, changes, upto[source.index], seen[source.index], None, counts, rejected
        )
    marks = {} if after is None else {"bound": after}  # the mark a table-table step leaves
    return kernel.step(
        spark, plan, kernel.StepInput(tables, arrival.Timeline({}, None), "exact", marks=marks)
    )


def result_table(result: kernel.StepResult) -> DataFrame:
    """The result table a replay's table-table step writes over the output (`Write.REPLACE`)."""
    (update,) = [write for write in result.writes if write.how == Write.REPLACE]
    return update.rows


@dataclass
class OneStreamRun:
    """What the live runner's `decide` wrote and counted over micro-batches of one stream."""

    output: Counter  # (each output column but the time, seconds after BASE)
    counts: Counter  # the buckets, summed over the batches
    waiting: int  # rows the last batch left waiting for their commit's other rows
    lookups: int  # lookup joins: answers fetched from the database


def one_stream_live(spark: SparkSession, plan: Plan, frame: DataFrame, ends: Sequence[int]) -> OneStreamRun:
    """`decide`, batch after batch, over one stream's prepared rows (`frame`, in commit order):
    batch i brings the rows up to `ends[i]`, so a batch may cut a commit (its rows wait for the
    rest, as maxFilesPerTrigger cuts one). The state each batch leaves is handed to the next as
    new DataFrames, as the runner's parquet state would be."""
    ((name, index),) = [(s.name, s.index) for s in plan.streams]
    rows, schema = frame.collect(), frame.schema
    per_version = Counter(r[arrival.V] for r in rows)
    state: dict[str, DataFrame] | None = None
    previous: Progress | None = None
    run = OneStreamRun(Counter(), Counter(), 0, 0)
    start, base = 0, BASE_MICROS
    for batch, end in enumerate(ends):
        new = {name: local_frame(spark, rows[start:end], schema)}
        start = end
        arrived = Batch(new, batch_commits(new, state), state, previous)
        decision = decide(spark, plan, arrived, lambda s, v: per_version[v])
        kernel.append_writes(decision.result)  # as the live runner does, before the output
        run.output.update(output_rows(decision.result.output, base))
        run.counts.update(
            {"rows_in": decision.counts[name].rows_in, "rejected": decision.counts[name].rejected}
        )
        run.counts.update({b: getattr(decision.result.counts[name], b) for b in DECIDED})
        run.lookups += decision.result.total("lookups")
        kept = decision.next_state[name].collect()
        state = {name: local_frame(spark, kept, decision.next_state[name].schema)}
        run.waiting = sum(1 for r in kept if r[PENDING])
        previous = Progress(
            batch,
            decision.result.max_event,
            decision.settling.newest,
            {name: run.waiting},
            decision.settling.partial,
        )
        for cached in decision.cached:
            cached.unpersist()
    assert index == 0  # a one-stream job's stream is its first source
    return run


def one_stream_frame(
    spark: SparkSession, plan: Plan, commits: Sequence[tuple[int, list[tuple]]]
) -> DataFrame:
    """A one-stream job's commits, `[(version, rows)]`, each row its source's columns with the event
    time (seconds after BASE, or None) last, as the runners hand them to the kernel: arrival
    columns (version v committed v seconds after BASE) and rejection, in commit order."""
    (source,) = plan.streams
    schema = StructType(
        [
            *source.schema.fields,
            StructField(COMMIT_VERSION, LongType()),
            StructField(COMMIT_TIMESTAMP, TimestampType()),
        ]
    )
    rows = [
        (
            *row[:-1],
            None if row[-1] is None else BASE + timedelta(seconds=row[-1]),
            version,
            BASE + timedelta(seconds=version),
        )
        for version, part in commits
        for row in part
    ]
    frame = local_frame(spark, rows, schema)
    return arrival.prepare(frame, source.index, source.raw_time(), source.event_time(), source.keys)


def assert_one_stream_slices(
    spark: SparkSession,
    plan: Plan,
    frame: DataFrame,
    cuts: Sequence[int],
    expected: Callable[[int, int], tuple[Counter, dict[str, int]]],
    span: tuple[int, int] = (-1, 201),
) -> kernel.StepResult:
    """One replay step of a one-stream job over `span` cut at `cuts` (seconds after BASE): each
    slice [a, b) writes and counts what `expected(a, b)` gives (its rows, its buckets). Returns the
    step's result."""
    (source,) = plan.streams
    accepted, _ = kernel.split_rejected(frame)
    bounds = [span[0], *cuts, span[1]]
    windows = list(zip(bounds, bounds[1:], strict=False))
    base = BASE_MICROS
    slices = slices_of([(base + a * 1_000_000, base + b * 1_000_000) for a, b in windows])
    step = kernel.StepInput({source.name: accepted}, arrival.Timeline({}, None), "exact", slices=slices)
    result = kernel.step(spark, plan, step)
    kernel.append_writes(result)  # as the replay does, before the output
    output = output_rows(result.output, base)
    for k, (a, b) in enumerate(windows):
        rows, counts = expected(a, b)
        assert Counter({r: n for r, n in output.items() if a <= r[-1] < b}) == rows, (a, b)
        decided = result.by_slice[k][source.name]
        assert {c: getattr(decided, c) for c in DECIDED} == {c: counts[c] for c in DECIDED}, (a, b)
    return result
