"""The arrival index: what lateness needs of every source commit, kept by streamjoin so it outlives Delta.

Delta forgets. It refuses to read change files older than `delta.deletedFileRetentionDuration`
(7 days by default) and drops log entries older than `delta.logRetentionDuration` (30 days). What
a run needs of old commits is small: each commit's position (version, commit time) and the
largest accepted event time so far, from which every watermark follows. streamjoin records it as
it goes, one row per stream-source commit, in the Delta table `<output>_index`:

    source, version, commit_ts     the commit's arrival position (commit time in UTC micros)
    rows, rejected                 rows it inserted; of them, rows rejected as bad input
    max_event, max_so_far          largest accepted event time in the commit; in the source so far
    min_time, max_time, untimed    range of parseable event times (accepted or not); rows without one
    start, row_tracking            the source's start entry; whether its rows carry their version
    max_future                     on a start entry: the source's `max_future` (micros) the entries
                                   were computed with (NULL: no bound)
    declared                       on a start entry: the start the job declared (`start_at`, --from)

**The start.** A job starts at one instant S (`job_start`: the latest of its streams' declared
starts, from `start_at` in the job or `--from`; default version 0 while the log holds it). Each
stream starts at its newest version committed at or before S, and every row it holds there is its
history: all of it, in every stream, arrives at S at once (positions at S, settled and judged as
one group: `Index.history_end`), and none of it is late. A table starts where it is declared to
(version 0 by default): its rows there are its history, its later changes come from its change
feed or the job's journal. Once written, the start is fixed: both runners read it from here, and
a different declared start is refused with `reset_command`.

**Appending.** `update` extends the index up to given versions. New commits are read from the change
feed of those versions only; if Delta no longer keeps their change files, from the latest snapshot
with row tracking (`_metadata.row_commit_version`). The live runner calls it in each micro-batch
(and keeps the new entries, to append them with others' later: `deferred`), the replay before it
reads, `streamjoin index JOB` on demand. A micro-batch already
holds its commits' rows, tagged: a commit the log says appended exactly the rows the batch holds
of it (Delta's `numOutputRows`) is indexed from them, and the change feed is read only for the
others (a commit cut by maxFilesPerTrigger, an operation whose log entry does not tell). Appends
are plain and may repeat a row (a retried batch, two writers): readers drop duplicates, and a row
is a function of the source's log alone, so duplicates are identical.

**Reading a slice.** `read_rows` gives a stream source's rows whose event time falls in a range
(plus the rows without one that a slice owns by commit time), each with its commit version and
time: from the pinned snapshot filtered on the time column (Delta skips files by their
statistics) when the source has row tracking, else from the change feed of only the versions
whose [min_time, max_time] meets the range. A slice thus costs what it holds, not what the table
ever held.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from streamjoin import arrival, delta_io, journal
from streamjoin.arrival import REJECT, TS, Position, T, Timeline, V
from streamjoin.delta_io import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION
from streamjoin.errors import HistoryNotRetainedError, JobError
from streamjoin.frames import local_frame
from streamjoin.plan import BoundSource, Plan
from streamjoin.timeutil import format_duration, from_micros, from_spark, parse_instant, to_micros

SCHEMA = StructType(
    [
        StructField("source", StringType(), False),
        StructField("version", LongType(), False),
        StructField("commit_ts", LongType(), False),
        StructField("rows", LongType()),
        StructField("rejected", LongType()),
        StructField("max_event", LongType()),
        StructField("max_so_far", LongType()),
        StructField("min_time", LongType()),
        StructField("max_time", LongType()),
        StructField("untimed", LongType()),
        StructField("start", BooleanType()),
        StructField("row_tracking", BooleanType()),
        StructField("max_future", LongType()),
        StructField("declared", StringType()),
    ]
)


@dataclass(frozen=True)
class Entry:
    """One source commit in the index (a table source has only its start entry)."""

    source: str
    version: int
    commit_ts: int
    rows: int = 0
    rejected: int = 0
    max_event: int | None = None
    max_so_far: int | None = None
    min_time: int | None = None
    max_time: int | None = None
    untimed: int = 0
    start: bool = False
    row_tracking: bool | None = None
    max_future: int | None = None
    declared: str | None = None  # on a start entry: the start the job declared (`start_at`, --from)

    def position(self, src: int) -> Position:
        return Position(self.commit_ts, src, self.version)


def location(plan: Plan) -> str:
    """Where a job's index lives: beside its output."""
    return plan.spec.output.side("index")


StartAt = int | datetime | str | None

MAX_TIME = 2**62  # later than any event time: "every one of them"

# One small file per update: every COMPACT_EVERY versions of the index, the update that wrote it
# compacts the table (OPTIMIZE), which keeps reading the index as cheap as its size. Delta's auto
# compaction would do the same, but its hook rebuilds the table's state after every commit (a
# Spark job) to count small files, and the index's reads (`delta_io.read_own`) need no state.
COMPACT_EVERY = 50
# An index written before a column was added takes appends with it (its rows read it as NULL).
_APPEND = {"mergeSchema": "true"}


# ---------------------------------------------------------------------------- keeping it up to date


def update(
    spark: SparkSession,
    plan: Plan,
    upto: dict[str, int] | None = None,
    start_at: dict[str, StartAt] | None = None,
    known: Index | None = None,
    held: dict[str, dict[int, arrival.CommitStats]] | None = None,
    extend: bool = True,
) -> Index:
    """Extend the index of `plan`'s job to `upto` (default: each source's latest version), creating
    it at each source's start if it does not exist yet; return it as of those versions.

    `start_at` (by source name: a version, a timestamp, or None) overrides the job's `start_at`
    for a new index; an existing index keeps its start, and a different one given is refused.
    `known`: the index as this process last updated it (the live runner, batch after batch), whose
    heads spare a query of the stored table. Another writer may have extended the table since:
    the entries appended again are identical to its own, and readers drop duplicates.
    `held`: per stream source, the commits (by version) of rows the caller has read and tagged
    (the live runner's micro-batch), with their stats over those rows. A commit that the log says
    appended exactly that many rows is indexed from them; the change feed is read only for the others.
    `extend` False: a source the index holds keeps its entries (no `upto` given: as far as they go),
    and a new one (no `upto` given) whose table was created empty at its start (version 0) gets its
    start entry only. A new live checkpoint creates its index so: its micro-batches index the
    commits after the start from the rows they hold, where indexing them up front would read every
    row of the source once more before the first batch. (Any other start needs its history read,
    and that one Spark job reads the stats of the commits after it too.)
    """
    if known is not None:
        starts, lasts = dict(known.starts), dict(known.lasts)
    else:
        starts, lasts = (dict(heads) for heads in _heads(spark, plan))
    targets = _targets(spark, plan, upto, lasts, extend)
    declared = _declared(plan, start_at)
    if starts:
        _check_same_start(spark, plan, starts, declared, start_at)
    present = [s for s in plan.sources if s.name in starts]
    pending: list[_Pending] = []
    start_only = None if extend else {s.name for s in plan.sources if (upto or {}).get(s.name) is None}
    new = _begin(spark, plan, (starts, targets), declared, start_only, pending)
    for source in present:
        if known is None:
            _check_same_future_bound(spark, plan, source, starts[source.name])
        last = lasts[source.name]
        if source.spec.kind == "stream" and targets[source.name] > last.version:
            versions, held_here = (last.version, targets[source.name]), (held or {}).get(source.name, {})
            pending.append(_pending(spark, source, starts[source.name], versions, last.max_so_far, held_here))
    pending.sort(key=lambda p: plan.sources.index(p.source))
    _read_stats(pending)
    new += [entry for p in pending for entry in p.entries()]
    # The table sources' changes, while Delta holds them; first, so that a start no one can serve
    # any more is refused before the index pins it.
    journal.update(spark, plan, starts, targets)
    _append(spark, plan, new)
    newest = _newest(lasts, new)
    _remember(plan, (starts | {e.source: e for e in new if e.start}, newest))
    return Index(spark, plan, starts, targets, newest, {(e.source, e.version): e.rows for e in new})


