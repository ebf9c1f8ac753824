"""The live runner: Spark Structured Streaming over the sources' change data feeds, exactly once.

Every job (stream sources, table sources, or both) runs one micro-batch (foreachBatch), the
catch-up and a hand-off's seed through the same pipeline, prepare -> step -> commit:
  1. If a progress record exists for this batch, it completed before a restart: do nothing.
  2. Prepare: tag the new rows, read the state the previous batch left (rows still open, rows not
     yet settled: a parquet folder per batch under <checkpoint>/streamjoin/state, trusted only
     once its record exists), extend the arrival index to the batch's commits (entries kept).
  3. Step: move the frontier, read the table sources, and hand the rows it settles, with the open
     state and the marks kept, to the kernel (the same `kernel.step` the replay calls).
  4. Commit: write the output, late and rejected rows and the metrics row exactly once
     (`delta_io.write_once`: each commit tagged with this checkpoint's id and the batch id, and
     the table's version before the batch's first attempt kept in
     <checkpoint>/streamjoin/writes.json), then the new state, then the progress record
     (<checkpoint>/streamjoin/progress/<batch>.json, by atomic rename), which also holds the index
     entries kept; they are appended together (`_append_index`).
A batch that fails anywhere is re-run by Spark from the checkpoint with the same input; the writes
that already committed are found by their tags and skipped, the rest are recomputed from the same
state.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from functools import reduce
from typing import Any

import pendulum
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import BooleanType, IntegerType, LongType, StructField, StructType

from streamjoin import (
    accounting,
    arrival,
    atomic,
    changelog,
    definition,
    delta_io,
    drift,
    errors,
    index,
    journal,
    kernel,
    lease,
)
from streamjoin.arrival import SRC, TS, V
from streamjoin.changelog import TableInput
from streamjoin.delta_io import COMMIT_TIMESTAMP, COMMIT_VERSION
from streamjoin.errors import CheckpointError, JobError
from streamjoin.joins.base import SliceCounts, counted_pass
from streamjoin.metrics import RunMetrics, SourceCounts, Stopwatch, explain_late, to_frame
from streamjoin.plan import BoundSource, Plan, bind
from streamjoin.runners import hooks
from streamjoin.spec import JoinSpec, Output
from streamjoin.timeutil import from_micros, parse_duration

PENDING = "_sj_pending"  # arrived after the frontier: lateness not decided yet
SEED_BATCH = -1  # the step before the first micro-batch: a new checkpoint's catch-up, or a hand-off's seed
_IDX = "_sj_source"
# A run appends the index entries of its micro-batches' commits together (`LiveRunner._append_index`):
# with a batch that writes no output rows or has late rows, when it stops, or once this many are kept.
INDEX_EVERY = 256
_DERIVED = 1000  # the first tag of rows an operator derives and keeps (beside the sources' indices)
MARKER = "streamjoin.json"  # in the checkpoint folder: the checkpoint's identity (`LiveRunner._marker`)
# What to do when a checkpoint cannot go on (the commits it has to read are gone, a file of it is lost).
_CONTINUE_ELSEWHERE = (
    "Backfill the job up to a recent time T over the sources' current versions (`streamjoin backfill JOB "
    "--start ... --end T`), then continue live on a new checkpoint with `streamjoin handoff JOB --at T "
    "--checkpoint NEW`"
)


@dataclass(frozen=True)
class Progress:
    """What the last completed batch left: where to find its state and how far time has come."""

    batch: int
    max_event: int | None
    newest: dict[int, arrival.Position]
    carried: dict[str, int]
    # source -> (a commit cut by maxFilesPerTrigger, its rows so far)
    partial: dict[int, tuple[arrival.Position, int]] = field(default_factory=dict)
    tables: dict[int, int] = field(default_factory=dict)  # table source -> the version this batch read
    marks: dict[str, int] = field(default_factory=dict)  # what the operator keeps (`StepResult.marks`)
    # the arrival index entries of the commits read so far that are not appended yet (`index.deferred`)
    unindexed: tuple[index.Entry, ...] = ()

    def to_json(self) -> str:
        """The record a batch leaves in <checkpoint>/streamjoin/progress (JSON keys are strings)."""
        return json.dumps(
            {
                "batch": self.batch,
                "max_event": self.max_event,
                "carried": self.carried,
                "newest": {str(k): list(v) for k, v in self.newest.items()},
                "partial": {str(k): [list(p), n] for k, (p, n) in self.partial.items()},
                "tables": {str(k): v for k, v in self.tables.items()},
                "marks": self.marks,
                "unindexed": [asdict(entry) for entry in self.unindexed],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Progress:
        """The inverse of `to_json`; records written before `partial`, `tables`, `marks` or `unindexed`
        existed read as empty, except that the one mark kept before marks existed (`bound`) reads as that mark."""
        body = json.loads(text)
        before_marks = {} if body.get("bound") is None else {"bound": body["bound"]}
        return cls(
            batch=body["batch"],
            max_event=body["max_event"],
            newest={int(k): _position(v) for k, v in body["newest"].items()},
            carried=body["carried"],
            partial={int(k): (_position(v[0]), v[1]) for k, v in body.get("partial", {}).items()},
            tables={int(k): v for k, v in body.get("tables", {}).items()},
            marks=body.get("marks", before_marks),
            unindexed=tuple(index.Entry(**entry) for entry in body.get("unindexed", [])),
        )


def _position(value: list[int]) -> arrival.Position:
    ts, src, version = value
    return arrival.Position(ts, src, version)


class LiveRunner:
    """Runs a job continuously; `run()` with an available-now trigger processes what is there and stops.

    Making one reads and writes nothing but the checkpoint's marker (read): the job's index and a
    new checkpoint's marker are written once `start` or `seed` holds the checkpoint's lease."""

    positions: index.Index  # where each source starts, and its commits indexed so far (`_open`)

    def __init__(
        self,
        spark: SparkSession,
        spec: JoinSpec,
        checkpoint: str,
        trigger: str = "available-now",
        max_files_per_trigger: int | None = None,
        start_at: dict[str, index.StartAt] | None = None,
        on_batch: Callable[[RunMetrics], None] | None = None,
    ) -> None:
        self.spark = _micro_batch_session(spark)
        self.spec = spec
        self.plan: Plan = bind(spark, spec)
        self.join = kernel.runnable(spark, self.plan)
        kernel.reach_external(spark, self.plan)  # what live asks for every new commit must answer now
        self.start_at = start_at
        self.trigger = _trigger(trigger)
        self.max_files = max_files_per_trigger
        self.on_batch = on_batch or (lambda metrics: None)  # told of each micro-batch once it is recorded
        # told about once a second while the run waits for new data (heartbeat.py)
        self.on_wait: Callable[[], None] = lambda: None
        self.checkpoint = str(atomic.resolve(checkpoint))  # a local folder or a URL (atomic.py)
        self.home = f"{self.checkpoint}/streamjoin"
        new = {
            "job": spec.name,
            "app_id": f"streamjoin-{spec.name}-{uuid.uuid4()}",
            "tagged_writes": True,  # its batches' writes carry their own tags (`_written_after`)
            "definition": definition.definition_hash(spec),  # refused when the job changes (definition.py)
        }
        self._adopt(self._marker() or new)  # a new checkpoint's marker is written by `_open`
        self._opened = False
        self.runs: list[RunMetrics] = []  # the batches this runner processed, in order
        # The rows a batch packs into one frame (its arrivals, its state): each stream source's, and
        # the rows the operator derives and keeps (a chain's joined rows), by name: (tag, columns).
        self.parts = {s.name: (s.index, s.schema) for s in self.plan.streams} | {
            name: (_DERIVED + n, schema)
            for n, (name, schema) in enumerate(self.join.derived_state(self.plan).items())
        }
        self._lease: str | None = None  # the token of the checkpoint's lease, while this runner holds it
        # the output whose driver lease (lease.one_driver) it holds with it, on a store that needs one
        self._driver: str | None = None
        self._unindexed: list[index.Entry] = []  # entries its batches made, not appended yet
        self._query: StreamingQuery | None = None
        self._failure: errors.StreamJoinError | None = None  # what stopped the query, raised by `run`

    # ---------------------------------------------------------------- query

    def start(self) -> StreamingQuery:
        """Start the streaming query; it runs until stopped (or, available-now, until caught up).

        A new checkpoint whose stream sources start at version 0 and still hold every change file
        since streams from version 0. Otherwise it first catches up (`_catch_up`) and streams the
        commits after. Either way the output is the same: it does not depend on how commits are
        divided into batches (docs/architecture.md). Takes the checkpoint's lease first (released
        when `run` returns, or once the query has ended), before it writes anything."""
        fresh = not atomic.exists(self.checkpoint)
        self._take_lease()
        try:
            self._open()
            query = self._start()
        except BaseException:
            if fresh and not self.marker.get("owns_output") and not self.started():
                # refused before it claimed the output (so before any write): leave nothing behind.
                # Once claimed, its marker keys the exactly-once writes a retry must find.
                atomic.remove(self.checkpoint, recursive=True)
            self._release_lease()
            raise
        self._query = query
        return query

    def _take_lease(self) -> None:
        if self._query is not None and self._query.isActive:
            raise lease.CheckpointInUseError(f"this runner's query on {self.checkpoint} is still running")
        self._release_lease()  # held for a query this runner started earlier, which has ended
        self._query = None
        self._lease = lease.acquire(
            atomic.under(self.home, "lease.json"), lambda: self._query is None or self._query.isActive
        )
        output = self.spec.output.location
        if delta_io.single_driver_store(self.spark, output):  # and the job's tables' driver lease
            try:
                lease.hold_driver(output)
            except BaseException:
                self._release_lease()
                raise
            self._driver = output

    def _release_lease(self) -> None:
        if self._driver is not None:
            lease.let_go_driver(self._driver)
            self._driver = None
        if self._lease is not None:
            lease.release(atomic.under(self.home, "lease.json"), self._lease)
            self._lease = None

    def _open(self) -> None:
        """A run's first writes, made once it holds the lease (and once per runner): the job's
        index, created at the sources' start for a new job (a restart's micro-batches index the
        commits after it from their own rows; a new checkpoint's catch-up extends it to the
        sources' current versions first), and a new checkpoint's marker."""
        if self._opened:
            return
        self._check_definition()
        # The entries a run that stopped without appending them kept (killed, say), before the index
        # is read; an unreadable record is refused here, in one line, rather than inside a micro-batch.
        previous = self._progress()
        if previous is not None and previous.unindexed:
            self._unindexed = list(previous.unindexed)
            self._append_index(previous)
        self.positions = index.update(self.spark, self.plan, start_at=self.start_at, extend=False)
        stored = self._marker()  # another runner may have made it since this one read it
        if stored is None:
            atomic.replace_file(atomic.under(self.checkpoint, MARKER), json.dumps(self.marker))
        else:
            self._adopt(stored)
        if "definition" not in self.marker:  # a checkpoint made before definitions were hashed
            self._save_marker(definition=definition.definition_hash(self.spec))
        definition.stamp(self.spark, self.spec)
        self._write_record()
        self._opened = True

    def _check_definition(self) -> None:
        """Refuse, before anything is written, a job whose definition changed since its
        checkpoint, output or index was written (docs/backfills.md, "A changed definition")."""
        place = f"its live checkpoint {self.checkpoint}"
        definition.refuse_changed(self.marker.get("definition"), self.spec, place)
        definition.check(self.spark, self.spec)

    def _start(self) -> StreamingQuery:
        self._check_schemas()
        if not self.started():
            self._claim_output()
            self._catch_up()
        streams = []
        for source in self.plan.streams:
            stream = delta_io.stream_inserts(
                self.spark,
                source.spec.location,
                self.max_files,
                self.starting_versions.get(source.name, 0),
                self._schema_log(source.name),
                source.schema,
            )
            streams.append(
                stream.select(*self._payloads(source.index), F.col(COMMIT_VERSION), F.col(COMMIT_TIMESTAMP))
            )
        for source in self.plan.tables:
            # A table's commits start micro-batches too (rows may be waiting for them); the batch
            # reads the table itself, so these rows carry no payload.
            stream = delta_io.stream_changes(
                self.spark,
                source.spec.location,
                self.max_files,
                self.starting_versions.get(source.name, 0),
                self._schema_log(source.name),
            )
            streams.append(
                stream.select(*self._payloads(source.index), F.col(COMMIT_VERSION), F.col(COMMIT_TIMESTAMP))
            )
        union = reduce(DataFrame.unionByName, streams)
        writer = (
            union.writeStream.foreachBatch(self._process)
            .option("checkpointLocation", f"{self.checkpoint}/spark")
            .queryName(f"streamjoin_{self.spec.name}_{self.app_id[-8:]}")
        )
        return writer.trigger(**self.trigger).start()

    def _schema_log(self, source: str) -> str:
        """Where the streaming query tracks the schema it reads of `source` (delta_io.stream_changes)."""
        return f"{self.checkpoint}/spark/schema_log_{source}"

    def _check_schemas(self) -> None:
        """Before the query starts (again): refuse it if a source changed a column the job uses
        over the versions it reads, from the job's start to the newest (drift.py)."""
        starts = {name: entry.version for name, entry in self.positions.starts.items()}
        newest = {s.name: delta_io.latest_version(self.spark, s.spec.location) for s in self.plan.sources}
        drift.check(self.spark, self.plan, starts, newest)

    def run(
        self, timeout: float | None = None, stop_requested: Callable[[], bool] | None = None
    ) -> list[RunMetrics]:
        """Start and wait (available-now: until every committed row is processed; else until
        `timeout` seconds have passed or `stop_requested()` says so, then stop between two
        micro-batches); the batches' metrics."""
        already, self._failure = len(self.runs), None
        if self.started():
            what = "the commits this checkpoint has still to read"
            advice = (
                f"Checkpoint {self.checkpoint} stopped before them and cannot go on. {_CONTINUE_ELSEWHERE}"
            )
        else:
            what, advice = "the commits since the job's start", self._later_start_advice()
        locations = ", ".join(s.location for s in self.spec.sources)
        deadline = None if timeout is None else time.monotonic() + timeout
        with delta_io.translated_errors(locations, what, advice):
            while self._run_once(deadline, stop_requested or (lambda: False)):
                pass  # a source's schema changed: its schema log holds the new one; start again in it
        return self.runs[already:]

    def _run_once(self, deadline: float | None, stop_requested: Callable[[], bool]) -> bool:
        """Start the query and wait for it (`run`). True when it stopped at a schema change of a
        source (delta_io.schema_evolved), to be started again; any other failure is raised."""
        query = self.start()
        try:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            self._wait(query, left, stop_requested)
        except Exception as failure:  # awaitTermination raises the query's failure
            if self._failure is None and not delta_io.schema_evolved(failure):
                raise  # else raised below: streamjoin's own error as it is, or a restart
        finally:
            if query.isActive:
                query.stop()
            try:
                if query.exception() is None:
                    self._append_index(self._progress())
            finally:
                self._release_lease()
        error = query.exception()
        if error is None:
            return False
        if self._failure is not None:  # a batch's own error, not Spark's wrapper of it
            raise self._failure
        if delta_io.schema_evolved(error):
            return True
        raise error

    def progress(self) -> list[dict]:
        """Spark's progress reports of the last run's micro-batches (`StreamingQuery.recentProgress`):
        what bench/native.py compares with Spark's own stream-stream join."""
        return [] if self._query is None else [json.loads(p.json) for p in self._query.recentProgress]

    def _wait(self, query: StreamingQuery, timeout: float | None, stop_requested: Callable[[], bool]) -> None:
        """Wait for the query to end, the timeout, or a stop request; a requested stop waits for
        the micro-batch in progress to finish (its writes would be redone anyway, but need not be)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while query.isActive:
            if stop_requested():
                while query.isActive and query.status.get("isTriggerActive"):
                    time.sleep(0.2)
                return
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait < 0.001:  # Spark waits whole milliseconds, and refuses 0
                return
            # pyspark annotates timeout as int, but takes any positive number of seconds (int(timeout * 1000))
            query.awaitTermination(wait)  # type: ignore[arg-type]
            if not query.status.get("isTriggerActive"):  # waiting for data, not in a micro-batch
                self.on_wait()

    def _finished(self, metrics: RunMetrics) -> None:
        self.runs.append(metrics)
        self.on_batch(metrics)

    def _later_start_advice(self) -> str:
        """What a new checkpoint whose sources no longer hold the files of the job's start can do:
        start the job later, e.g. at the sources' current versions (which `--from` takes)."""
        sources = self.plan.streams or self.plan.tables  # the sources whose commits the catch-up reads
        versions = ",".join(
            f"{s.name}={delta_io.latest_version(self.spark, s.spec.location)}" for s in sources
        )
        return (
            f"Checkpoint {self.checkpoint} is new: it reads every source from the job's start, whose files "
            "OPTIMIZE and VACUUM (or the retention) have removed. Start the job later, at versions whose files "
            f"the sources still hold, e.g. their current ones: `streamjoin reset <job file> --yes --checkpoint "
            f"{self.checkpoint}` (it deletes the job's index, which pinned the old start, its output and this "
            f"checkpoint), then `streamjoin stream <job file> --checkpoint {self.checkpoint} --from {versions}`"
        )

    def started(self) -> bool:
        """Whether this checkpoint has processed (or been seeded with) anything: it holds a progress
        record or Spark's own checkpoint (told from the files alone, readable or not)."""
        records = atomic.names(atomic.under(self.home, "progress"))
        return any(name.endswith(".json") for name in records) or atomic.exists(
            atomic.under(self.checkpoint, "spark")
        )

    def _claim_output(self) -> None:
        """A new checkpoint takes the job's output only if no other run has written rows to it:
        it would write them again (it reads every source from its start), so the output would
        hold them twice. Claimed once (recorded in the checkpoint's marker), before any write, so
        the checkpoint's own rows never count against it on a restart."""
        if self.marker.get("owns_output"):
            return
        out = self.spec.output
        locations = [out.location, out.side("changes")]
        written = [loc for loc in locations if delta_io.exists(self.spark, loc)]
        if any(not delta_io.read_snapshot(self.spark, loc).isEmpty() for loc in written):
            raise JobError(
                f"output {out.location} already holds rows that checkpoint {self.checkpoint} did not write "
                "(a backfill, a replay, or a live checkpoint since removed); a new live checkpoint would write "
                "them again. To continue live where a backfill ended, run `streamjoin handoff JOB --at END`; "
                "to start over, delete the output and its side tables (_late, _rejected, _metrics, _index) "
                "or give the job another output"
            )
        self._save_marker(owns_output=True)

    def seed(self, versions: dict[str, int]) -> None:
        """Start this new checkpoint at `versions`: the state and progress the runner would have after
        every commit up to them, writing no output (a replay of the same versions wrote it). The
        streaming query then reads each source from the version after its seed. Holds the
        checkpoint's lease while it writes (the caller's, if it holds it already: `leased`)."""
        with contextlib.nullcontext() if self._lease is not None else self.leased():
            self._open()
            self._seed(versions)
            self._append_index(self._progress())

    @contextlib.contextmanager
    def leased(self) -> Iterator[None]:
        """Hold the checkpoint's lease while inside: for writes made on its behalf before it runs
        (a hand-off's replay, then its seed), so that no live runner writes beside them."""
        self._take_lease()
        try:
            yield
        finally:
            self._release_lease()

    def _seed(self, versions: dict[str, int]) -> None:
        if self.started():
            raise JobError(
                f"checkpoint {self.checkpoint!r} has already run; a hand-off starts a new checkpoint"
            )
        missing = sorted(s.name for s in self.plan.sources if s.name not in versions)
        if missing:
            raise JobError(f"a seed needs a version for every source; missing {', '.join(missing)}")
        step = _Step(SEED_BATCH, None, outputs=False, table_versions=versions)
        self.positions = index.update(self.spark, self.plan, versions)
        # The output holds what a replay of these versions wrote: this checkpoint continues it.
        self._save_marker(
            starting_versions={name: version + 1 for name, version in versions.items()}, owns_output=True
        )
        self._pipeline(self._arrivals(versions), step)

    def _catch_up(self) -> None:
        """A new checkpoint's first step, unless every source starts at version 0 and still holds
        every change file since: the sources up to their current versions, read without their
        change files (through the arrival index: the history at the start, each later commit at
        its own position), processed as one batch with outputs. The stream continues after them."""
        starts = {name: e.version for name, e in self.positions.starts.items()}
        if all(
            v == 0 and delta_io.change_files_kept(self.spark, self.plan.source(n).spec.location, 0)
            for n, v in starts.items()
        ):
            self._save_marker(starting_versions=dict.fromkeys(starts, 0))
            return
        self.positions = index.update(self.spark, self.plan, known=self.positions)
        versions = dict(self.positions.versions)
        self._save_marker(starting_versions={name: version + 1 for name, version in versions.items()})
        batch = self._arrivals(versions)
        if batch is None or not batch.isEmpty():  # stream sources without a row yet: nothing to do
            self._pipeline(batch, _Step(SEED_BATCH, None, table_versions=versions))

    def _at_start(self, rows: DataFrame, source: str) -> DataFrame:
        """Rows of `source` with their commit time; the history's (its start version's rows, which
        a stream from version 0 brings with version 0's own time) at the job's start instant."""
        start = self.positions.starts[source]
        at_start = F.when(
            F.col(COMMIT_VERSION) <= F.lit(start.version), F.timestamp_micros(F.lit(start.commit_ts))
        )
        return rows.withColumn(COMMIT_TIMESTAMP, at_start.otherwise(F.col(COMMIT_TIMESTAMP)))

    def _arrivals(self, versions: dict[str, int]) -> DataFrame | None:
        """Every row of the stream sources up to `versions`, in the micro-batches' shape (None: the
        job has no stream source)."""
        if not self.plan.streams:
            return None
        return reduce(
            DataFrame.unionByName,
            [
                self.positions.read_all(s, versions[s.name]).select(
                    *self._payloads(s.index),
                    F.col(V).alias(COMMIT_VERSION),
                    F.timestamp_micros(F.col(TS)).alias(COMMIT_TIMESTAMP),
                )
                for s in self.plan.streams
            ],
        )

    # ---------------------------------------------------------------- one micro-batch

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        """One micro-batch (foreachBatch). An error of streamjoin's raised here, or a storage fault
        as one, is kept for `run` to raise as it is: Spark hands it back wrapped in pages of its own."""
        try:
            with delta_io.translated_storage_faults(self._locations()):
                self._process_batch(batch, batch_id)
        except errors.StreamJoinError as error:
            self._failure = error
            raise

    def _process_batch(self, batch: DataFrame, batch_id: int) -> None:
        previous = self._progress()
        if previous is not None and previous.batch >= batch_id:
            return  # this batch completed before a restart; Spark is only re-committing it
        if self.plan.streams:
            index.refuse_rewrites_after(self.spark, self.plan, self.positions.versions)
        with counted_pass(self.spark):
            self._pipeline(batch, _Step(batch_id, previous))

    def _locations(self) -> list[str]:
        """The tables this runner reads and writes (a storage fault's message names the one it hit;
        a fault in the checkpoint is named by its file)."""
        return [*(s.location for s in self.spec.sources), self.spec.output.location]

    def _pipeline(self, batch: DataFrame | None, step: _Step) -> None:
        """One micro-batch, or the catch-up or seed step, as every job runs it: prepare (the rows that
        arrived, the state the previous batch left, the table sources: `_prepare`), step (`decide`:
        the kernel over the rows the batch settles) and commit (`_commit`). `batch`: the stream
        sources' rows in the micro-batches' shape (None: a job without stream sources)."""
        try:
            prepared = self._prepare(batch, step)
            step.watch.lap("read")
            decision = self._decide(prepared, step)
            step.cached += decision.cached
            step.watch.lap("join")
            self._commit(decision, step)
        finally:
            step.release()

    def _prepare(self, batch: DataFrame | None, step: _Step) -> Batch:
        """The batch's new rows tagged per stream source, the state the previous batch left, and
        their commits; the arrival index extended to the commits the batch holds whole."""
        if batch is not None:
            batch = batch.persist()
            step.cached.append(batch)
        new = {s.name: self._tagged(batch, s) for s in self.plan.streams if batch is not None}
        stored = self._state(step.previous) if self.parts else None
        state = (
            None
            if stored is None
            else {name: self._unpack(stored, index) for name, (index, _) in self.parts.items()}
        )
        commits = batch_commits(new, state)
        self._index_upto(
            {
                s.name: {c.position.version: c for c in commits if c.position.source == s.index and c.rows}
                for s in self.plan.streams
            }
        )
        return Batch(new, commits, state, step.previous)

    def _tagged(self, batch: DataFrame, source: BoundSource) -> DataFrame:
        """A stream source's rows of the batch, prepared (`arrival.prepare`)."""
        rows = batch.where(F.col(_IDX) == source.index).select(
            f"_sj_s{source.index}.*", COMMIT_VERSION, COMMIT_TIMESTAMP
        )
        return arrival.prepare(
            self._at_start(rows, source.name),
            source.index,
            source.raw_time(),
            source.event_time(),
            source.keys,
            source.max_future(),
            source.commit_time,
        )

    def _decide(self, prepared: Batch, step: _Step) -> Decision:
        """`decide` over what arrived, with the arrival index's commit sizes and this runner's tables."""
        names = {s.index: s.name for s in self.plan.streams}
        return decide(
            self.spark,
            self.plan,
            prepared,
            lambda source, version: self._commit_rows(names[source], version),
            lambda newest, counts, rejected, held: self._tables(
                step.previous, newest, counts, rejected, held, step.table_versions
            ),
            self.positions.history_end,
        )

    def _commit(self, decision: Decision, step: _Step) -> None:
        """Carry the batch's decision out: its writes, each exactly once with the batch (none for a
        seed), the next state, its metrics row, then the progress record that completes it."""
        written = self._write_step(decision, step) if step.outputs else {}
        left_over = self._write_state(decision, step.batch_id)
        step.watch.lap("write")
        metrics = self._account(decision, step, written, left_over)
        late = any(c.late for c in decision.result.counts.values())  # explained from the index, below
        if not written.get("rows") or late or len(self._unindexed) >= INDEX_EVERY:
            self._append_index()
        if step.outputs:
            if self.plan.streams:  # the clock late rows missed is the stream sources' event time
                explain_late(self.spark, self.spec.output.side("index"), [metrics], decision.result.late)
            self._write(
                to_frame(self.spark, metrics), self.spec.output.side("metrics"), step.batch_id, "metrics"
            )
        self._save_progress(self._progress_of(decision, step.batch_id, metrics, left_over))
        if step.outputs:
            self._finished(metrics)

    def _progress_of(
        self, decision: Decision, batch_id: int, metrics: RunMetrics, left_over: dict[str, tuple[int, int]]
    ) -> Progress:
        """The record the batch leaves: its clocks, the rows it carries over, the table versions it
        read and the operator's marks."""
        carried = {name: metrics.sources[name].open + metrics.sources[name].unsettled for name in left_over}
        settling, tables = decision.settling, decision.tables
        return Progress(
            batch_id,
            decision.result.max_event,
            settling.newest,
            carried,
            settling.partial,
            {self.plan.source(name).index: t.version for name, t in tables.items()},
            decision.result.marks,
            tuple(self._unindexed),
        )

    def _write_step(self, decision: Decision, step: _Step) -> dict[str, int]:
        """A batch's writes, each exactly once with the batch: the tables the step appends to
        (first: a batch run again reads them back), its output (its pass first: the step's counts
        are observed in it; a keyed result's changes to <output>_changes, then the output updated
        as the step asks), its late rows and its rejected rows (when it counted any). Returns what
        the output pass wrote (`accounting.Part.written`)."""
        out, batch_id = self.spec.output, step.batch_id
        result, counts, rejected = decision.result, decision.counts, decision.rejected
        kernel.append_writes(result, lambda rows, at: self._write(rows, at, batch_id, _role(out, at)))
        keyed = self.join.keyed_output(self.plan)
        if keyed is None:
            # One pass: the rows counted as they are written. A tagged append of no rows records no
            # commit (Delta skips an empty commit), so a batch without output rows adds none.
            counted = SliceCounts(result.output, 1, rows=(F.lit(0), F.lit(True)))
            self._write(counted.rows, out.location, batch_id, "output", out.partition_by, announce=False)
            written = counted.get()[0]
            if written["rows"]:
                hooks.wrote("output", batch_id)
        else:
            output = result.output.persist()
            step.cached.append(output)
            ops = keyed.count(output)
            written = {"rows": sum(ops.values()), "upserts": ops["upsert"], "deletes": ops["delete"]}
            if written["rows"]:
                self._write(output, out.side("changes"), batch_id, "changes")
                if kernel.update_output(result, out):
                    hooks.wrote("output", batch_id)
        if any(c.late for c in result.counts.values()):
            self._write(result.late, out.side("late"), batch_id, "late")
        if any(c.rejected for c in counts.values()):
            self._write(reduce(DataFrame.unionByName, rejected), out.side("rejected"), batch_id, "rejected")
        return written

    def _write_state(self, decision: Decision, batch_id: int) -> dict[str, tuple[int, int]]:
        """The next state, packed into one parquet folder for the batch; per stream source its open
        rows and its rows still waiting, counted as they are written. A job that
        keeps no rows (table sources only) writes none."""
        if not self.parts:
            return {}
        parts = [
            decision.next_state[name].select(*self._payloads(index), *self._state_meta())
            for name, (index, _) in self.parts.items()
        ]
        still_open = ~F.col(PENDING) & self.join.open_in_state()
        kinds: dict[str, Any] = {  # per stream source: its open rows, its rows still waiting
            f"{what}_{s.index}": (F.lit(0), (F.col(_IDX) == s.index) & condition)
            for s in self.plan.streams
            for what, condition in (("open", still_open), ("unsettled", F.col(PENDING)))
        }
        left = SliceCounts(reduce(DataFrame.unionByName, parts), 1, **kinds)  # counted as written
        left.rows.write.mode("overwrite").parquet(self._state_path(batch_id))
        hooks.wrote("state", batch_id)
        counted = left.get()[0]
        return {
            s.name: (counted[f"open_{s.index}"], counted[f"unsettled_{s.index}"]) for s in self.plan.streams
        }

    def _account(
        self, decision: Decision, step: _Step, written: dict[str, int], left_over: dict[str, tuple[int, int]]
    ) -> RunMetrics:
        """The batch's metrics row (`accounting.account`)."""
        newest, frontier = decision.settling.newest, decision.settling.frontier
        versions = {s.name: _newest_version(newest, s.index) for s in self.plan.streams}
        versions |= {name: t.version for name, t in decision.tables.items()}
        said = None if frontier is None else str(tuple(frontier))  # as 0.1.0 wrote it
        part = accounting.Part(read=decision.counts, written=written, left=left_over)
        (metrics,) = accounting.account(self._ran(step, versions, said), decision.result, [part])
        return metrics

    def _ran(self, step: _Step, versions: dict[str, int], frontier: str | None) -> accounting.Run:
        """What this runner knows of one micro-batch beside its step's result (`accounting.account`)."""
        return accounting.Run(
            job=self.spec.name,
            runner="live",
            mode="exact",
            run_id=self.app_id,
            started_at=step.started_at,
            versions=versions,
            frontier=frontier,
            duration_s=round(time.monotonic() - step.began, 3),
            phases=step.watch.shares(),
            batch=step.batch_id,
        )

    def _tables(
        self,
        previous: Progress | None,
        newest: dict[int, arrival.Position],
        counts: dict[str, SourceCounts],
        rejected_parts: list[DataFrame],
        cached: list[DataFrame],
        versions: dict[str, int] | None = None,
    ) -> dict[str, TableInput]:
        """Each table source as of its newest version now (or the version given); this batch counts the
        changes committed since the version the previous batch read (their rejected rows go to the side table)."""
        tables = {}
        stream_clock = max((p.time for p in newest.values()), default=None)
        for source in self.plan.tables:
            version = (versions or {}).get(source.name)
            if version is None:
                version = delta_io.latest_version(self.spark, source.spec.location)
            first = self.positions.starts[source.name]
            changes = changelog.read(
                self.spark,
                source,
                version,
                first.version,
                from_micros(first.commit_ts),
                journal.location(self.plan),
            ).persist()
            cached.append(changes)
            seen = previous.tables.get(source.index, -1) if previous else -1
            tables[source.name] = table_input(
                source.name, changes, version, seen, stream_clock, counts, rejected_parts
            )
        return tables

    # ---------------------------------------------------------------- state

    def _write(
        self,
        df: DataFrame,
        location: str,
        batch_id: int,
        table: str,
        partition_by: tuple[str, ...] = (),
        announce: bool = True,
    ) -> None:
        """Append `df` to `location` exactly once with the batch (`delta_io.write_once`); `table`: its
        role, told to the write hook (`hooks`) unless not `announce` (the caller tells it)."""
        # Delta skips a transaction whose version is not above the last one of its app id (-1 before
        # any), so the catch-up step (batch -1) writes under an app id of its own, as version 0.
        app, version = (f"{self.app_id}-start", 0) if batch_id == SEED_BATCH else (self.app_id, batch_id)
        # The metrics log gains columns between releases (by_link, by_phase), so may a table an
        # operator appends to (`Write.APPEND`); the output and its side tables keep their schema.
        delta_io.write_once(
            df,
            location,
            app,
            version,
            after=self._written_after(batch_id, location),
            partition_by=partition_by,
            merge_schema=table not in ("output", "changes", "late", "rejected"),
        )
        if announce:
            hooks.wrote(table, batch_id)

    def _written_after(self, batch_id: int, location: str) -> int | None:
        """The newest version of `location` before this batch's first attempt wrote it: kept in the
        checkpoint (`writes.json`, before the write), so that a batch run again searches only the
        commits since for its own write (`delta_io.write_once`). None for a table outside a local
        folder, and for a checkpoint begun by a release before tagged writes, whose batches were
        kept by Delta's transaction ids and go on so."""
        if not self.tagged_writes:
            return None
        record = self._write_record()
        if record.get("batch") != batch_id:
            record = {"batch": batch_id, "after": {}}
        if location not in record["after"]:
            newest = delta_io.newest_logged(location)
            if newest is None:
                return None
            record["after"][location] = newest
            atomic.replace_file(atomic.under(self.home, "writes.json"), json.dumps(record))
        return record["after"][location]

    def _write_record(self) -> dict:
        """The versions of the tables the current batch writes, as they were before its first attempt."""
        path = atomic.under(self.home, "writes.json")
        return self._load(path, "write record") if atomic.exists(path) else {}

    def _index_upto(self, held: dict[str, dict[int, arrival.CommitStats]]) -> None:
        """Extend the arrival index to the newest commits this batch holds (if it is behind), from
        the batch's own stats of the commits it holds whole (`held`: per stream source, by version);
        the new entries are kept, to be appended with others (`_append_index`)."""
        versions = {name: max(commits, default=-1) for name, commits in held.items()}
        if not any(v > self.positions.versions.get(name, -1) for name, v in versions.items()):
            return
        with index.deferred() as made:
            self.positions = index.update(
                self.spark,
                self.plan,
                {
                    **self.positions.versions,
                    **{name: max(v, self.positions.versions.get(name, -1)) for name, v in versions.items()},
                },
                known=self.positions,
                held=held,
            )
        self._unindexed += made

    def _commit_rows(self, source: str, version: int) -> int:
        """How many rows a stream source's commit inserted, from the entries kept or the index."""
        kept = [e.rows for e in self._unindexed if (e.source, e.version) == (source, version)]
        return kept[-1] if kept else self.positions.rows(source, version)

    def _append_index(self, record: Progress | None = None) -> None:
        """Append the index entries kept since the last append in one commit (a micro-batch keeps
        the entries of its commits, `index.deferred`: it then commits its output and its metrics
        row only). `record`: the newest progress record, rewritten without them."""
        if not self._unindexed:
            return
        index.append_entries(self.spark, self.plan, self._unindexed)
        self._unindexed = []
        if record is not None and record.unindexed:
            self._save_progress(replace(record, unindexed=()))

    def _payloads(self, index: int) -> list:
        """The source index and a struct column per source, filled only for `index`: one schema
        that the union of all sources (in the stream and in the state) can share."""
        columns = [F.lit(index).alias(_IDX)]
        for other, schema in self.parts.values():
            payload = (
                F.struct(*[F.col(f"`{c}`") for c in schema.fieldNames()])
                if other == index
                else F.lit(None).cast(schema)
            )
            columns.append(payload.alias(f"_sj_s{other}"))
        return columns

    def _state_path(self, batch_id: int) -> str:
        return f"{self.home}/state/{batch_id}"

    def _progress(self) -> Progress | None:
        """The newest completed batch's record (state is only trusted once its record exists)."""
        batches = _numbered(atomic.names(atomic.under(self.home, "progress")), ".json")
        if not batches:
            return None
        newest = atomic.under(self.home, "progress", f"{batches[-1]}.json")
        try:
            return Progress.from_json(atomic.read_text(newest))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self._unreadable(newest, "progress record", f"not a progress record: {exc!r}") from None

    def _save_progress(self, progress: Progress) -> None:
        """Write the batch's record atomically (rename), then drop state older than the previous batch."""
        folder = atomic.under(self.home, "progress")
        atomic.replace_file(atomic.under(folder, f"{progress.batch}.json"), progress.to_json())
        states = atomic.under(self.home, "state")
        for old in _numbered(atomic.names(states)):
            if old < progress.batch - 1:
                atomic.remove(atomic.under(states, str(old)), recursive=True)
        for old in _numbered(atomic.names(folder), ".json"):
            if old < progress.batch - 1:
                atomic.remove(atomic.under(folder, f"{old}.json"))

    def _state(self, previous: Progress | None) -> DataFrame | None:
        if previous is None:
            return None
        # An explicit schema: a batch that closed every window leaves an empty folder behind.
        return self.spark.read.schema(self._state_schema()).parquet(self._state_path(previous.batch))

    def _unpack(self, state: DataFrame, index: int) -> DataFrame:
        """One source's rows of the packed state, in `decide`'s flat form."""
        return state.where(F.col(_IDX) == index).select(f"_sj_s{index}.*", *self._state_meta())

    def _state_meta(self) -> tuple[str, ...]:
        """The columns of a state row beside the source's own: arrival, the operator's, PENDING."""
        return (*_ARRIVAL, *[f.name for f in self.join.state_fields()], PENDING)

    def _state_schema(self) -> StructType:
        fields = [StructField(_IDX, IntegerType())]
        fields += [StructField(f"_sj_s{index}", schema) for index, schema in self.parts.values()]
        fields += [
            StructField(arrival.T, LongType()),
            StructField(TS, LongType()),
            StructField(SRC, IntegerType()),
            StructField(V, LongType()),
            *self.join.state_fields(),
            StructField(PENDING, BooleanType()),
        ]
        return StructType(fields)

    def _save_marker(self, **fields) -> None:
        """Add `fields` to the checkpoint's marker (the starting versions of its streaming query)."""
        self._adopt({**self.marker, **fields})
        atomic.replace_file(atomic.under(self.checkpoint, MARKER), json.dumps(self.marker))

    def _adopt(self, marker: dict) -> None:
        """Take `marker` as this checkpoint's (see `_marker`)."""
        self.marker = marker
        self.app_id: str = marker["app_id"]
        self.tagged_writes: bool = marker.get("tagged_writes", False)
        self.starting_versions: dict[str, int] = marker.get("starting_versions", {})

    def _marker(self) -> dict | None:
        """The checkpoint's identity as stored (None: a new checkpoint): its job, a stable id (Delta's
        idempotent-write key for every table this query writes), whether it owns the output and,
        once it has started, the versions its sources' streams start from."""
        path = atomic.under(self.checkpoint, MARKER)
        if not atomic.exists(path):
            return None
        stored = self._load(path, "marker")
        if not isinstance(stored.get("app_id"), str):
            raise self._unreadable(path, "marker", "it names no app_id")
        if stored.get("job") != self.spec.name:
            raise JobError(
                f"checkpoint {self.checkpoint!r} belongs to job {stored.get('job')!r}; give job {self.spec.name!r} its own checkpoint"
            )
        return stored

    def _load(self, path: atomic.Location, what: str) -> dict:
        """A JSON object the checkpoint keeps in `path` (its `what`); refused with what to do when unreadable."""
        try:
            body = json.loads(atomic.read_text(path))
        except (OSError, ValueError) as exc:
            raise self._unreadable(
                path, what, f"not JSON: {exc}" if isinstance(exc, ValueError) else str(exc)
            ) from None
        if not isinstance(body, dict):
            raise self._unreadable(path, what, "it holds no JSON object")
        return body

    def _unreadable(self, path: atomic.Location, what: str, why: str) -> CheckpointError:
        """The error for a file of this checkpoint that cannot be read, saying what to do about it."""
        try:
            empty = not atomic.read_text(path)
        except (OSError, UnicodeDecodeError):
            empty = False
        if not self.started():
            todo = (
                f"It has not committed a micro-batch yet: delete the folder {self.checkpoint} and run again"
            )
        else:
            todo = (
                f"Restore the file from a copy of the checkpoint; without it the checkpoint cannot go on. "
                f"{_CONTINUE_ELSEWHERE}, or start over: `streamjoin reset <job file> --yes --checkpoint "
                f"{self.checkpoint}`"
            )
        return CheckpointError(
            f"checkpoint {self.checkpoint}: its {what} {path} is unreadable ({'empty' if empty else why}): "
            f"cut short while it was written (a full disk, a crash) or damaged since. {todo}"
        )


