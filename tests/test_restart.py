"""Contract 5, live side: a live runner killed with SIGKILL (with its JVM) and restarted from its
checkpoint, again and again while its input grows, ends with the output, side tables and metrics
of one that never stopped and of an exact replay, with no duplicate and nothing missing.

The join is the fixed example's (tests/harness.py); the input is drawn at random (seeded).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml
from conftest import SHORT_LIVED_JVM, TESTS_SET_JAVA_OPTIONS
from harness import (
    EVERYTHING,
    FIXED_GRACE,
    FIXED_HI,
    FIXED_HOW,
    FIXED_LO,
    SIDES,
    WRITES,
    create_tables,
    events,
    job,
    live_metrics,
    read_output,
    read_side,
    with_output,
    write_commit,
)
from reference import reference
from test_equivalence import check_live_metrics

from streamjoin.jobfile import load_job
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay

HOW, LO, HI, GRACE = FIXED_HOW, FIXED_LO, FIXED_HI, FIXED_GRACE


class Tables:
    """Fresh source tables for one scenario, written commit by commit."""

    def __init__(self, spark, root):
        self.spark, self.root = spark, root
        self.paths = create_tables(spark, root)
        self.spec = job(root, self.paths, HOW, LO, HI, GRACE)
        self.versions, self.written = {0: 0, 1: 0}, []

    def write(self, commits):
        for side, rows, files in commits:
            write_commit(self.spark, self.paths[side], rows, files)
            self.versions[side] += 1
            self.written.append((side, self.versions[side], rows))

    def live(self, name="out") -> None:
        spec = with_output(self.spec, f"{self.root}/{name}")
        LiveRunner(self.spark, spec, f"{self.root}/{name}_checkpoint").run()

    def check_against(self, uninterrupted: Uninterrupted, name="out") -> None:
        """`name`'s live output and side tables equal those of a run that never stopped, and its
        metrics chain and add up to the reference's accounting."""
        spark, root = self.spark, self.root
        output = read_output(spark, f"{root}/{name}")
        assert output == uninterrupted.output, "restarted live output differs (duplicates or missing rows)"
        for side in ("late", "rejected"):
            assert read_side(spark, f"{root}/{name}_{side}") == uninterrupted.sides[side], side
        check_live_metrics(
            live_metrics(spark, with_output(self.spec, f"{root}/{name}")), uninterrupted.counts
        )


@dataclass(frozen=True)
class Uninterrupted:
    """What a run that never stopped writes (its output, late and rejected rows), and the
    reference's view of the same input."""

    output: Counter
    expected: Counter
    counts: dict[int, dict[str, int]]
    sides: dict[str, Counter]


def replayed(tables: Tables) -> Uninterrupted:
    """The exact replay of everything `tables` holds: what one live run that never stopped writes,
    row for row (contract 2), with the reference's view of the same commits."""
    spark, root = tables.spark, tables.root
    target = with_output(tables.spec, f"{root}/replay")
    replay(spark, target, *EVERYTHING, options=RunOptions(mode="exact"))
    expected, counts = reference(events(spark, tables.paths, tables.written), LO, HI, GRACE, HOW)
    return Uninterrupted(
        output=read_output(spark, target.output.location),
        expected=expected,
        counts=counts,
        sides={side: read_side(spark, target.output.side(side)) for side in ("late", "rejected")},
    )


# ---------------------------------------------------------------------------- SIGKILL

KILLS = 10  # issue 20, item 8: at least ten
CHILD = Path(__file__).with_name("live_child.py")


def growing_input(rng: random.Random, commits: int, clock: int, first: int) -> tuple[list, int]:
    """`commits` new commits (side, rows, files) after event time `clock`: keys a to c, a NULL key
    or a row far behind (late) now and then; returns them and the clock they reach."""
    written = []
    for n in range(commits):
        clock += rng.randint(1, 4)
        rows = []
        for j in range(rng.randint(1, 3)):
            key = None if rng.random() < 0.08 else rng.choice("abc")
            behind = 30 if rng.random() < 0.1 else rng.randint(0, 2)
            rows.append((f"g{first + n}_{j}", key, clock - behind, 0))
        written.append((rng.randint(0, 1), rows, None))
    return written, clock


def every_write(clock: int, first: int) -> tuple[list, int]:
    """Three commits after `clock` that make the batch holding them write every table: a row 10 s
    ahead (r), then a NULL key and a row 60 s behind it (l; late: the r row, settled before it,
    lifted the watermark), then a row on r again, which settles l's commit; and the clock 10 s
    ahead closes the earlier rows' windows, so some come out."""
    clock += 10
    commits = [
        (1, [(f"g{first}_0", "a", clock, 0)], None),
        (0, [(f"g{first}_1", None, clock, 0), (f"g{first}_2", "b", clock - 60, 0)], None),
        (1, [(f"g{first}_3", "c", clock, 0)], None),
    ]
    return commits, clock