_DEFERRED: ContextVar[list[Entry] | None] = ContextVar("streamjoin_index_deferred", default=None)


@contextmanager
def deferred() -> Iterator[list[Entry]]:
    """While inside, `update` appends none of the entries it makes: it adds them to the list this
    yields, for the caller to append later with others (`append_entries`). The live runner keeps
    its micro-batches' entries so, in its checkpoint, and appends them between batches."""
    made: list[Entry] = []
    token = _DEFERRED.set(made)
    try:
        yield made
    finally:
        _DEFERRED.reset(token)


def _append(spark: SparkSession, plan: Plan, new: list[Entry]) -> None:
    """Append `update`'s new entries, or keep them while `deferred` is entered."""
    kept = _DEFERRED.get()
    if kept is None:
        append_entries(spark, plan, new)
    else:
        kept.extend(new)


def append_entries(spark: SparkSession, plan: Plan, new: list[Entry]) -> None:
    """Append entries in one commit; compact the index every COMPACT_EVERY commits."""
    if new:
        where = location(plan)
        delta_io.append(local_frame(spark, [_row(e) for e in new], SCHEMA).coalesce(1), where, _APPEND)
        if delta_io.latest_version(spark, where) % COMPACT_EVERY == COMPACT_EVERY - 1:
            delta_io.compact(spark, where)


def _targets(
    spark: SparkSession, plan: Plan, upto: dict[str, int] | None, lasts: dict[str, Entry], extend: bool
) -> dict[str, int]:
    """How far to index each source: as given, else (not `extend`) as far as its entries go, else
    its newest version."""
    targets = {}
    for source in plan.sources:
        given = (upto or {}).get(source.name)
        if given is None and not extend and source.name in lasts:
            given = lasts[source.name].version
        targets[source.name] = (
            delta_io.latest_version(spark, source.spec.location) if given is None else given
        )
    return targets


def _begin(
    spark: SparkSession,
    plan: Plan,
    heads: tuple[dict[str, Entry], dict[str, int]],
    declared: dict[str, StartAt],
    start_only: set[str] | None,
    pending: list[_Pending],
) -> list[Entry]:
    """Start the sources the index does not hold yet, at the job's start: their start entries
    (added to `heads`' starts), a table's as a new entry, a stream's history and later commits as
    `pending`. `start_only`: the new sources to index as far as their start only, when their
    history is known empty without a read (see `update`'s `extend`); None: all of them in full."""
    starts, targets = heads
    missing = [s for s in plan.sources if s.name not in starts]
    if not missing:
        return []
    begun = _stored_instant(plan, starts) if starts else None
    _, versions, times = job_start(spark, plan, declared, targets, begun, missing)
    new = []
    for source in missing:
        version = versions[source.name]
        start, commits = _start_entry(
            spark, source, version, times[source.name], declared.get(source.name), targets[source.name]
        )
        starts[source.name] = start
        if source.spec.kind == "table":
            new.append(start)
            continue
        if start_only is not None and source.name in start_only and _empty_history(commits):
            targets[source.name] = version  # its start only (see `update`'s `extend`)
        # the history and every commit after it, up to the target: the commits just read
        last = max(targets[source.name], start.version)
        pending.append(_pending(spark, source, start, (start.version - 1, last), history=commits))
    return new


def _declared(plan: Plan, start_at: dict[str, StartAt] | None) -> dict[str, StartAt]:
    """Each source's declared start: given to this run (`--from`), else its own `start_at`, else the job's."""
    declared: dict[str, StartAt] = {}
    for source in plan.sources:
        wanted = (start_at or {}).get(source.name)
        if wanted is None:
            wanted = source.spec.start_at if source.spec.start_at is not None else plan.spec.start_at
        declared[source.name] = wanted
    return declared


def job_start(
    spark: SparkSession,
    plan: Plan,
    declared: dict[str, StartAt],
    latest: dict[str, int] | None = None,
    begun: int | None = None,
    sources: list[BoundSource] | None = None,
) -> tuple[int, dict[str, int], dict[str, int]]:
    """The job's start instant S (UTC micros), each source's start version and the time its history
    is stamped at (docs/semantics.md, "Where a job starts"). S is the latest of the stream sources'
    declared starts, each an instant: a time given, the commit time of a version given, or of
    version 0 while the log holds it. A stream starts at its newest version committed at or before
    S, and all of its rows by then are its history, at S. A table starts where it is declared to
    (its version 0 by default): its versions from there on are known, at their own commits, which
    before S is only more to look up. `begun`: the instant an existing index started at (sources
    added later start there); `sources`: those to resolve (default: all); `latest`: their newest
    versions, if known."""
    chosen = list(plan.sources if sources is None else sources)
    commits = {s.name: delta_io.history(spark, s.spec.location) for s in chosen}
    newest = latest or {}
    if begun is None:
        timed = [s for s in chosen if s.spec.kind == "stream"] or chosen
        begun = max(_instant(s, declared.get(s.name), commits[s.name], newest.get(s.name)) for s in timed)
    versions, times = {}, {}
    for source in chosen:
        if source.spec.kind == "table":
            versions[source.name], times[source.name] = _table_start(
                source, declared.get(source.name), commits[source.name], newest.get(source.name)
            )
            continue
        times[source.name] = begun
        before = [c.version for c in commits[source.name] if to_micros(from_spark(c.timestamp)) <= begun]
        if not before:
            first = commits[source.name][0]
            raise JobError(
                f"source {source.name!r} ({source.spec.location}): no retained version was committed at or before "
                f"the job's start {from_micros(begun).isoformat()} (oldest retained: version {first.version} at "
                f"{first.timestamp}); every source must exist at the start. Start the job at "
                f"{from_spark(first.timestamp).isoformat()} or later (start_at)"
            )
        versions[source.name] = before[-1]
    return begun, versions, times