def _numbered(names: list[str], suffix: str = "") -> list[int]:
    """The numbers of the entries named `<number><suffix>` among `names`, in order (batches; a
    seeded checkpoint's first is -1)."""
    numbers = [name.removesuffix(suffix) for name in names if name.endswith(suffix)]
    return sorted(int(n) for n in numbers if n.removeprefix("-").isdigit())


def batch_commits(
    new: dict[str, DataFrame], state: dict[str, DataFrame] | None = None
) -> list[arrival.CommitStats]:
    """The commits of a micro-batch's rows (position order), in one aggregate: the rows it brings
    (prepared, per stream source) and the rows earlier batches left waiting (PENDING in `state`).
    `rows` and `rejected` count the new rows only (0 for a commit only waiting rows hold);
    `max_event` is the largest event time among all the commit's accepted rows, new or waiting."""
    columns = (arrival.T, TS, SRC, V, arrival.REJECT)
    parts = [r.select(*columns, F.lit(True).alias("_sj_new")) for r in new.values()]
    for rows in (state or {}).values():
        waiting = rows.where(F.col(PENDING)).withColumn(arrival.REJECT, F.lit(None).cast("string"))
        parts.append(waiting.select(*columns, F.lit(False).alias("_sj_new")))
    if not parts:  # a job without stream sources
        return []
    return arrival.commit_stats(reduce(DataFrame.unionByName, parts), counted=F.col("_sj_new"))


