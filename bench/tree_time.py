"""The CPU time of a command's whole process tree, Spark's JVMs included.

    python -m bench.tree_time .venv/bin/python -m pytest -q tests/test_dags.py

`/usr/bin/time` counts only the processes their parents waited for. pyspark never waits for the
JVM it starts: when the Python process exits, its JVM ends after it, orphaned, and its CPU is
counted nowhere (a probe that started a session and wrote four commits: 0.7 user-seconds by
`/usr/bin/time`, 14 with this). Here the command runs under a child subreaper (Linux's
`PR_SET_CHILD_SUBREAPER`): every orphaned descendant is handed to this process, which reaps it,
so the children's totals printed at the end hold the whole tree. It waits for every descendant
to end: a daemon a test leaves running keeps it waiting.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def main(command: list[str]) -> int:
    """Run `command`, reap every descendant, print wall and CPU seconds on stderr; its exit code."""
    if ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed: Linux only")
    began = time.monotonic()
    code = subprocess.call(command)
    while True:  # the orphans the command left: each counted once it is reaped
        try:
            os.wait()
        except ChildProcessError:
            break
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        f"{time.monotonic() - began:.1f} s wall {used.ru_utime:.1f} user {used.ru_stime:.1f} sys (whole tree)",
        file=sys.stderr,
    )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
