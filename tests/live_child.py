"""A live runner in a process of its own, for tests/test_restart.py's kill test.

    echo '{"job": FILE, "checkpoint": DIR, "trigger": ..., "die_after": [TABLE, N]}' | python tests/live_child.py

Starts its Spark session first and then reads its arguments, one line on stdin: the test starts
the next child while the one before runs, so that its JVM is up when its turn comes. Prints
`running` once its streaming query has started, then runs until its query ends (an available-now
trigger) or it is killed. With `die_after`, the process group (this interpreter and
its Spark JVM) kills itself with SIGKILL right after its N-th write of TABLE ("rejected", "late",
"output", "state" or "metrics"): a kill between two of a micro-batch's writes, at a point chosen
by the test rather than by timing. A child whose batches never make that write (no late row
came, say) kills itself the same way once its query has caught up, rather than idling until the
test gives up on it; it prints `caught up` first.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from streamjoin.jobfile import load_job
from streamjoin.runners.hooks import after_write
from streamjoin.runners.live import LiveRunner
from streamjoin.session import get_spark


def main(spark, arguments: dict) -> None:
    die_after = arguments.get("die_after")
    writes = {"count": 0}

    def killed_after(table: str, batch: int | None) -> None:
        if die_after and table == die_after[0]:
            writes["count"] += 1
            if writes["count"] == die_after[1]:
                os.killpg(os.getpgid(0), signal.SIGKILL)

    runner = LiveRunner(
        spark,
        load_job(arguments["job"]),
        arguments["checkpoint"],
        trigger=arguments.get("trigger", "available-now"),
    )
    with after_write(killed_after):
        if arguments.get("trigger", "available-now") == "available-now":
            runner.run()
            return
        query = runner.start()
        print("running", flush=True)
        while not query.awaitTermination(0.5):
            if die_after and caught_up(query):
                print("caught up", flush=True)
                os.killpg(os.getpgid(0), signal.SIGKILL)


def caught_up(query) -> bool:
    """The query has run a batch and, twice half a second apart, none is running and its sources
    have no more data: every commit written before it started has been processed."""

    def idle() -> bool:
        status = query.status
        return not status["isTriggerActive"] and not status["isDataAvailable"]

    if query.lastProgress is None or not idle():
        return False
    time.sleep(0.5)
    return idle()


if __name__ == "__main__":
    session = get_spark(app_name="streamjoin-live-child")  # before its turn: see above
    main(session, json.loads(sys.stdin.readline()))