def table_input(
    name: str,
    changes: DataFrame,
    version: int,
    seen: int,
    stream_clock: int | None,
    counts: dict[str, SourceCounts],
    rejected_parts: list[DataFrame],
) -> TableInput:
    """Table source `name` as of `version` (its tagged `changes`) for a batch that counts the
    changes committed after version `seen`, the one the previous batch read: their rows go to
    `counts`, their rejected rows to `rejected_parts`."""
    commits = arrival.commit_stats(changes)
    fresh = [c for c in commits if c.position.version > seen]
    counts[name] = SourceCounts(rows_in=sum(c.rows for c in fresh), rejected=sum(c.rejected for c in fresh))
    counted = F.col(V) > F.lit(seen)
    rejected_parts.append(
        kernel.rejected_side_rows(name, changes.where(counted & F.col(arrival.REJECT).isNotNull()))
    )
    return TableInput(changes, commits, version, F.when(counted, F.lit(0)), stream_clock)


@dataclass
class Decision:
    """What one micro-batch decides, before anything is written (see `decide`)."""

    result: kernel.StepResult
    settling: Settling
    counts: dict[str, SourceCounts]  # rows_in, rejected, carried_in; the rest is the kernel's and the state's
    rejected: list[DataFrame]  # side rows of the rejected rows, per source
    # Per stream source: open rows and rows still waiting (PENDING); and the operator's derived rows.
    next_state: dict[str, DataFrame]
    tables: dict[str, TableInput]
    cached: list[DataFrame]  # persisted here; unpersist after writing


