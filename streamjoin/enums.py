"""The job's and the runs' closed vocabularies as string enums.

Each value is today's word ("exact", "stream", "inner", ...): a member compares equal to its word,
so YAML values, stored metrics and messages keep working while the code names the choices.
"""

from __future__ import annotations

from enum import StrEnum

from streamjoin.errors import JobError


class Mode(StrEnum):
    """How a replay judges lateness: `exact` as the live run did, `complete` every row on time."""

    EXACT = "exact"
    COMPLETE = "complete"

    @classmethod
    def parse(cls, value: str, where: str = "mode") -> Mode:
        """`value` as a Mode; an unknown word is refused naming both."""
        try:
            return cls(value)
        except ValueError:
            raise JobError(
                f"{where} {value!r} is unknown; use 'exact' (as live ran) or 'complete' (every row on time)"
            ) from None


class SourceKind(StrEnum):
    """An append-only `stream` of events, or a keyed `table` that changes over time."""

    STREAM = "stream"
    TABLE = "table"


class JoinType(StrEnum):
    """Which unmatched rows a link keeps (padded with NULLs)."""

    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    FULL = "full"
    CROSS = "cross"


class Emit(StrEnum):
    """When a stream-stream link writes a padded row: once its window closed, or at once."""

    FINAL = "final"
    EAGER = "eager"


class LinkKind(StrEnum):
    """The kind of a link of the join chain: its family (docs/job-spec.md)."""

    INTERVAL = "interval"
    WINDOW = "window"
    ROWS = "rows"
    TEMPORAL = "temporal"
    ASOF = "asof"
    STREAM_TABLE = "stream-table"
    TABLE_TABLE = "table-table"
    UNNEST = "unnest"
    FUNCTION = "function"
    LOOKUP = "lookup"
