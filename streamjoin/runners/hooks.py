"""The runners' one fault-injection point, for tests and benchmarks: no public signature takes it.

While `after_write(hook)` is entered, the runners call `hook(table, batch)` right after each table
they write: a replay with the table's location and None, a live micro-batch with the table's role
("output", "changes", "late", "rejected", "state", "metrics"; a table the step appends to, such as a
lookup join's journal: its side-table suffix, "lookups") and its batch id. A test raises there
to fail a run between two of its writes (tests/harness.py: `FailOnce`, `FailAfterEach`); a benchmark
samples the heap. The hook is the process's, so every runner in the process calls it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

Hook = Callable[[str, int | None], None]

_hook: Hook | None = None


@contextlib.contextmanager
def after_write(hook: Hook) -> Iterator[None]:
    """Call `hook` after each table a runner writes, while inside."""
    global _hook
    previous, _hook = _hook, hook
    try:
        yield
    finally:
        _hook = previous


def wrote(table: str, batch: int | None = None) -> None:
    """A runner wrote `table` (a replay: its location; a live batch: its role, and `batch`)."""
    if _hook is not None:
        _hook(table, batch)