TablesFor = Callable[
    [dict[int, arrival.Position], dict[str, SourceCounts], list[DataFrame], list[DataFrame]],
    dict[str, TableInput],
]


@dataclass(frozen=True)
class Batch:
    """One micro-batch's inputs as `decide` takes them: the new rows (prepared, per stream
    source), the state the previous batch left (per source: open rows and rows waiting for the
    frontier, flagged PENDING; None before the first batch), `batch_commits(new, state)`, and the
    previous batch's progress."""

    new: dict[str, DataFrame]
    commits: list[arrival.CommitStats]
    state: dict[str, DataFrame] | None = None
    previous: Progress | None = None


def decide(
    spark: SparkSession,
    plan: Plan,
    batch: Batch,
    rows_of: Callable[[int, int], int],
    tables_for: TablesFor | None = None,
    history_end: arrival.Position | None = None,
) -> Decision:
    """One micro-batch, as a function of its inputs (`Batch`; a job without stream sources has
    neither rows nor commits in it, only its tables).

    Moves the clocks (`settle`), settles the waiting and new rows at or before the frontier, takes
    their watermarks from this batch's Timeline, and runs the kernel with the open state; the rows
    after the frontier wait in the next state. `tables_for(newest, counts, rejected, cached)` gives
    the table sources (enrichment joins). `history_end`: the last position of the job's history
    (`index.Index.history_end`), which settles and is judged as one group."""
    previous = batch.previous
    settling = settle([c for c in batch.commits if c.rows], len(plan.streams), previous, rows_of, history_end)
    split = _split(plan, batch, settling)
    frontier = settling.frontier
    settled_commits = [
        c
        for c in batch.commits
        if c.max_event is not None and frontier is not None and c.position <= frontier
    ]
    tables = tables_for(settling.newest, split.counts, split.rejected, split.cached) if tables_for else {}
    timeline = arrival.timeline(settled_commits, previous.max_event if previous else None, history_end)
    result = kernel.step(
        spark,
        plan,
        kernel.StepInput(
            {**split.settled, **tables},
            timeline,
            "exact",
            state=split.open_state if batch.state is not None else None,
            keep_state=True,
            marks=previous.marks if previous else {},
        ),
    )
    next_state = _next_state(plan, result, split.waiting)
    return Decision(
        result, settling, split.counts, split.rejected, next_state, tables, split.cached + result.cached
    )


