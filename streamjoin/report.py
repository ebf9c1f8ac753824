"""The data-quality page of a job: its run metrics (and backfill record) as one static HTML file.

The page reads `<output>_metrics` (one row per replay slice or live micro-batch) and, when a
backfill has run, `<output>_backfill` (one row per slice attempt). A slice replayed several times
counts by its current run per mode, the one no later replay superseded (`metrics.told_superseded`).
Charts are inline SVG drawn here, so the page needs no script and nothing from the network: it
opens offline, from a file or a CI artefact (docs/data-quality.md).
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pendulum
from pyspark.sql import SparkSession

from streamjoin import atomic, delta_io, family, index
from streamjoin.arrival import BAD_TIME, FUTURE_TIME, NULL_KEY, NULL_TIME
from streamjoin.errors import JobError
from streamjoin.metrics import LINK_BUCKETS, told_superseded, waiting_at_links
from streamjoin.spec import JoinSpec
from streamjoin.timeutil import format_duration, from_micros, from_spark
from streamjoin.verify import consistency

COUNTS = (
    "rows_in",
    "rows_out",
    "joined",
    "unmatched_emitted",
    "unmatched_dropped",
    "late",
    "rejected",
    "open",
    "unsettled",
    "applied",
    "upserts",
    "deletes",
    *family.totals(),
)
OPTIONAL = (
    "open",
    "unsettled",
    "applied",
    "upserts",
    "deletes",
    *family.totals(),
)  # table columns shown only when not all zero
LABELS = {
    "rows_in": "rows in",
    "rows_out": "rows out",
    "joined": "joined",
    "unmatched_emitted": "unmatched emitted",
    "unmatched_dropped": "unmatched dropped",
    "late": "late",
    "rejected": "rejected",
    "open": "open",
    "unsettled": "unsettled",
    "applied": "table changes",
    "upserts": "upserts",
    "deletes": "deletes",
    **{name: total.label for name, total in family.totals().items()},
    "match_rate": "match rate",
    "lateness_cost": "lateness cost",
    "missing": "missing",
    "extra": "extra",
    "differing": "differing",
}
COLORS = {
    "rows_in": "#3b6ea8",
    "rows_out": "#e07b1f",
    "match_rate": "#2e8b57",
    "late": "#c9302c",
    "rejected": "#7b4fa0",
    "lateness_cost": "#1f8a8a",
    "missing": "#c9302c",
    "extra": "#7b4fa0",
    "differing": "#e07b1f",
}
MATCH_RATE = (
    "match rate = joined / (joined + unmatched emitted + unmatched dropped): of the input rows decided "
    "on time in the slice, the share that found at least one partner (late, rejected, open and "
    "unsettled rows are not in it). Output rows are counted differently: one input row may pair many times."
)
LATENESS_COST = (
    "lateness cost = rows out of the latest complete run minus rows out of the latest exact run of "
    "the same slice: the output rows that lateness removed (or, when negative, added)."
)


@dataclass
class SliceRun:
    """The latest run of one slice in one mode, and how often the slice was run in that mode."""

    counts: dict[str, int]
    started_at: datetime
    duration_s: float
    runs: int
    links: list[dict] = field(default_factory=list)  # a chain's LinkCounts, as the metrics row holds them

    @property
    def match_rate(self) -> float | None:
        return match_rate(self.counts)


@dataclass
class Attempt:
    """The latest backfill attempt of one slice in one mode."""

    status: str
    error: str | None
    failed: list[str]
    docs: str | None
    checks: list[dict] = field(default_factory=list)  # every expectation: {"passed", "check"}


@dataclass
class Slice:
    """One slice [start, end): its latest run per mode and its latest backfill attempt per mode."""

    start: datetime
    end: datetime
    runs: dict[str, SliceRun] = field(default_factory=dict)
    attempts: dict[str, Attempt] = field(default_factory=dict)

    @property
    def shown(self) -> SliceRun | None:
        """The run the charts plot: exact (as live decides) when there is one, else complete."""
        return self.runs.get("exact") or self.runs.get("complete")

    @property
    def lateness_cost(self) -> int | None:
        if "exact" in self.runs and "complete" in self.runs:
            return self.runs["complete"].counts["rows_out"] - self.runs["exact"].counts["rows_out"]
        return None


def match_rate(counts: dict[str, int]) -> float | None:
    """Joined over decided on-time input rows (MATCH_RATE); None when no row was decided."""
    decided = counts["joined"] + counts["unmatched_emitted"] + counts["unmatched_dropped"]
    return counts["joined"] / decided if decided else None


def build_report(spark: SparkSession, spec: JoinSpec, folder: str | None = None) -> Path:
    """Write the job's data-quality page to `<folder>/index.html` and return its path.

    `folder` defaults to `<output location>_quality/report`. Raises JobError when the job has no
    metrics table yet (nothing has run).
    """
    location = spec.output.side("metrics")
    if not delta_io.exists(spark, location):
        raise JobError(
            f"job {spec.name} has no run metrics yet ({location} does not exist); run a replay or a backfill first, "
            f"e.g. `streamjoin replay <job file> --start ... --end ...` or `streamjoin backfill <job file> ...`"
        )
    rows = [row.asDict() for row in delta_io.read_snapshot(spark, location).collect()]
    slices = collect_slices(rows, _attempt_rows(spark, spec))
    live = [row for row in rows if row["runner"] == "live"]
    target = Path(folder or f"{spec.output.location}_quality/report")
    target.mkdir(parents=True, exist_ok=True)
    page = target / "index.html"
    jumps = index.clock_jumps(spark, spec.output.side("index"))
    checks = consistency(spark, spec)
    atomic.replace_file(
        page, render_page(spec, slices, live, target, stopped_rows(spark, spec), jumps, checks)
    )
    return page


# What each guard that stops an input row means (the `reason` column of the side tables).
GUARDS = {
    "late": "arrived behind the watermark (side table _late)",
    NULL_KEY: "a join key is NULL (side table _rejected)",
    NULL_TIME: "the event time is NULL (side table _rejected)",
    BAD_TIME: "the event time does not parse (side table _rejected)",
    FUTURE_TIME: "the event time leads its commit time by more than max_future (side table _rejected)",
}


def stopped_rows(spark: SparkSession, spec: JoinSpec) -> list[dict]:
    """The rows the guards stopped, as the side tables hold them now: a count per guard and source."""
    counts: list[dict] = []
    for side in ("late", "rejected"):
        location = spec.output.side(side)
        if delta_io.exists(spark, location):
            grouped = delta_io.read_snapshot(spark, location).groupBy("reason", "source").count()
            counts += [r.asDict() for r in grouped.orderBy("reason", "source").collect()]
    return counts


def _attempt_rows(spark: SparkSession, spec: JoinSpec) -> list[dict]:
    location = spec.output.side("backfill")
    if not delta_io.exists(spark, location):
        return []
    return [row.asDict() for row in delta_io.read_snapshot(spark, location).collect()]


def collect_slices(metrics: list[dict], attempts: list[dict]) -> list[Slice]:
    """Replay metrics rows and backfill attempts as slices in time order, each by its current run per
    mode (the newest not superseded: metrics.told_superseded) and how often it ran. A slice whose runs
    a later replay of an overlapping range superseded is left out, with its attempts unless one
    did not succeed: the later replay's slices show those rows, each once."""
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for row in told_superseded(metrics):
        if row["runner"] == "replay":
            grouped[(from_spark(row["slice_start"]), from_spark(row["slice_end"]), row["mode"])].append(row)
    slices: dict[tuple, Slice] = {}
    replaced = set()
    for (start, end, mode), runs in grouped.items():
        current = [r for r in runs if not r.get("superseded_by")]
        if not current:
            replaced.add((start, end, mode))
            continue
        latest = max(current, key=lambda r: r["started_at"])
        piece = slices.setdefault((start, end), Slice(start, end))
        piece.runs[mode] = SliceRun(
            {name: latest.get(name) or 0 for name in COUNTS},
            from_spark(latest["started_at"]),
            latest["duration_s"] or 0.0,
            len(runs),
            json.loads(latest.get("by_link") or "[]"),
        )
    latest_attempts = {
        (from_spark(row["slice_start"]), from_spark(row["slice_end"]), row["mode"]): row
        for row in sorted(attempts, key=lambda r: r["finished_at"])
    }
    for (start, end, mode), row in latest_attempts.items():
        if (start, end, mode) in replaced and row["status"] == "succeeded":
            continue
        piece = slices.setdefault((start, end), Slice(start, end))
        piece.attempts[mode] = Attempt(
            row["status"],
            row["error"],
            json.loads(row["validation_failed"] or "[]"),
            row["docs"],
            json.loads(row.get("validation_checks") or "[]"),
        )
    return [slices[key] for key in sorted(slices)]