class Children:
    """tests/live_child.py processes, each started one ahead of its use: its interpreter and JVM
    start while the test writes input and the child before it runs, then it waits for its
    arguments on stdin. Each runs in a process group of its own (it and its JVM die together). A
    JVM killed with SIGKILL runs no shutdown hook, so whatever it put in its temporary folders
    stays: Spark's scratch folders (with a 15 MB copy of the Delta jars) and the native libraries
    it unpacks. The children keep them beside the job, in pytest's temporary folder, rather than
    in /tmp."""

    def __init__(self, folder: Path):
        self.scratch = folder / "child_tmp"
        self.scratch.mkdir(exist_ok=True)
        self.ahead: subprocess.Popen | None = self._spawn()

    def _spawn(self) -> subprocess.Popen:
        options = f"{os.environ.get('STREAMJOIN_JAVA_OPTIONS', '')} -Djava.io.tmpdir={self.scratch}"
        return subprocess.Popen(
            [sys.executable, str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env={
                **os.environ,
                "SPARK_LOCAL_DIRS": str(self.scratch),
                "STREAMJOIN_JAVA_OPTIONS": options.strip(),
            },
        )

    def start(
        self, job_file: Path, checkpoint: str, trigger: str, die_after=None, last=False
    ) -> subprocess.Popen:
        """The child started ahead, told its job; another starts ahead unless this is the `last`."""
        child, self.ahead = self.ahead, None if last else self._spawn()
        assert child is not None and child.stdin is not None
        arguments = {
            "job": str(job_file),
            "checkpoint": checkpoint,
            "trigger": trigger,
            "die_after": die_after,
        }
        child.stdin.write(json.dumps(arguments) + "\n")
        child.stdin.close()
        return child

    def close(self) -> None:
        if self.ahead is not None:
            kill_group(self.ahead)


def jvm_options(group: int) -> list[str]:
    """The command line of the JVM in process group `group` (a child's driver)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.getpgid(int(pid)) == group:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
                if command[0].endswith("/java"):
                    return command
    raise AssertionError(f"no JVM in process group {group}")


def kill_group(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait(60)


def kill_ten_times(
    rng: random.Random, tables: Tables, children: Children, job_file: Path, targets: list[str]
) -> list[tuple[str, int]]:
    """The ten kills of the SIGKILL test, input written before each (and, for the kills at random,
    while the child runs): where each came and the child's exit code."""
    checkpoint = f"{tables.root}/out_checkpoint"
    clock, first, kills = 0, 0, []
    for n in range(KILLS):
        commits, clock = growing_input(rng, rng.randint(2, 4), clock, first)
        first += len(commits)
        if n % 2 == 0:
            more, clock = every_write(clock, first)
            commits, first = commits + more, first + len(more)
        tables.write(commits)
        last = n == KILLS - 1
        if n % 2 == 0:
            table = targets[n // 2]
            child = children.start(job_file, checkpoint, "processing-time:1s", [table, 1], last)
            try:  # it kills itself after that write, or once caught up if its batches never make it
                child.wait(120)
            except subprocess.TimeoutExpired:
                kill_group(child)
            assert child.stdout is not None
            idle = "caught up" in child.stdout.read()
            kills.append((f"caught up, no {table} write" if idle else f"after {table}", child.returncode))
        else:
            child = children.start(job_file, checkpoint, "processing-time:1s", last=last)
            assert child.stdout is not None and child.stdout.readline().strip() == "running"
            if n == 1 and TESTS_SET_JAVA_OPTIONS:  # a JVM that lives for seconds compiles with C1 alone
                assert SHORT_LIVED_JVM in jvm_options(child.pid)
            more, clock = growing_input(rng, 2, clock, first)  # commits that land while it runs
            first += len(more)
            tables.write(more)
            time.sleep(rng.uniform(0, 5))  # into its first batches, or idle between them
            kill_group(child)
            kills.append(("at random", child.returncode))
    return kills


def test_a_runner_killed_with_sigkill_over_a_growing_input_ends_as_one_never_killed(spark, tmp_path):
    """Issue 20, item 8: a live runner in its own process, killed with SIGKILL (with its JVM) ten
    times while the input grows: half of the kills right after one of a micro-batch's five writes
    (each write once, in an order drawn at random; the input before each holds a late and a
    rejected row and closes windows, so that its batch makes every write), half after a random
    delay into its run. Restarted on the same checkpoint each time; at the end a runner in
    the test's own process takes over the dead one's lease and runs to completion, and a restart
    with nothing new runs no batch. Output, side tables and metrics equal those of one runner that
    was never killed and of the exact replay, and the reference's."""
    rng = random.Random(20)
    children = Children(tmp_path)  # the first starts while the tables are written
    tables = Tables(spark, tmp_path)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        yaml.safe_dump(
            {
                "name": "killed",
                "sources": {
                    name: {"path": tables.paths[side], "time": "t"} for side, name in enumerate(SIDES)
                },
                "from": "l",
                "joins": [
                    {
                        "join": "r",
                        "type": HOW,
                        "on": "l.k = r.k",
                        "between": [f"{LO}s", f"{HI}s"],
                        "grace": f"{GRACE}s",
                    }
                ],
                "select": ["l.id AS lid", "r.id AS rid"],
                "output": {"path": f"{tmp_path}/out"},
            }
        )
    )
    tables.spec = load_job(job_file)
    targets = list(WRITES)
    rng.shuffle(targets)  # the write each of the five kills after a write follows
    try:
        kills = kill_ten_times(rng, tables, children, job_file, targets)
    finally:
        children.close()
    assert [code for _, code in kills] == [-signal.SIGKILL] * KILLS, kills
    # Each of a batch's writes was followed by a kill: the rerun skips what the killed batch wrote.
    assert sorted(where for where, _ in kills[::2]) == sorted(f"after {table}" for table in WRITES), kills
    # To completion, on the same checkpoint, in this process: a restart like the others, without
    # the cold JVM of an eleventh child (about half a minute of CPU). Then once more, with nothing
    # new: a restart that runs no batch.
    tables.live("out")
    batches = len(live_metrics(spark, tables.spec))
    tables.live("out")
    assert len(live_metrics(spark, tables.spec)) == batches, "a restart with nothing new ran a batch"

    tables.live("never_killed")
    uninterrupted = replayed(tables)
    assert uninterrupted.output == uninterrupted.expected, "the exact replay differs from the reference"
    assert uninterrupted.sides["late"] and uninterrupted.sides["rejected"]
    tables.check_against(uninterrupted, "never_killed")
    tables.check_against(uninterrupted)