def _table_start(
    source: BoundSource, wanted: StartAt, commits: list[delta_io.Commit], latest: int | None
) -> tuple[int, int]:
    """A table source's start version (as declared, version 0 by default) and its commit time."""
    when = _instant(source, wanted, commits, latest)  # refuses what the log cannot place
    version = _as_version(wanted)
    if version is not None:
        chosen = next(c for c in commits if c.version == version)
    else:
        chosen = [c for c in commits if to_micros(from_spark(c.timestamp)) <= when][-1]
    return chosen.version, to_micros(from_spark(chosen.timestamp))


def start_of(
    spark: SparkSession, plan: Plan, start_at: dict[str, StartAt] | None = None
) -> tuple[int, dict[str, int], dict[str, int]]:
    """The job's start instant, its sources' start versions and their start times (`job_start`):
    as its index pinned them, or as a first run would pin them now (nothing is written)."""
    starts = _heads(spark, plan)[0]
    declared = _declared(plan, start_at)
    if not starts:
        return job_start(spark, plan, declared)
    instant = _stored_instant(plan, starts)
    versions = {name: e.version for name, e in starts.items()}
    times = {name: e.commit_ts for name, e in starts.items()}
    missing = [s for s in plan.sources if s.name not in starts]
    if missing:
        _, more, more_times = job_start(spark, plan, declared, begun=instant, sources=missing)
        versions, times = versions | more, times | more_times
    return instant, versions, times


def event_times_committed_before(
    spark: SparkSession, plan: Plan, source: str, before: int, instant: int
) -> int | None:
    """The largest event time of a stream source's commits (its history included) committed before
    `before` (UTC micros), from the index, or as a first run would index it (its history at the
    job's start `instant`, of unknown times); None when none was."""
    stored = _read(spark, plan)
    if stored is None:
        return MAX_TIME if instant < before else None
    row = (
        stored.frame.where((F.col("source") == source) & (F.col("commit_ts") < F.lit(before)))
        .agg(F.max("max_time").alias("t"), F.count(F.lit(1)).alias("n"))
        .first()
    )
    return row["t"] if row is not None and row["n"] else None


def _as_version(wanted: StartAt) -> int | None:
    """A declared start that names a version (`start_at: 12`, `--from 12`), else None (a time, or none)."""
    if isinstance(wanted, int) or (isinstance(wanted, str) and wanted.strip().isdigit()):
        return int(wanted)
    return None


def _instant(source: BoundSource, wanted: StartAt, commits: list[delta_io.Commit], latest: int | None) -> int:
    """A source's declared start as an instant (UTC micros); refuses one its log cannot place."""
    where = f"source {source.name!r} ({source.spec.location})"
    oldest, newest = commits[0], commits[-1]
    latest = newest.version if latest is None else latest
    if wanted is None:
        if oldest.version > 0:
            raise JobError(
                f"{where}: its log no longer holds version 0 (oldest retained: version {oldest.version}, committed "
                f"{oldest.timestamp}), so the job cannot begin at the table's first commit. Give the job a start: "
                f"start_at: <version {oldest.version} to {latest}, or a time> on the source or the job, or --from"
            )
        return to_micros(from_spark(oldest.timestamp))
    version = _as_version(wanted)
    if version is None:
        assert isinstance(wanted, (str, datetime))  # not a version: a time
        when = to_micros(parse_instant(wanted, f"{where}: start_at"))
        if to_micros(from_spark(oldest.timestamp)) > when:
            raise JobError(
                f"{where}: no retained version was committed at or before start_at {from_micros(when).isoformat()} "
                f"(oldest retained: version {oldest.version} at {oldest.timestamp}); start at that time or later"
            )
        return when
    by_version = {c.version: c for c in commits}
    if version not in by_version or version > latest:
        raise JobError(
            f"{where}: start_at version {version} is outside the versions its log holds ({oldest.version} to "
            f"{latest}); choose one of those"
        )
    return to_micros(from_spark(by_version[version].timestamp))


def _stored_instant(plan: Plan, starts: dict[str, Entry]) -> int:
    """The one instant every stored start entry shares; an index whose sources started at different
    instants (written by a release that started each source at its own version) is refused."""
    streams = {name: e for name, e in starts.items() if plan.source(name).spec.kind == "stream"}
    if not streams:  # a job of tables: no history to judge
        return max(e.commit_ts for e in starts.values())
    instants = {e.commit_ts for e in streams.values()}
    if len(instants) > 1:
        listed = ", ".join(
            f"{name} at version {e.version} ({from_micros(e.commit_ts).isoformat()})"
            for name, e in sorted(streams.items())
        )
        raise JobError(
            f"job {plan.spec.name!r}: its index {location(plan)} starts each source at its own instant ({listed}), "
            "as releases before one job-wide start did; their outputs judged one source's history against "
            f"another's. Start the job afresh: {reset_command(plan)}"
        )
    return instants.pop()


def reset_command(plan: Plan) -> str:
    """The one command that deletes a job's outputs and index, to start it again from a new start."""
    return (
        f"`streamjoin reset <job file> --yes` (the file of job {plan.spec.name!r}; it deletes the output, its "
        "side tables and its index, and with --checkpoint DIR a live checkpoint), then run the job again"
    )


def _check_same_start(
    spark: SparkSession,
    plan: Plan,
    starts: dict[str, Entry],
    declared: dict[str, StartAt],
    start_at: dict[str, StartAt] | None,
) -> None:
    """Refuse a declared start other than the one the index pinned: every output so far was
    computed from it. A run that declares none (no start_at, no --from) takes the pinned one."""
    instant = _stored_instant(plan, starts)
    asked = {name: wanted for name, wanted in declared.items() if wanted is not None and name in starts}
    if not asked or all(_pinned(wanted, starts[name], instant) for name, wanted in asked.items()):
        return
    stored = {name: e.version for name, e in starts.items()}
    try:
        wanted_instant, wanted_versions, _ = job_start(
            spark, plan, declared, sources=[plan.source(n) for n in starts]
        )
    except JobError as exc:
        wanted_instant, wanted_versions, why = None, None, f" (which cannot be placed: {exc})"
    else:
        why = ""
    if wanted_instant == instant and wanted_versions == stored:
        return
    given = ", ".join(f"{name}: {wanted}" for name, wanted in sorted(asked.items()))
    pinned = ", ".join(f"{name} at version {v}" for name, v in sorted(stored.items()))
    now = (
        ""
        if wanted_versions is None or wanted_instant is None
        else f" = {from_micros(wanted_instant).isoformat()} ("
        + ", ".join(f"{n} at version {v}" for n, v in sorted(wanted_versions.items()))
        + ")"
    )
    raise JobError(
        f"job {plan.spec.name!r} asks to start at {given}{now}{why}, but its index {location(plan)} pinned the start "
        f"at {from_micros(instant).isoformat()} ({pinned}), and every output so far was computed from that start. "
        f"Keep the pinned start (remove the new start_at / --from), or start afresh: {reset_command(plan)}"
    )