# ---------------------------------------------------------------- formatting


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:,}"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _time(value: datetime, timezone: str, pattern: str = "%Y-%m-%d %H:%M:%S") -> str:
    return pendulum.instance(value).in_timezone(timezone).strftime(pattern)


def _interval(start: datetime, end: datetime, timezone: str) -> str:
    """A slice as a reader scans it: the end's date is left out when it is the start's."""
    same_day = _time(start, timezone, "%Y-%m-%d") == _time(end, timezone, "%Y-%m-%d")
    return (
        f"{_time(start, timezone)} → {_time(end, timezone, '%H:%M:%S' if same_day else '%Y-%m-%d %H:%M:%S')}"
    )


def _stacked(text: str) -> str:
    """`text` as two lines (a slice's start, then its end; a date, then its time): narrow columns."""
    first, _, rest = text.partition(" → " if " → " in text else " ")
    second = f"→ {rest}" if " → " in text else rest
    return f"<span>{_e(first)}</span><span>{_e(second)}</span>" if rest else _e(text)


def _axis_pattern(starts: list[datetime], timezone: str) -> str:
    """The shortest time format that still tells the slice starts apart."""
    local = [pendulum.instance(s).in_timezone(timezone) for s in starts]
    if all((t.hour, t.minute, t.second) == (0, 0, 0) for t in local):
        return "%Y-%m-%d"
    if all(t.second == 0 for t in local):
        return "%m-%d %H:%M"
    return "%H:%M:%S" if len({t.date() for t in local}) == 1 else "%m-%d %H:%M:%S"