@dataclass
class _Split:
    """A batch's rows by what becomes of them in `decide`, and what it counted and cached."""

    settled: dict[str, DataFrame] = field(default_factory=dict)  # per stream source, for the step
    waiting: dict[str, DataFrame] = field(default_factory=dict)  # per stream source, after the frontier
    open_state: dict[str, DataFrame] = field(default_factory=dict)  # the previous batch's open rows
    counts: dict[str, SourceCounts] = field(default_factory=dict)
    rejected: list[DataFrame] = field(default_factory=list)
    cached: list[DataFrame] = field(default_factory=list)


def _split(plan: Plan, batch: Batch, settling: Settling) -> _Split:
    """Each stream source's new and waiting rows, settled or still waiting at the frontier; its
    rejected rows; the open state; the rows and rejected rows of its complete commits, counted."""
    settled_test = arrival.at_or_before(settling.frontier) if settling.frontier else F.lit(False)
    operator, split, state, previous = kernel.family(plan), _Split(), batch.state, batch.previous
    private = [f.name for f in operator.state_fields()]
    complete = [c for c in batch.commits if c.rows]
    for source in plan.streams:
        name = source.name
        accepted, rejected = kernel.split_rejected(batch.new[name])
        split.rejected.append(kernel.rejected_side_rows(name, rejected))
        pending = accepted.drop(arrival.REJECT)
        if state is not None:
            pending = state[name].where(F.col(PENDING)).drop(PENDING, *private).unionByName(pending)
            split.open_state[name] = state[name].where(~F.col(PENDING)).drop(PENDING)
        pending = pending.persist()
        split.cached.append(pending)
        split.settled[name] = pending.where(settled_test)
        split.waiting[name] = pending.where(~settled_test)
        own_commits = [c for c in complete if c.position.source == source.index]
        split.counts[name] = SourceCounts(
            rows_in=sum(c.rows for c in own_commits),
            rejected=sum(c.rejected for c in own_commits),
            carried_in=previous.carried.get(name, 0) if previous else 0,
        )
    for name in operator.derived_state(plan):
        if state is not None:
            split.open_state[name] = state[name].drop(PENDING)
    return split