def _pinned(wanted: StartAt, start: Entry, instant: int) -> bool:
    """Whether a declared start is the one the index pinned, told without the table's log (which
    may have forgotten it): the same declaration, the pinned instant, or the pinned version."""
    if start.declared is not None and str(wanted) == start.declared:
        return True
    version = _as_version(wanted)
    if version is not None:
        return version == start.version
    assert isinstance(wanted, (str, datetime))  # declared (not None), not a version: a time
    try:
        return to_micros(parse_instant(wanted, "start_at")) == instant
    except JobError:
        return False


def _start_entry(
    spark: SparkSession, source: BoundSource, version: int, instant: int, declared: StartAt, newest: int
) -> tuple[Entry, list[delta_io.Commit]]:
    """The start entry at `version`, its history stamped at `instant` (`job_start`'s time: the job's
    start for a stream, its own commit for a table), and the commits from it on that it read from
    the table's history (a stream source's first entries are made from them too); `newest`: the
    newest version the caller knows of (a hint)."""
    commits = delta_io.history(spark, source.spec.location, since=version, upto=newest)
    enabled_after_start = any(c.enables_row_tracking and c.version > version for c in commits)
    tracked = delta_io.row_tracking(spark, source.spec.location) and not enabled_after_start
    entry = Entry(
        source.name,
        version,
        instant,
        start=True,
        row_tracking=tracked,
        max_future=source.max_future(),
        declared=None if declared is None else str(declared),
    )
    return entry, commits


def _check_same_future_bound(spark: SparkSession, plan: Plan, source: BoundSource, start: Entry) -> None:
    """Refuse a `max_future` under which the index's entries would differ from those stored: a
    tighter bound that an accepted row exceeds, or a looser one beyond which rows were rejected.
    (An index written before the bound existed was computed without one.)"""
    stored, wanted = start.max_future, source.max_future()
    if source.spec.kind != "stream" or stored == wanted:
        return
    stored_frame = _read(spark, plan)
    assert stored_frame is not None
    mine = stored_frame.frame.where(F.col("source") == source.name)
    if wanted is not None and (stored is None or wanted < stored):
        conflict = mine.where(F.col("max_event") > F.col("commit_ts") + F.lit(wanted))
    else:
        assert stored is not None
        conflict = mine.where(F.col("max_time") > F.col("commit_ts") + F.lit(stored))
    clash = conflict.orderBy("version").first()
    if clash is None:
        return
    said = "none" if wanted is None else format_duration(timedelta(microseconds=wanted))
    was = "none" if stored is None else format_duration(timedelta(microseconds=stored))
    raise JobError(
        f"job {plan.spec.name!r}: source {source.name!r} has max_future {said}, but {location(plan)} was computed "
        f"with {was}, and version {clash['version']} holds rows the two bounds treat differently: the watermarks "
        f"of every output so far would change. Keep max_future: {was}, or start the job afresh (new output, "
        "or delete its outputs and its index)"
    )


@dataclass
class _Pending:
    """A stream source's new commits, before their entries are made: the versions wanted, the
    stats known (from rows the caller holds, or read), and the query for the others' stats."""

    source: BoundSource
    start: Entry
    upto: int
    so_far: int | None
    commits: dict[int, delta_io.Commit]
    wanted: list[int]
    stats: dict[int, arrival.CommitStats | None]
    unknown: list[int]  # the wanted versions not in `stats`
    query: DataFrame | None  # their stats, by version

    def entries(self) -> list[Entry]:
        """Entries for the wanted versions: one per commit with rows, and the start and the last
        version looked at (how far the index goes) even without rows."""
        start, so_far, entries = self.start, self.so_far, []
        for version in self.wanted:
            r = self.stats.get(version)
            if r is None and version not in (start.version, self.upto):
                continue  # no rows (OPTIMIZE, a schema change): not a position
            max_event = r.max_event if r else None
            if max_event is not None and (so_far is None or max_event > so_far):
                so_far = max_event
            entries.append(
                Entry(
                    self.source.name,
                    version,
                    _commit_ts(start, self.commits, version),
                    r.rows if r else 0,
                    r.rejected if r else 0,
                    max_event,
                    so_far,
                    r.min_time if r else None,
                    r.max_time if r else None,
                    r.untimed if r else 0,
                    start=version == start.version,
                    row_tracking=start.row_tracking if version == start.version else None,
                    max_future=start.max_future if version == start.version else None,
                    declared=start.declared if version == start.version else None,
                )
            )
        return entries


def _pending(
    spark: SparkSession,
    source: BoundSource,
    start: Entry,
    versions: tuple[int, int],
    so_far: int | None = None,
    held: dict[int, arrival.CommitStats] | None = None,
    history: list[delta_io.Commit] | None = None,
) -> _Pending:
    """The versions (after, upto] of a stream source (its history too when `after` is before the
    start), with what is known of them; refuses commits that update or delete rows of an
    append-only source. `so_far` is the source's largest accepted event time up to `after`; `held`
    as in `update`; `history`: the table's commits from max(after, start) to at least `upto`, if
    the caller has just read them (else they are read here)."""
    after, upto = versions
    since = max(after, start.version)
    if not history or history[0].version != since or history[-1].version < upto:
        history = delta_io.history(spark, source.spec.location, since=since, upto=upto)
    commits = {c.version: c for c in history}
    _refuse_gone(source, since, upto, commits)
    rewrites = [c for c in commits.values() if c.version > since and c.rewrites_rows]
    if rewrites:
        _refuse_rewrites(source, f"version {rewrites[0].version} is a {rewrites[0].operation}")
    wanted = sorted(v for v in commits if after < v <= upto)
    known: dict[int, arrival.CommitStats | None]
    if after < start.version:  # the history too: known without a read only where it is all
        known = {0: None} if upto == start.version and _empty_history(history) else {}
    else:
        known = _complete(held or {}, commits, start, wanted)
    unknown = [v for v in wanted if v not in known]
    query = _stats_query(spark, source, start, commits, unknown) if unknown else None
    return _Pending(source, start, upto, so_far, commits, wanted, known, unknown, query)


def _empty_history(commits: list[delta_io.Commit]) -> bool:
    """`commits` (a source's, from its start on) start at version 0, and its log says the table was
    created empty: a history known without reading a row."""
    return commits[0].version == 0 and commits[0].created_rows == 0