def docs_link(docs: str, folder: Path) -> str:
    """A link to a Data Docs page: relative to the report when both are local, so they move together."""
    if "://" in docs:
        return docs
    return Path(os.path.relpath(Path(docs).resolve(), folder.resolve())).as_posix()


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


# ---------------------------------------------------------------- charts (inline SVG)

WIDTH, HEIGHT = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 72, 20, 64, 64


@dataclass
class Series:
    name: str  # a key of LABELS and COLORS
    values: list[float | None]


def _ticks(low: float, high: float, integer: bool) -> list[float]:
    """Round tick values covering [low, high]: steps of 1, 2 or 5 times a power of ten."""
    if high <= low:
        high = low + 1
    raw = (high - low) / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    if integer:
        step = max(1, round(step))
    first = math.floor(low / step) * step
    ticks = [first]
    while ticks[-1] < high:
        ticks.append(ticks[-1] + step)
    return ticks


@dataclass(frozen=True)
class Chart:
    """One chart, x = slice: grouped bars (`kind='bars'`) or lines with a point per slice (`'lines'`).
    `labels` name the slices under the axis, `slice_ids` tag their marks."""

    chart_id: str
    title: str
    y_label: str
    x_label: str
    labels: list[str]
    slice_ids: list[str]
    series: list[Series]
    kind: str = "bars"
    percent: bool = False


@dataclass(frozen=True)
class _Scale:
    """Where a chart's values and slices land in its plot area."""

    ticks: list[float]
    slices: int

    @property
    def plot_w(self) -> float:
        return WIDTH - LEFT - RIGHT

    @property
    def plot_h(self) -> float:
        return HEIGHT - TOP - BOTTOM

    @property
    def band(self) -> float:
        return self.plot_w / self.slices

    @property
    def zero(self) -> float:
        """The y of the baseline: 0, or the lowest tick when every value is above 0."""
        return self.y(max(self.ticks[0], 0))

    def y(self, value: float) -> float:
        low, high = self.ticks[0], self.ticks[-1]
        return TOP + self.plot_h - (value - low) / (high - low) * self.plot_h


def chart(spec: Chart) -> str:
    """The chart as inline SVG. Every plotted mark carries class `mark`, its series, slice and
    value (data attributes) and a tooltip, so a reader (or a test) can check each number."""
    values = [v for s in spec.series for v in s.values if v is not None]
    if spec.percent:
        ticks: list[float] = [0, 0.25, 0.5, 0.75, 1.0]
    else:
        ticks = _ticks(min([0, *values]), max([0, *values]), integer=True)
    scale = _Scale(ticks, len(spec.labels))
    parts = _frame(spec, scale)
    for k, series in enumerate(spec.series):
        parts.extend(_marks(spec, scale, k, series))
    parts.append("</svg>")
    return "".join(parts)


def _frame(spec: Chart, scale: _Scale) -> list[str]:
    """The chart's title, legend, grid, axes and their labels."""
    parts = [
        (
            f'<svg class="chart" id="{spec.chart_id}" xmlns="http://www.w3.org/2000/svg" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_e(spec.title)}">'
        ),
        f'<text class="title" x="{LEFT}" y="22">{_e(spec.title)}</text>',
    ]
    legend_x = LEFT
    for s in spec.series:
        parts.append(
            f'<rect x="{legend_x}" y="34" width="12" height="12" fill="{COLORS[s.name]}"/>'
            f'<text class="legend" x="{legend_x + 17}" y="44">{_e(LABELS[s.name])}</text>'
        )
        legend_x += 30 + 8 * len(LABELS[s.name])
    for tick in scale.ticks:
        text = _percent(tick).replace(".0%", "%") if spec.percent else _number(int(tick))
        y = scale.y(tick)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{LEFT + scale.plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{text}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + scale.plot_h}"/>'
        f'<line class="axis" x1="{LEFT}" x2="{LEFT + scale.plot_w}" y1="{scale.zero:.1f}" y2="{scale.zero:.1f}"/>'
    )
    every = math.ceil(len(spec.labels) / 10)  # at most about ten labels under the axis
    for i, label in enumerate(spec.labels):
        if i % every == 0:
            parts.append(
                f'<text class="tick" x="{LEFT + scale.band * (i + 0.5):.1f}" y="{TOP + scale.plot_h + 18}" '
                f'text-anchor="middle">{_e(label)}</text>'
            )
    parts.append(
        f'<text class="axis-label" x="{LEFT + scale.plot_w / 2}" y="{HEIGHT - 12}" text-anchor="middle">'
        f"{_e(spec.x_label)}</text>"
        f'<text class="axis-label" transform="translate(18 {TOP + scale.plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{_e(spec.y_label)}</text>'
    )
    return parts