def _next_state(plan: Plan, result: kernel.StepResult, waiting: dict[str, DataFrame]) -> dict[str, DataFrame]:
    """What the next batch starts from: per stream source its open rows and its rows still
    waiting (PENDING); the operator's derived rows (none for a job without stream sources)."""
    operator = kernel.family(plan)
    if not waiting and not operator.derived_state(plan):
        return {}
    assert result.state is not None  # a stream join's step keeps its open rows when asked to (keep_state)
    return {
        name: result.state[name]
        .withColumn(PENDING, F.lit(False))
        .unionByName(_as_state(waiting[name], operator.state_fields()).withColumn(PENDING, F.lit(True)))
        for name in waiting
    } | {name: result.state[name].withColumn(PENDING, F.lit(False)) for name in operator.derived_state(plan)}


@dataclass
class _Step:
    """One micro-batch being processed, or the catch-up or seed step (batch -1): the previous
    batch's progress, whether it writes outputs (a seed does not), the table versions it reads
    (None: each table's newest), its clock, and the frames it cached (`release` frees them)."""

    batch_id: int
    previous: Progress | None
    outputs: bool = True
    table_versions: dict[str, int] | None = None
    began: float = field(default_factory=time.monotonic)
    started_at: datetime = field(default_factory=lambda: pendulum.now("UTC"))
    watch: Stopwatch = field(default_factory=Stopwatch)
    cached: list[DataFrame] = field(default_factory=list)

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