def _complete(
    held: dict[int, arrival.CommitStats],
    commits: dict[int, delta_io.Commit],
    start: Entry,
    versions: list[int],
) -> dict[int, arrival.CommitStats | None]:
    """The stats of the `versions` whose every row the caller holds: a commit the log says appended
    exactly as many rows as `held` counts for it, at the commit time the rows carry (None: an
    operation that changes no row)."""
    complete: dict[int, arrival.CommitStats | None] = {}
    for version in versions:
        appended, mine = commits[version].appended_rows, held.get(version)
        if appended is None or (mine.rows if mine else 0) != appended:
            continue  # cut by maxFilesPerTrigger, or a commit only its change feed can tell
        if mine is not None and mine.position.time != _commit_ts(start, commits, version):
            continue
        complete[version] = mine
    return complete


def _stats_query(
    spark: SparkSession,
    source: BoundSource,
    start: Entry,
    commits: dict[int, delta_io.Commit],
    versions: list[int],
) -> DataFrame:
    """The stats of `versions` (ascending) from their rows, by version: the change feed of the new
    commits while Delta keeps it, else the latest snapshot with row tracking (the history too,
    from the start)."""
    first, last = versions[0], versions[-1]
    rows = None
    if first > start.version:
        try:
            rows = _tagged(delta_io.read_changes(spark, source.spec.location, last, first), source)
        except HistoryNotRetainedError:
            if not start.row_tracking:
                raise
    if rows is None:
        rows = _all_rows(spark, source, start, last).where(F.col(V) >= F.lit(first))
    rows = rows.where(F.col(V).isin(versions)) if len(versions) < last - first + 1 else rows
    if source.max_future() is not None or source.commit_time:  # these need each row's commit time
        times = [(v, _commit_ts(start, commits, v)) for v in versions]
        rows = _positioned(rows, local_frame(spark, times, _COMMIT_TIMES), source)
    insert = F.col(CHANGE_TYPE) == "insert" if CHANGE_TYPE in rows.columns else F.lit(True)
    accepted = insert & F.col(REJECT).isNull()
    return rows.groupBy(V).agg(
        F.count(F.when(insert, 1)).alias("rows"),
        F.count(F.when(insert & F.col(REJECT).isNotNull(), 1)).alias("rejected"),
        F.max(F.when(accepted, F.col(T))).alias("max_event"),
        F.min(F.when(insert, F.col(T))).alias("min_time"),
        F.max(F.when(insert, F.col(T))).alias("max_time"),
        F.count(F.when(insert & F.col(T).isNull(), 1)).alias("untimed"),
        F.count(F.when(~insert, 1)).alias("rewritten"),
    )


def _read_stats(pending: list[_Pending]) -> None:
    """Run the stats queries of every source's new commits as one Spark job (a job's fixed cost,
    a few tenths of a second, dwarfs what a commit's rows cost) and file the results."""
    queries = [
        p.query.withColumn("_sj_source", F.lit(n)) for n, p in enumerate(pending) if p.query is not None
    ]
    if not queries:
        return
    for r in reduce(DataFrame.unionByName, queries).collect():
        p = pending[r["_sj_source"]]
        if r["rewritten"]:
            _refuse_rewrites(
                p.source, f"its change feed after version {p.unknown[0] - 1} holds updated or deleted rows"
            )
        p.stats[r[V]] = arrival.CommitStats(
            Position(_commit_ts(p.start, p.commits, r[V]), p.source.index, r[V]),
            r["max_event"],
            r["rows"],
            r["rejected"],
            min_time=r["min_time"],
            max_time=r["max_time"],
            untimed=r["untimed"],
        )


def _commit_ts(start: Entry, commits: dict, version: int) -> int:
    """A commit's time in UTC micros: the start entry's for the start version (its history)."""
    return start.commit_ts if version == start.version else to_micros(from_spark(commits[version].timestamp))


_COMMIT_TIMES = StructType([StructField("version", LongType()), StructField("commit_ts", LongType())])


def _positioned(rows: DataFrame, times: DataFrame, source: BoundSource) -> DataFrame:
    """Rows with the commit time of their version from `times` (version, commit_ts), and what
    needs it: the event time of a `time: commit` source, the `max_future` guard."""
    times = times.select(F.col("version").alias("_sj_iv"), F.col("commit_ts").alias("_sj_its"))
    joined = rows.drop(TS).join(F.broadcast(times), F.col(V) == F.col("_sj_iv"), "left")
    timed = {TS} | ({T} if source.commit_time else set())
    positioned = joined.select(*[F.col("_sj_its").alias(c) if c in timed else c for c in rows.columns])
    return arrival.guard_future(positioned, source.max_future())


def _refuse_gone(source: BoundSource, since: int, upto: int, commits: dict[int, delta_io.Commit]) -> None:
    """Refuse commits (since, upto] that left the source's log before the index placed them: their
    rows are still in the table, but without their commit no run can tell when they arrived
    (a replay would read them and count them nowhere)."""
    first = min((v for v in commits if v > since), default=upto + 1)
    if first <= since + 1:
        return
    raise HistoryNotRetainedError(
        f"source {source.name!r} ({source.spec.location}): {_versions_text(since + 1, first - 1)} left its "
        f"Delta log (cleaned up after delta.logRetentionDuration) before the job's arrival index placed them "
        f"(it reaches version {since}); their rows cannot be given the time they arrived. Start the job again "
        f"at a version its log still holds (`streamjoin reset JOB --yes`, then start_at or --from {first} or "
        "later), and bring the index up to date more often than the log retention (`streamjoin index JOB`, "
        "daily)"
    )


def _versions_text(first: int, last: int) -> str:
    return f"version {first} has" if first == last else f"versions {first} to {last} have"


def refuse_rewrites_after(spark: SparkSession, plan: Plan, versions: dict[str, int]) -> None:
    """Refuse a stream source with a commit after `versions[name]` (the newest indexed) that
    updates or deletes rows (up to the source's newest version). What a live micro-batch checks
    first: its stream reads inserts only, and a batch holding no insert of the source would pass
    such a commit without a word (docs/semantics.md)."""
    for source in plan.streams:
        since = versions.get(source.name, -1) + 1
        if delta_io.latest_version(spark, source.spec.location) < since:
            continue
        rewrites = [c for c in delta_io.history(spark, source.spec.location, since=since) if c.rewrites_rows]
        if rewrites:
            _refuse_rewrites(source, f"version {rewrites[0].version} is a {rewrites[0].operation}")


def _refuse_rewrites(source: BoundSource, what: str) -> None:
    raise JobError(
        f"stream source {source.name!r} ({source.spec.location}) is append-only, but {what}: rows already "
        "decided would change. Declare it kind: table (a keyed table updated in place), or write corrections "
        "as new rows"
    )


# ---------------------------------------------------------------------------- reading rows