def _marks(spec: Chart, scale: _Scale, k: int, series: Series) -> list[str]:
    """The `k`th series' marks: a bar per slice, or a line through a point per slice; with their
    values written on them while the slices are few enough for the text to fit."""
    shown = _percent if spec.percent else _number
    group = min(scale.band * 0.7, 56.0 * len(spec.series))
    parts, points = [], []
    for i, value in enumerate(series.values):
        if value is None:
            continue
        tip = f"<title>{_e(spec.labels[i])}: {_e(LABELS[series.name])} {shown(value)}</title>"
        data = (
            f'class="mark" data-series="{series.name}" data-slice="{spec.slice_ids[i]}" data-value="{value}"'
        )
        if spec.kind == "bars":
            width = group / len(spec.series)
            x = LEFT + scale.band * (i + 0.5) - group / 2 + k * width
            top, bottom = sorted((scale.y(value), scale.zero))
            parts.append(
                f'<rect {data} x="{x:.1f}" y="{top:.1f}" width="{max(width - 2, 1):.1f}" '
                f'height="{max(bottom - top, 0.5):.1f}" fill="{COLORS[series.name]}">{tip}</rect>'
            )
            x, label_y = x + width / 2 - 1, (top - 5 if value >= 0 else bottom + 14)
        else:
            x, y = LEFT + scale.band * (i + 0.5), scale.y(value)
            label_y = y - 10
            points.append(
                (
                    f"{x:.1f},{y:.1f}",
                    f'<circle {data} cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{COLORS[series.name]}">{tip}</circle>',
                )
            )
        if len(spec.labels) <= 24:
            parts.append(
                f'<text class="value" x="{x:.1f}" y="{label_y:.1f}" text-anchor="middle">{shown(value)}</text>'
            )
    if points:  # the line first, so the points sit on top of it
        line = " ".join(xy for xy, _ in points)
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{COLORS[series.name]}" stroke-width="2"/>'
        )
        parts.extend(circle for _, circle in points)
    return parts


