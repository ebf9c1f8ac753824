"""How a run goes beyond its job and its range: one object that the facade (`streamjoin.Job`) makes
and that travels unchanged through the backfill to the replay."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from streamjoin.enums import Mode
from streamjoin.spec import Output


@dataclass(frozen=True)
class RunOptions:
    """A replay's options, and a backfill's for each of its slices.

    `mode`: "exact" (rows late as a live run judged them) or "complete" (every row on time).
    `versions`: the input versions to pin, per source (None, or a source left out: its latest).
    `closed`: the input ends at the pinned versions, so every row settles and every window closes.
    `checked`: the caller (a backfill) has already checked the pinned versions (`replay.check_inputs`).
    `known_from`: per table source, the earliest time it can be told at (--assume-earliest-known).
    `into`: write the output, its side tables and metrics there instead (`verify`'s scratch).
    `validate`, `site`: a backfill's slices are validated, their Data Docs written to `site`."""

    mode: str = Mode.EXACT  # a Mode once made (a StrEnum: it equals its word)
    versions: Mapping[str, int] | None = None
    closed: bool = False
    checked: bool = False
    known_from: Mapping[str, int] | None = None
    into: Output | None = None
    validate: bool = True
    site: str | None = None

    def __post_init__(self) -> None:  # a word ("exact") is taken as its Mode; an unknown one is refused
        object.__setattr__(self, "mode", Mode.parse(self.mode))


DEFAULTS = RunOptions()  # an exact replay over each source's latest version, validated slices