def _tagged(raw: DataFrame, source: BoundSource) -> DataFrame:
    """Rows of a source with event time, version and rejection reason; their commit time comes from
    the index (`Index._with_commit_times`). A `_change_type` column, if any, is kept. The rows are
    put in the job's columns of the source (`delta_io.in_columns`), so that reads of versions of
    different schemas unite."""
    return arrival.prepare(
        delta_io.in_columns(raw, source.schema).withColumn(COMMIT_TIMESTAMP, F.lit(None).cast("timestamp")),
        source.index,
        source.raw_time(),
        source.event_time(),
        source.keys,
        commit_time=source.commit_time,
    )


def _tracked(rows: DataFrame, source: BoundSource, start: Entry) -> DataFrame:
    """Rows read with row tracking (`_metadata.row_commit_version`), tagged; rows committed at or
    before the start version are its history and count at that version."""
    return _tagged(rows, source).withColumn(V, F.greatest(F.col(V), F.lit(start.version)))


def _all_rows(spark: SparkSession, source: BoundSource, start: Entry, version: int) -> DataFrame:
    """Every row of the source up to `version`, tagged, with rows of the history at the start version."""
    location_ = source.spec.location
    if start.row_tracking:
        return _tracked(delta_io.read_rows(spark, location_, version), source, start)
    history = _history_rows(spark, source, start)
    if version <= start.version:
        return history
    return history.unionByName(
        _tagged(delta_io.read_inserts(spark, location_, version, start.version + 1), source)
    )


def _history_rows(spark: SparkSession, source: BoundSource, start: Entry) -> DataFrame:
    """The rows a source held at its start version, all at that version (no row tracking)."""
    location_ = source.spec.location
    if start.version == 0:  # version 0's rows are exactly its change feed's inserts
        return _tagged(delta_io.read_inserts(spark, location_, 0, 0), source)
    with delta_io.translated_errors(location_, f"its start version {start.version}"):
        snapshot = delta_io.read_snapshot(spark, location_, start.version)
    return _tagged(snapshot.withColumn(COMMIT_VERSION, F.lit(start.version).cast("long")), source)


@dataclass
class Index:
    """A job's index as of pinned versions: starts, positions, the frontier, watermarks, slice reads."""

    spark: SparkSession
    plan: Plan
    starts: dict[str, Entry]
    versions: dict[str, int]
    lasts: dict[str, Entry]  # each source's newest entry (what the next `update` continues from)
    # (source, version) -> rows, of the entries the update that made this index wrote: the live
    # runner asks for the commits it has just indexed, without a query of the stored table
    written: dict[tuple[str, int], int] = field(default_factory=dict)
    # (source, version, commit_ts) of the commits holding rows too far ahead; asked once, when needed
    leading: list[tuple[str, int, int]] | None = None

    def _frame(self) -> DataFrame:
        pinned = reduce(
            Column.__or__,
            [
                (F.col("source") == s.name) & (F.col("version") <= F.lit(self.versions[s.name]))
                for s in self.plan.sources
            ],
        )
        stored = _read(self.spark, self.plan)
        assert stored is not None  # `update`, the only maker of an Index, writes the index first
        return stored.frame.where(pinned)

    @property
    def history_end(self) -> Position | None:
        """The last position of the job's history: the latest of the stream sources' start entries,
        all at the start instant. Positions up to it are history, one group that arrived at once
        (docs/semantics.md, "Where a job starts")."""
        return max((self.starts[s.name].position(s.index) for s in self.plan.streams), default=None)

    def start(self, source: str) -> int:
        """The version a source starts at."""
        return self.starts[source].version

    def rows(self, source: str, version: int) -> int:
        """How many rows a commit of a stream source inserted (its history, for the start version)."""
        if (source, version) in self.written:
            return self.written[(source, version)]
        row = (
            self._frame()
            .where((F.col("source") == source) & (F.col("version") == F.lit(version)))
            .select("rows")
            .first()
        )
        return row["rows"] if row else 0

    # -- time

    def newest(self) -> dict[int, Position]:
        """Each stream source's newest position with rows, up to the pinned versions (no query when
        every source's newest entry is its pinned version and holds rows, as it usually does)."""
        newest = {
            s.index: self.lasts[s.name].position(s.index)
            for s in self.plan.streams
            if s.name in self.lasts
            and self.lasts[s.name].version == self.versions[s.name]
            and self.lasts[s.name].rows
        }
        if len(newest) == len(self.plan.streams):
            return newest
        newest = {}
        rows = (
            self._frame()
            .where(F.col("rows") > 0)
            .groupBy("source")
            .agg(F.max_by(F.struct("commit_ts", "version"), "version").alias("p"))
            .collect()
        )
        for r in rows:
            src = self.plan.source(r["source"]).index
            newest[src] = Position(r["p"]["commit_ts"], src, r["p"]["version"])
        return newest

    def settled_commits(self, ranges: dict[str, tuple[int, int]], frontier: Position | None) -> set[Position]:
        """The commits, at or before `frontier`, that can hold accepted rows of a stream source
        whose event times lie in its range `ranges[source]`: those with accepted rows whose range
        of event times meets it (a superset of the commits of the rows a replay reads, found in the
        index without reading the rows)."""
        if frontier is None or not ranges:
            return set()
        meets = reduce(
            Column.__or__,
            [
                (F.col("source") == name)
                & (F.col("max_time") >= F.lit(low))
                & (F.col("min_time") < F.lit(high))
                for name, (low, high) in ranges.items()
            ],
        )
        found = (
            self._frame()
            .where(F.col("max_event").isNotNull() & (F.col("commit_ts") <= F.lit(frontier.time)) & meets)
            .select("source", "version", "commit_ts")
            .collect()
        )
        positions = {
            Position(r["commit_ts"], self.plan.source(r["source"]).index, r["version"]) for r in found
        }
        return {p for p in positions if p <= frontier}

    def timeline(self, commits: set[Position], frontier: Position | None) -> Timeline:
        """The largest accepted event time strictly before each of `commits` (positions), and at the
        frontier: what `kernel.step` turns into watermarks. Reads only the index rows between the
        earliest of the commits and the frontier, plus each source's last row before them."""
        if frontier is None:
            return Timeline({}, None)
        frame = self._frame().where(F.col("rows") > 0)
        earliest = min((p.time for p in commits), default=frontier.time)
        span = frame.where(
            (F.col("commit_ts") >= F.lit(earliest)) & (F.col("commit_ts") <= F.lit(frontier.time))
        )
        before = (
            frame.where(F.col("commit_ts") < F.lit(earliest))
            .groupBy("source")
            .agg(F.max_by(F.struct(*SCHEMA.fieldNames()), "version").alias("e"))
            .select("e.*")
        )
        entries = [
            (e.position(self.plan.source(e.source).index), e.max_so_far)
            for e in _entries(span.unionByName(before))
        ]
        return sweep(entries, commits, frontier, self.history_end)

    # -- rows

    def read_rows(
        self, source: BoundSource, time_range: tuple[int, int], owned: tuple[int, int]
    ) -> DataFrame:
        """The source's rows up to its pinned version whose event time lies in `time_range`, and
        the rows without a usable event time, or rejected for leading it too far, whose commit time
        lies in `owned` (the slice owns them), tagged and positioned (`arrival.prepare`'s columns)."""
        start, version = self.starts[source.name], self.versions[source.name]
        low, high = time_range
        raw_low, raw_high = from_micros(low), from_micros(high)
        if start.row_tracking:
            snapshot = delta_io.read_rows(self.spark, source.spec.location, version)
            raw = source.raw_time()
            if source.time_is_timestamp():  # lets Delta skip files by the time column's statistics
                near = raw.isNull() | ((raw >= F.lit(raw_low)) & (raw < F.lit(raw_high)))
                ahead = self._ahead_versions(source, owned)
                rows = _tracked(snapshot.where(near), source, start)
                if ahead:  # and the rows this slice owns by commit time for leading it too far
                    far = _tracked(snapshot.where(~near), source, start)
                    rows = rows.unionByName(far.where(F.col(V).isin(ahead)))
            else:
                rows = _tracked(snapshot, source, start)
        else:
            rows = self._rows_from_change_feed(source, time_range, owned)
        return self._with_commit_times(source, rows).where(arrival.in_reach(time_range, owned))

    def _leading(self, source: BoundSource) -> Column:
        """Index rows of commits holding a row whose event time leads the commit by more than
        `max_future` (rows rejected as `future_event_time`, owned by their commit time)."""
        bound = source.max_future()
        if bound is None:
            return F.lit(False)
        return F.col("max_time") > F.col("commit_ts") + F.lit(bound)

    def _ahead_versions(self, source: BoundSource, owned: tuple[int, int]) -> list[int]:
        """The versions, committed in `owned`, of commits holding rows too far ahead (`_leading`);
        the index is asked once for every source's such commits (rare: a clock error's)."""
        if source.max_future() is None:
            return []
        if self.leading is None:
            leading = reduce(
                Column.__or__, [(F.col("source") == s.name) & self._leading(s) for s in self.plan.streams]
            )
            self.leading = [
                (r["source"], r["version"], r["commit_ts"])
                for r in self._frame().where(leading).select("source", "version", "commit_ts").collect()
            ]
        return [v for name, v, ts in self.leading if name == source.name and owned[0] <= ts < owned[1]]

    def read_all(self, source: BoundSource, version: int | None = None) -> DataFrame:
        """Every row of the source up to `version` (default: pinned), tagged and positioned."""
        version = self.versions[source.name] if version is None else version
        return self._with_commit_times(
            source, _all_rows(self.spark, source, self.starts[source.name], version)
        )

    def _rows_from_change_feed(
        self, source: BoundSource, time_range: tuple[int, int], owned: tuple[int, int]
    ) -> DataFrame:
        """Without row tracking: the change feed of only the versions whose rows can matter."""
        start = self.starts[source.name]
        low, high = time_range
        meets = (F.col("max_time") >= F.lit(low)) & (F.col("min_time") < F.lit(high))
        untimed = (
            ((F.col("untimed") > 0) | self._leading(source))
            & (F.col("commit_ts") >= F.lit(owned[0]))
            & (F.col("commit_ts") < F.lit(owned[1]))
        )
        needed = sorted(
            {
                r["version"]
                for r in self._frame()
                .where((F.col("source") == source.name) & (F.col("rows") > 0) & (meets | untimed))
                .select("version")
                .collect()
            }
        )
        parts = []
        if needed and needed[0] == start.version:
            parts.append(_history_rows(self.spark, source, start))
            needed = needed[1:]
        for first, last in _runs(needed):
            raw = delta_io.read_inserts(self.spark, source.spec.location, last, first)
            parts.append(_tagged(raw, source))
        if not parts:  # no version can hold rows of the slice: no rows, in the shape of the pinned snapshot's
            pinned = delta_io.read_snapshot(self.spark, source.spec.location, self.versions[source.name])
            return _tagged(pinned.withColumn(COMMIT_VERSION, F.lit(0).cast("long")), source).limit(0)
        return reduce(DataFrame.unionByName, parts)

    def _with_commit_times(self, source: BoundSource, rows: DataFrame) -> DataFrame:
        """Each row's commit time, from the index (the same value live reads from the change feed)."""
        return _positioned(rows, self._frame().where(F.col("source") == source.name), source)


