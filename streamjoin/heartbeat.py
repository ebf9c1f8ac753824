"""A live run's heartbeat: while no micro-batch comes (no new data), a line every so often saying
since when it has been waiting and the newest commit of each source, so that a quiet run is seen
to be alive and what it waits for is plain."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from streamjoin import delta_io
from streamjoin.timeutil import format_duration, from_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamjoin.metrics import RunMetrics
    from streamjoin.runners.live import LiveRunner
    from streamjoin.spec import JoinSpec

EVERY = 60.0  # seconds without a micro-batch between two heartbeat lines (`--heartbeat` sets another)


class Heartbeat:
    """`tick` is called often while a live run waits and `beat` after each micro-batch (`attach`);
    `say` gets a line once `every` seconds have passed since the last micro-batch (or the start)
    or the last line."""

    def __init__(
        self,
        spark: SparkSession,
        spec: JoinSpec,
        say: Callable[[str], None],
        every: float = EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spark, self.spec, self.say, self.every, self.clock = spark, spec, say, every, clock
        self.beat()

    def attach(self, runner: LiveRunner) -> None:
        """Follow `runner`: its waits tick, each of its micro-batches beats (then goes on to the
        callback it had)."""
        told = runner.on_batch

        def batch(metrics: RunMetrics) -> None:
            self.beat()
            told(metrics)

        runner.on_batch, runner.on_wait = batch, self.tick

    def beat(self) -> None:
        """A micro-batch came: the wait starts again now."""
        self.waiting_since = datetime.now(UTC)
        self.last = self.clock()

    def tick(self) -> None:
        """Say the heartbeat line if `every` seconds have passed without a micro-batch or a line."""
        if self.clock() - self.last < self.every:
            return
        self.last = self.clock()
        self.say(self.line())

    def line(self) -> str:
        """`waiting for new data since <time> (<for how long>); newest commits: <source> version <v>
        at <commit time>, ...`."""
        waited = timedelta(seconds=round((datetime.now(UTC) - self.waiting_since).total_seconds()))
        commits = ", ".join(self._newest_commit(source.name, source.location) for source in self.spec.sources)
        return (
            f"job {self.spec.name}: waiting for new data since {self.waiting_since:%Y-%m-%dT%H:%M:%SZ} "
            f"({format_duration(waited)}); newest commits: {commits}"
        )

    def _newest_commit(self, name: str, location: str) -> str:
        """A source's newest commit: its version and commit time."""
        newest = delta_io.latest_version(self.spark, location)
        commit = delta_io.history(self.spark, location, since=newest, upto=newest)[-1]
        return f"{name} version {newest} at {from_spark(commit.timestamp):%Y-%m-%dT%H:%M:%SZ}"