@dataclass(frozen=True)
class Settling:
    """Where one micro-batch leaves the sources' clocks (see `settle`)."""

    newest: dict[int, arrival.Position]  # each stream source's newest complete commit so far
    partial: dict[int, tuple[arrival.Position, int]]  # source -> (its cut commit, rows of it seen so far)
    frontier: arrival.Position | None  # rows at or before it are settled


def settle(
    commits: list[arrival.CommitStats],
    sources: int,
    previous: Progress | None,
    rows_of: Callable[[int, int], int],
    history_end: arrival.Position | None = None,
) -> Settling:
    """Move the sources' clocks by one micro-batch holding `commits` (position order).

    maxFilesPerTrigger may cut a commit into several micro-batches: a source's newest commit in the
    batch counts only once all its rows (`rows_of(source, version)`, from the arrival index) have
    come, adding the rows earlier batches brought (`previous.partial`); until then its rows wait.
    The frontier is the oldest of the sources' newest complete commits (arrival.frontier).
    """
    partial = dict(previous.partial) if previous else {}
    complete: list[arrival.CommitStats] = []
    for source in sorted({c.position.source for c in commits}):
        mine = [c for c in commits if c.position.source == source]
        last = mine[-1]
        seen, so_far = partial.pop(source, (None, 0))
        got = last.rows + (so_far if seen == last.position else 0)
        if got < rows_of(source, last.position.version):
            partial[source] = (last.position, got)
            mine = mine[:-1]
        complete += mine
    newest = arrival.newest_positions(complete, previous.newest if previous else None)
    return Settling(newest, partial, arrival.frontier(newest, sources, history_end))