def sweep(
    entries: list[tuple[Position, int | None]],
    commits: set[Position],
    frontier: Position,
    history_end: Position | None = None,
) -> Timeline:
    """The timeline of `commits` from index entries (position, the source's largest accepted event
    time up to and including that commit): before each commit, the largest over the sources of
    their latest entry strictly before it; through it, the same with its own entry; at the end, of
    their latest entry at or before the frontier; and where the clock rises in between (`_rises`),
    each rise and the frontier with its marks too. The entries at or before `history_end` are the
    job's history, one group (as `arrival.timeline` has it): a commit of it sees nothing of the
    group before it, and the whole group through it.
    `entries` must hold, per source, every entry from its last one before the earliest commit up
    to the frontier."""
    entries = sorted(entries, key=lambda entry: entry[0])
    rises = _rises(entries, commits, frontier, history_end)
    history_entries = [e for e in entries if arrival.in_history(e[0], history_end)]
    # The clock after the history: each source's last entry in it.
    history_clock = arrival.max_present({p[1]: v for p, v in history_entries}.values())
    latest: dict[int, int | None] = {}  # source index -> max so far
    marks: dict[tuple[int, int], int | None] = {}
    through: dict[tuple[int, int], int | None] = {}
    i = 0
    # The rises and the frontier too: a chain's derived rows arrive at them (`Timeline.rises`).
    targets = commits | {position for _, position in rises} | ({frontier} if commits else set())
    for target in sorted(targets):
        grouped = arrival.in_history(target, history_end)
        while (
            i < len(entries)
            and entries[i][0] < target
            and not (grouped and arrival.in_history(entries[i][0], history_end))
        ):
            latest[entries[i][0][1]] = entries[i][1]
            i += 1
        marks[(target[1], target[2])] = arrival.max_present(latest.values())
        if grouped:
            through[(target[1], target[2])] = arrival.max_present([*latest.values(), history_clock])
            continue
        own = [entries[i][1]] if i < len(entries) and entries[i][0] == target else []
        through[(target[1], target[2])] = arrival.max_present([*latest.values(), *own])
    start = next(iter(marks.values())) if marks else None
    while i < len(entries) and entries[i][0] <= frontier:
        latest[entries[i][0][1]] = entries[i][1]
        i += 1
    return Timeline(marks, arrival.max_present(latest.values()), through, start, rises, frontier)