# ---------------------------------------------------------------- the page

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330; margin: 0; background: #f5f6f8; }
header, main { max-width: 1600px; margin: 0 auto; padding: 16px 28px; }
header { background: #1d2330; color: #fff; max-width: none; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header p { margin: 2px 0; color: #c8cdd8; }
h2 { font-size: 18px; margin: 28px 0 10px; }
.tiles { display: flex; flex-wrap: wrap; gap: 12px; }
.tile { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; padding: 10px 16px; min-width: 130px; }
.tile .value { font-size: 22px; font-weight: 600; }
.tile .name { color: #5a6275; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(600px, 1fr)); gap: 14px; }
.charts figure { margin: 0; background: #fff; border: 1px solid #dde1e8; border-radius: 6px; padding: 6px; }
.charts figcaption { color: #5a6275; font-size: 12px; padding: 0 8px 6px; }
svg.chart { width: 100%; height: auto; font-family: inherit; }
svg .title { font-size: 16px; font-weight: 600; fill: #1d2330; }
svg .legend, svg .tick { font-size: 12px; fill: #3b4252; }
svg .axis-label { font-size: 13px; fill: #1d2330; }
svg .value { font-size: 11px; fill: #1d2330; font-weight: 600; }
svg .grid { stroke: #e6e9ef; }
svg .axis { stroke: #6b7385; }
.table-wrap { overflow-x: auto; background: #fff; border: 1px solid #dde1e8; border-radius: 6px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { padding: 5px 6px; border-bottom: 1px solid #e6e9ef; text-align: right; white-space: nowrap; }
th { background: #eef0f4; position: sticky; top: 0; font-weight: 600; white-space: normal; vertical-align: bottom; }
td.text, th.text { text-align: left; }
td.wrap { white-space: normal; min-width: 150px; max-width: 320px; text-align: left; }
#slices { font-size: 12px; }
#slices td, #slices th { padding: 4px 4px; }
#slices td.wrap { min-width: 140px; max-width: 200px; }
td.stacked { line-height: 1.3; }
td.stacked > span { display: block; }
div.docs { margin-top: 2px; font-size: 12px; }
tr.first td { border-top: 2px solid #cfd4dd; }
.status { padding: 2px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.status.succeeded { background: #dff3e4; color: #1e6b34; }
.status.failed { background: #fbe0df; color: #9b1c1a; }
.status.invalid { background: #fff0cf; color: #8a5a00; }
.muted { color: #7a8294; }
tr.bad td { background: #fbe0df; }
td pre { white-space: pre-wrap; font-size: 12px; margin: 4px 0; }
details.checks ul { margin: 4px 0; padding-left: 4px; list-style: none; font-size: 12px; }
details.checks li.failed { color: #9b1c1a; }
dl.definitions dt { font-weight: 600; margin-top: 8px; }
dl.definitions dd { margin: 2px 0 0 0; color: #3b4252; }
"""


def render_page(
    spec: JoinSpec,
    slices: list[Slice],
    live: list[dict],
    folder: Path,
    stopped: list[dict],
    jumps: list[dict] | None = None,
    checks: list[dict] | None = None,
) -> str:
    """The whole HTML page; `checks`: each slice's latest `verify` (verify.consistency)."""
    timezone = spec.meta.schedule.timezone
    generated = pendulum.now(timezone).strftime("%Y-%m-%d %H:%M:%S %Z")
    body = [
        f"<header><h1>Data quality: {_e(spec.name)}</h1>",
        f"<p>{_e(spec.meta.description)}</p>" if spec.meta.description else "",
        f"<p>output {_e(spec.output.location)} &middot; times in {_e(timezone)} &middot; generated {_e(generated)}</p></header><main>",
    ]
    plotted = [s for s in slices if s.shown]
    if plotted:
        body.append(_tiles(plotted))
        body.append(_charts(plotted, timezone))
    else:
        body.append(
            '<p class="empty">No replay slices are recorded yet: run <code>streamjoin replay</code> or '
            "<code>streamjoin backfill</code> to fill this page.</p>"
        )
    if slices:
        body.append(_slice_table(slices, timezone, folder))
    if live:
        body.append(_live_table(live, timezone))
    if checks:
        body.append(_consistency(checks, timezone))
    body.append(_link_table(plotted, live))
    body.append(_guard_table(stopped))
    body.append(_jump_table(jumps or [], timezone))
    body.append(
        "<h2>Definitions</h2><dl class='definitions'>"
        f"<dt>match rate</dt><dd>{_e(MATCH_RATE)}</dd><dt>lateness cost</dt><dd>{_e(LATENESS_COST)}</dd>"
        "<dt>runs plotted</dt><dd>Each slice's latest exact run (what live decides); a slice replayed only in "
        "complete mode shows its complete run. A slice replayed several times counts by its latest run; one "
        "whose rows a later replay of another cut replaced is left out.</dd>"
        "<dt>buckets</dt><dd>Every input row ends in one bucket: joined, unmatched emitted (padded), unmatched "
        "dropped, late (side table _late), rejected (side table _rejected), open (window still open) or unsettled "
        "(arrived after the frontier); docs/semantics.md.</dd></dl></main>"
    )
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(spec.name)}: data quality</title>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><style>{STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>"
    )


def _plotted_run(plotted: Slice) -> SliceRun:
    """The run a plotted slice shows: render_page plots only the slices that have one."""
    run = plotted.shown
    assert run is not None
    return run


def _tiles(plotted: list[Slice]) -> str:
    totals = {name: sum(_plotted_run(s).counts[name] for s in plotted) for name in COUNTS}
    costs = [s.lateness_cost for s in plotted if s.lateness_cost is not None]
    tiles = [
        ("slices", _number(len(plotted))),
        ("rows in", _number(totals["rows_in"])),
        ("rows out", _number(totals["rows_out"])),
        ("match rate", _percent(match_rate(totals))),
        ("late", _number(totals["late"])),
        ("rejected", _number(totals["rejected"])),
        ("lateness cost", _number(sum(costs)) if costs else "–"),
    ]
    cells = "".join(
        f"<div class='tile' data-tile='{_e(name)}'><div class='value'>{value}</div>"
        f"<div class='name'>{_e(name)}</div></div>"
        for name, value in tiles
    )
    return f"<h2>Summary of {len(plotted)} slice(s)</h2><div class='tiles'>{cells}</div>"


_NO_COST = (
    "No slice has both an exact and a complete run, so there is no lateness cost to show: "
    "replay a slice with --mode complete as well."
)


def _charts(plotted: list[Slice], timezone: str) -> str:
    """The per-slice charts, each with its caption; the lateness cost's only where slices have one."""
    pattern = _axis_pattern([s.start for s in plotted], timezone)

    def chart_of(slices: list[Slice], head: tuple[str, str, str], series: list[Series], **how) -> Chart:
        labels = [_time(s.start, timezone, pattern) for s in slices]
        x_label, ids = f"slice start ({timezone})", [s.start.isoformat() for s in slices]
        return Chart(*head, x_label, labels, ids, series, **how)

    counts = [_plotted_run(s).counts for s in plotted]

    def per_slice(*names: str) -> list[Series]:
        return [Series(name, [c[name] for c in counts]) for name in names]

    rates = [Series("match_rate", [_plotted_run(s).match_rate for s in plotted])]
    costed = [s for s in plotted if s.lateness_cost is not None]
    cost = [Series("lateness_cost", [s.lateness_cost for s in costed])]
    figures = [
        (
            chart_of(
                plotted,
                ("chart-rows", "Rows in and rows out per slice", "rows"),
                per_slice("rows_in", "rows_out"),
            ),
            "Input rows read by the slice and output rows it wrote.",
        ),
        (
            chart_of(
                plotted,
                ("chart-match-rate", "Match rate per slice", "match rate"),
                rates,
                kind="lines",
                percent=True,
            ),
            MATCH_RATE,
        ),
        (
            chart_of(
                plotted,
                ("chart-late-rejected", "Late and rejected rows per slice", "rows"),
                per_slice("late", "rejected"),
            ),
            "Late rows are in <output>_late, rejected rows (NULL key or time) in <output>_rejected.",
        ),
        (
            chart_of(
                costed,
                ("chart-lateness-cost", "Lateness cost per slice (complete minus exact rows out)", "rows"),
                cost,
            )
            if costed
            else None,
            LATENESS_COST if costed else _NO_COST,
        ),
    ]
    cells = "".join(
        f"<figure>{chart(spec) if spec else ''}<figcaption>{_e(caption)}</figcaption></figure>"
        for spec, caption in figures
    )
    return f"<h2>Per slice</h2><div class='charts'>{cells}</div>"


# The slice table's count columns: one count, or several stacked in one cell (a line each), so that
# every column of the fullest table fits a 1400 px window. Optional counts show only when not all zero.
SLICE_COLUMNS = (
    ("rows_in",),
    ("rows_out",),
    ("joined",),
    ("unmatched_emitted", "unmatched_dropped"),
    ("late",),
    ("rejected",),
    ("open", "unsettled"),
    ("applied", "upserts", "deletes"),
    *((name,) for name in family.totals()),
)


def _slice_table(slices: list[Slice], timezone: str, folder: Path) -> str:
    shown = {
        name
        for name in COUNTS
        if name not in OPTIONAL or any(r.counts[name] for s in slices for r in s.runs.values())
    }
    columns = [kept for kept in (tuple(n for n in group if n in shown) for group in SLICE_COLUMNS) if kept]
    head = (
        "<tr><th class='text'>slice [start, end)</th><th>lateness cost</th><th class='text'>mode</th>"
        "<th class='text'>backfill</th><th class='text'>validation</th>"
        + "".join(f"<th>{' / '.join(_e(LABELS[n]) for n in names)}</th>" for names in columns)
        + "<th>match rate</th><th class='text'>last run (runs)</th></tr>"
    )
    rows = []
    for piece in slices:
        modes = sorted(set(piece.runs) | set(piece.attempts), key=lambda m: (m != "exact", m))
        for i, mode in enumerate(modes):
            rows.append(_slice_row(piece, mode, (i, len(modes)), columns, (timezone, folder)))
    return (
        f"<h2>Slices</h2><div class='table-wrap'><table id='slices'><thead>{head}</thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _slice_row(
    piece: Slice, mode: str, place: tuple[int, int], columns: list[tuple[str, ...]], where: tuple[str, Path]
) -> str:
    """One slice's row for `mode`; the first of its `place[1]` rows carries the slice and its cost."""
    (i, count), (timezone, folder) = place, where
    run, attempt = piece.runs.get(mode), piece.attempts.get(mode)
    cells = []
    if i == 0:
        span = f"rowspan='{count}'"
        cells.append(
            f"<td class='text stacked' {span}>{_stacked(_interval(piece.start, piece.end, timezone))}</td>"
            f"<td {span} data-field='lateness_cost'>{_number(piece.lateness_cost)}</td>"
        )
    cells.append(f"<td class='text'>{_e(mode)}</td>")
    cells.append(_attempt_cells(attempt, folder))  # before the counts: seen without scrolling
    for names in columns:
        values = [
            f"<span title='{_e(LABELS[name])}' data-field='{name}'>{_number(run.counts[name] if run else None)}</span>"
            for name in names
        ]
        cells.append(f"<td class='stacked'>{''.join(values)}</td>")
    cells.append(f"<td data-field='match_rate'>{_percent(run.match_rate if run else None)}</td>")
    if run:
        cells.append(
            f"<td class='text stacked' title='took {run.duration_s:.1f} s'>{_stacked(_time(run.started_at, timezone))}"
            f"<span>(<span data-field='runs'>{_number(run.runs)}</span>)</span></td>"
        )
    else:
        cells.append("<td class='text'>–</td>")
    return (
        f"<tr class='{'first' if i == 0 else 'more'}' data-slice='{piece.start.isoformat()}' "
        f"data-mode='{_e(mode)}'>{''.join(cells)}</tr>"
    )


def _attempt_cells(attempt: Attempt | None, folder: Path) -> str:
    """The backfill attempt's status, and its validation: the failures, every expectation, and a
    link to Great Expectations' Data Docs page (which needs the web for its styles)."""
    if attempt is None:
        return "<td class='text muted' data-field='status'>no backfill</td><td class='wrap'></td>"
    problems = attempt.failed + ([attempt.error] if attempt.error else [])
    detail = (
        "<br>".join(_e(p) for p in problems)
        if problems
        else ("passed" if attempt.status == "succeeded" and not attempt.checks else "")
    )
    if attempt.checks:
        passed = sum(c["passed"] for c in attempt.checks)
        items = "".join(
            f"<li class='{'passed' if c['passed'] else 'failed'}'>{'&#10003;' if c['passed'] else '&#10007;'} "
            f"{_e(c['check'])}</li>"
            for c in attempt.checks
        )
        detail += (
            f"<details class='checks'><summary>{passed} of {len(attempt.checks)} expectations passed</summary>"
            f"<ul>{items}</ul></details>"
        )
    if attempt.docs:
        detail += f"<div class='docs' data-field='docs'><a href='{_e(docs_link(attempt.docs, folder))}'>Data Docs</a></div>"
    return (
        f"<td class='text' data-field='status'><span class='status {_e(attempt.status)}'>{_e(attempt.status)}</span></td>"
        f"<td class='wrap' data-field='validation'>{detail}</td>"
    )


def _guard_table(stopped: list[dict]) -> str:
    """How many input rows each guard stopped, per source, from the side tables."""
    if not stopped:
        return "<h2>Rows stopped by the guards</h2><p class='empty'>None: no row was late or rejected.</p>"
    rows = "".join(
        f"<tr data-guard='{_e(r['reason'])}' data-source='{_e(r['source'])}'>"
        f"<td class='text'>{_e(r['reason'])}</td><td class='text'>{_e(GUARDS.get(r['reason'], ''))}</td>"
        f"<td class='text'>{_e(r['source'])}</td><td data-field='rows'>{_number(r['count'])}</td></tr>"
        for r in stopped
    )
    return (
        "<h2>Rows stopped by the guards</h2><div class='table-wrap'><table id='guards'><thead><tr>"
        "<th class='text'>guard</th><th class='text'>what it stops</th><th class='text'>source</th><th>rows</th>"
        f"</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _jump_table(jumps: list[dict], timezone: str) -> str:
    """The commits that moved the event-time clock (and so every watermark) furthest at once."""
    head = (
        "<h2>Largest jumps of the event-time clock</h2><p>The clock is the largest accepted event time of "
        "the job's streams so far; each join's watermark is the clock minus its grace, and rows behind it "
        "are late. A jump far ahead of its commit time makes every row after it late: see max_future in "
        "docs/job-spec.md.</p>"
    )
    if not jumps:
        return head + "<p class='empty'>None recorded yet (the arrival index is empty or absent).</p>"
    rows = []
    for j in jumps:
        lead = j["after"] - j["commit_ts"]
        rows.append(
            f"<tr data-source='{_e(j['source'])}' data-version='{j['version']}'>"
            f"<td class='text'>{_e(_time(from_micros(j['commit_ts']), timezone))}</td>"
            f"<td class='text'>{_e(j['source'])}</td><td>{j['version']}</td>"
            f"<td class='text'>{_e(_time(from_micros(j['before']), timezone))}</td>"
            f"<td class='text' data-field='after'>{_e(_time(from_micros(j['after']), timezone))}</td>"
            f"<td class='text' data-field='jump' title='{_e(_exact_span(j['after'] - j['before']))}'>"
            f"{_e(_span(j['after'] - j['before']))}</td>"
            f"<td class='text' data-field='lead' title='{_e(_exact_span(lead) if lead > 0 else '')}'>"
            f"{_e(_span(lead) if lead > 0 else '')}</td></tr>"
        )
    return head + (
        "<div class='table-wrap'><table id='jumps'><thead><tr><th class='text'>committed</th>"
        "<th class='text'>source</th><th>version</th><th class='text'>clock before</th><th class='text'>clock after</th>"
        "<th class='text'>jump</th><th class='text'>after leads the commit by</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _consistency(checks: list[dict], timezone: str) -> str:
    """Each slice's latest `streamjoin verify`: a chart of the differences and a row per slice with
    the live batch and versions compared and a few example rows (docs/data-quality.md)."""
    starts = [from_spark(c["slice_start"]) for c in checks]
    pattern = _axis_pattern(starts, timezone)
    figure = chart(
        Chart(
            "chart-consistency",
            "Live output against the exact replay, per slice",
            "rows",
            f"slice start ({timezone})",
            [_time(t, timezone, pattern) for t in starts],
            [t.isoformat() for t in starts],
            [Series(name, [c[name] for c in checks]) for name in ("missing", "extra", "differing")],
        )
    )
    rows = []
    for c, start in zip(checks, starts, strict=True):
        examples = json.loads(c["examples"] or "[]")
        shown = (
            f"<details><summary>{len(examples)} example(s)</summary><pre>{_e(json.dumps(examples, indent=1))}</pre></details>"
            if examples
            else ""
        )
        status = "equal" if c["equal"] else "DIFFERS"
        rows.append(
            f"<tr data-slice='{start.isoformat()}' class='{'ok' if c['equal'] else 'bad'}'>"
            f"<td class='text'>{_e(_interval(start, from_spark(c['slice_end']), timezone))}</td>"
            f"<td class='text' data-field='status'>{status}</td>"
            + "".join(
                f"<td data-field='{n}'>{_number(c[n])}</td>"
                for n in ("rows_live", "rows_replayed", "missing", "extra", "differing")
            )
            + f"<td class='text'>{_e(_time(from_spark(c['verified_at']), timezone))}</td>"
            f"<td data-field='live_batch'>{_number(c['live_batch'])}</td>"
            f"<td class='text wrap'>{_e(c['versions'])}</td><td class='text wrap'>{shown}</td></tr>"
        )
    differ = sum(not c["equal"] for c in checks)
    verdict = (
        f"{differ} of {len(checks)} verified slice(s) differ from the exact replay"
        if differ
        else f"all {len(checks)} verified slice(s) equal the exact replay"
    )
    head = (
        "<tr><th class='text'>slice [start, end)</th><th class='text'>status</th><th>live rows</th>"
        "<th>replayed rows</th><th>missing</th><th>extra</th><th>differing</th><th class='text'>verified</th>"
        "<th>live batch</th><th class='text'>versions</th><th class='text'>examples</th></tr>"
    )
    return (
        f"<h2>Consistency: live against replay</h2><p id='consistency-verdict'>{_e(verdict)} "
        "(<code>streamjoin verify</code>; each slice's latest check). Missing: rows the replay writes that the "
        "live output lacks; extra: rows the live output holds more often than the replay; differing: rows "
        f"whose output key matches but whose values do not.</p><div class='charts'><figure>{figure}</figure></div>"
        f"<div class='table-wrap'><table id='consistency'><thead>{head}</thead><tbody>{''.join(rows)}</tbody>"
        "</table></div>"
    )


def _link_table(plotted: list[Slice], live: list[dict]) -> str:
    """A chain's links: over the slices plotted, and over every live batch, the rows each link
    reached, what became of them there and what it passed on (metrics.LinkCounts). Empty for a
    single join."""
    runs = {
        "replay": [run.links for run in (s.shown for s in plotted) if run is not None],
        "live": [json.loads(row.get("by_link") or "[]") for row in live],
    }
    # The rows waiting at each link at the end: what the newest live batch left; each slice's own.
    newest = max(live, key=lambda row: (row["started_at"], row["batch"] or 0), default=None)
    waiting = {
        "replay": [link for links in runs["replay"] for link in links],
        "live": json.loads(newest.get("by_link") or "[]") if newest else [],
    }
    rows = []
    for runner, per_run in runs.items():
        totals: dict[str, Counter] = {}
        for links in per_run:
            for link in links:
                counts = {b: link.get(b, 0) for b in LINK_BUCKETS}  # `assumed` came later
                emitted = link.get("emitted")
                counts["passed"] = (
                    counts["matched"] + counts["padded"] + counts["assumed"] if emitted is None else emitted
                )
                totals.setdefault(link["link"], Counter()).update(counts)
        for link in waiting[runner]:
            totals[link["link"]]["open"] += link.get("open", 0)
        for name, t in totals.items():
            rate = t["matched"] / t["reached"] if t["reached"] else None
            rows.append(
                f"<tr data-link='{_e(name)}' data-runner='{runner}'><td class='text'>{_e(name)}</td>"
                f"<td class='text'>{runner}</td>"
                + "".join(
                    f"<td data-field='{b}'>{_number(t[b])}</td>" for b in (*LINK_BUCKETS, "passed", "open")
                )
                + f"<td data-field='match_rate'>{_percent(rate)}</td></tr>"
            )
    if not rows:
        return ""
    head = (
        "<tr><th class='text'>link</th><th class='text'>runner</th><th>rows reached</th><th>matched</th>"
        "<th>padded</th><th>dropped</th><th>assumed</th><th>passed on</th><th>waiting now</th><th>match rate</th></tr>"
    )
    return (
        "<h2>The chain, link by link</h2><p>The rows that reached each link and what became of them there: "
        "matched, padded (an outer link keeps them), dropped (an INNER link's, or late at a stream-stream "
        "link), assumed (looked up in a table's earliest known state, since the table could not be told at "
        "their time: a backfill run with --assume-earliest-known). A link passes on its matched and padded rows (a stream-stream link one row per pair and "
        "padded row), and the next link reaches those, less the rows still waiting there for a table or an "
        "open window; waiting now: those rows at the end (live: as the newest micro-batch left them). "
        "Replay: the slices plotted; live: every micro-batch.</p><div class='table-wrap'>"
        f"<table id='links'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _span(micros: int) -> str:
    """A duration as a reader scans it: its two largest units (`7h15m`, `2m5s`, `350ms`), cut, not
    rounded, so that it never says more than happened; `_exact_span` gives the rest."""
    shown = format_duration(timedelta(microseconds=micros))
    units = re.findall(r"-?\d+[a-z]+", shown)
    return "".join(units[:2]) if units else shown


def _exact_span(micros: int) -> str:
    return format_duration(timedelta(microseconds=micros))


def _live_table(live: list[dict], timezone: str) -> str:
    """Live micro-batches per streaming run (checkpoint): batches, totals, and what is still held."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for row in live:
        runs[row["run_id"]].append(row)
    rows = []
    for run_id, batches in sorted(runs.items(), key=lambda item: min(b["started_at"] for b in item[1])):
        batches.sort(key=lambda b: b["batch"])
        totals = {
            name: sum(b[name] or 0 for b in batches)
            for name in ("rows_in", "rows_out", "joined", "late", "rejected")
        }
        last = batches[-1]
        waiting = waiting_at_links(json.loads(last.get("by_link") or "[]"))
        held = (last["open"] or 0) + (last["unsettled"] or 0) + waiting
        rows.append(
            f"<tr data-run='{_e(run_id)}'><td class='text'>{_e(run_id)}</td><td data-field='batches'>{len(batches)}</td>"
            f"<td class='text'>{_e(_time(from_spark(batches[0]['started_at']), timezone))}</td>"
            f"<td class='text'>{_e(_time(from_spark(batches[-1]['started_at']), timezone))}</td>"
            + "".join(f"<td data-field='{name}'>{_number(value)}</td>" for name, value in totals.items())
            + f"<td data-field='held'>{_number(held)}</td></tr>"
        )
    head = (
        "<tr><th class='text'>live run (checkpoint id)</th><th>micro-batches</th><th class='text'>first batch</th>"
        "<th class='text'>last batch</th><th>rows in</th><th>rows out</th><th>joined</th><th>late</th>"
        "<th>rejected</th><th>held now</th></tr>"
    )
    return (
        f"<h2>Live micro-batches</h2><div class='table-wrap'><table id='live'><thead>{head}</thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