def _role(out: Output, location: str) -> str:
    """How the live runner names a table an operator appends to (`hooks`): its side-table suffix
    (`<output>_lookups`: "lookups"), else its location."""
    return location.removeprefix(f"{out.location}_")


def _newest_version(newest: dict[int, arrival.Position], index: int) -> int:
    return newest[index].version if index in newest else -1


def _micro_batch_session(spark: SparkSession) -> SparkSession:
    """A session of its own for the runner: `spark`'s settings, without adaptive query execution,
    as Spark runs its own streaming queries. A micro-batch is small: adaptive execution would make
    each of its shuffles a Spark job of its own and re-plan the rest, which costs more than it
    saves there."""
    session = spark.newSession()
    for key, value in spark.conf.getAll.items():
        if spark.conf.isModifiable(key):
            session.conf.set(key, value)
    session.conf.set("spark.sql.adaptive.enabled", "false")
    return session


def _trigger(text: str) -> dict:
    """`available-now` or `processing-time:<duration>` as DataStreamWriter.trigger keywords."""
    if text == "available-now":
        return {"availableNow": True}
    if text.startswith("processing-time"):
        interval = text.partition(":")[2] or "10s"
        seconds = parse_duration(interval, "processing-time trigger").total_seconds()
        return {"processingTime": f"{seconds} seconds"}
    raise JobError(f"trigger {text!r} is unknown; use 'available-now' or 'processing-time:30s'")


_ARRIVAL = (arrival.T, TS, SRC, V)


def _as_state(rows: DataFrame, fields: tuple[StructField, ...]) -> DataFrame:
    """Rows waiting for the frontier in the shape of the operator's state (its columns NULL)."""
    for f in fields:
        rows = rows.withColumn(f.name, F.lit(None).cast(f.dataType))
    return rows