def _rises(
    entries: list[tuple[Position, int | None]],
    commits: set[Position],
    frontier: Position,
    history_end: Position | None = None,
) -> tuple[tuple[int, Position], ...]:
    """Every commit from the earliest of `commits` to the frontier at which the largest accepted
    event time over the sources rises, with the clock after it (`entries` sorted); the job's
    history (entries at or before `history_end`) rises once, at its last entry."""
    if not commits:
        return ()
    first, latest, clock, rises = min(commits), {}, None, []
    for k, (position, value) in enumerate(entries):
        if position > frontier:
            break
        latest[position.source] = value
        if k + 1 < len(entries) and arrival.in_history(entries[k + 1][0], history_end):
            continue  # the history arrives as one: its clock counts after its last entry
        now = arrival.max_present(latest.values())
        if position >= first and now is not None and (clock is None or now > clock):
            rises.append((now, position))
        clock = now
    return tuple(rises)


def _runs(versions: list[int], gap: int = 8) -> list[tuple[int, int]]:
    """Sorted versions as ranges to read, merging ranges less than `gap` versions apart."""
    runs: list[list[int]] = []
    for v in versions:
        if runs and v - runs[-1][1] <= gap:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return [(a, b) for a, b in runs]


# ---------------------------------------------------------------------------- the stored table


@dataclass
class _Stored:
    """The stored index as read. A retried append may have stored an entry twice (identical rows):
    `frame` keeps such copies, which cost a shuffle to drop in Spark, and its readers drop them
    where they collect (`_entries`) or where a copy cannot change their answer."""

    frame: DataFrame

    def heads(self) -> tuple[dict[str, Entry], dict[str, Entry]]:
        """Each source's start entry and its newest entry, read in one query."""
        newest = F.max("version").over(Window.partitionBy("source"))
        heads = _entries(
            self.frame.withColumn("_sj_newest", newest)
            .where(F.col("start") | (F.col("version") == F.col("_sj_newest")))
            .drop("_sj_newest")
        )
        starts = {e.source: e for e in heads if e.start}
        return starts, _newest({}, heads)


def _read(spark: SparkSession, plan: Plan) -> _Stored | None:
    return _read_at(spark, location(plan))


# While a run is inside `heads_read_once`: each index's heads (start and newest entries), by location.
_HEADS: ContextVar[dict[str, tuple[dict[str, Entry], dict[str, Entry]]] | None] = ContextVar(
    "streamjoin_index_heads", default=None
)


@contextmanager
def heads_read_once() -> Iterator[None]:
    """While inside (one run), an index's heads are read from the stored table once: the run's
    checks and its update ask for them in turn, and the update keeps them current as it appends."""
    token = _HEADS.set({})
    try:
        yield
    finally:
        _HEADS.reset(token)


def _heads(spark: SparkSession, plan: Plan) -> tuple[dict[str, Entry], dict[str, Entry]]:
    """Each source's start entry and newest entry of the stored index (none before it exists)."""
    memo, where = _HEADS.get(), location(plan)
    if memo is not None and where in memo:
        return memo[where]
    stored = _read(spark, plan)
    heads = stored.heads() if stored else ({}, {})
    _remember(plan, heads)
    return heads


def _remember(plan: Plan, heads: tuple[dict[str, Entry], dict[str, Entry]]) -> None:
    """Keep `heads` as the index's current heads for the rest of the run (`heads_read_once`)."""
    memo = _HEADS.get()
    if memo is not None:
        memo[location(plan)] = heads


def _read_at(spark: SparkSession, where: str) -> _Stored | None:
    frame = delta_io.read_own(spark, where, SCHEMA)
    if frame is None:
        return None
    for column in SCHEMA:  # an index written before a column was added
        if column.name not in frame.columns:
            frame = frame.withColumn(column.name, F.lit(None).cast(column.dataType))
    return _Stored(frame)


def _newest(lasts: dict[str, Entry], entries: list[Entry]) -> dict[str, Entry]:
    """Each source's newest entry among `lasts` (one per source) and `entries`."""
    newest = dict(lasts)
    for e in entries:
        if e.source not in newest or e.version > newest[e.source].version:
            newest[e.source] = e
    return newest


def _entries(frame: DataFrame) -> list[Entry]:
    """The entries `frame` holds, each once (`_Stored`)."""
    rows = {(r["source"], r["version"]): r for r in frame.collect()}
    return [
        Entry(**{k: r[k] for k in SCHEMA.fieldNames() if k != "commit_ts"}, commit_ts=r["commit_ts"])
        for r in rows.values()
    ]


def _row(e: Entry) -> tuple:
    return (
        e.source,
        e.version,
        e.commit_ts,
        e.rows,
        e.rejected,
        e.max_event,
        e.max_so_far,
        e.min_time,
        e.max_time,
        e.untimed,
        e.start,
        e.row_tracking,
        e.max_future,
        e.declared,
    )


def clock_jumps(spark: SparkSession, where: str, count: int = 10) -> list[dict]:
    """The `count` commits that moved the job's event-time clock (the largest accepted event time
    of all its streams so far; every watermark is it minus a grace) furthest, from the index at
    `where`, in commit order: source, version, commit_ts, before, after (UTC micros)."""
    stored = _read_at(spark, where)
    if stored is None:
        return []
    so_far = Window.orderBy("commit_ts", "source", "version")
    clock = (
        stored.frame.dropDuplicates(["source", "version"])
        .where(F.col("max_event").isNotNull())
        .withColumn("before", F.max("max_event").over(so_far.rowsBetween(Window.unboundedPreceding, -1)))
        .where(F.col("max_event") > F.col("before"))
        .select("source", "version", "commit_ts", "before", F.col("max_event").alias("after"))
    )
    top = clock.orderBy((F.col("after") - F.col("before")).desc(), "commit_ts").limit(count).collect()
    return sorted((r.asDict() for r in top), key=lambda r: (r["commit_ts"], r["source"], r["version"]))


def describe(index: Index) -> str:
    """What `streamjoin index` prints: each source's start and newest indexed commit."""
    lines = [f"arrival index {location(index.plan)}"]
    newest = index.newest()
    for source in index.plan.sources:
        start = index.starts[source.name]
        text = (
            f"  {source.name}: starts at version {start.version} ({from_micros(start.commit_ts).isoformat()})"
        )
        if source.spec.kind == "stream":
            text += (
                ", rows carry their version (row tracking)"
                if start.row_tracking
                else ", read through the change feed"
            )
            if source.index in newest:
                ts, _, version = newest[source.index]
                text += f"; indexed up to version {index.versions[source.name]}, newest rows at version {version} ({from_micros(ts).isoformat()})"
        lines.append(text)
    return "\n".join(lines)
