"""The scaling chart of the benchmark report: time at each scale relative to scale 1, against linear.

A small hand-written SVG (no plotting library to install): one line per way of running a query,
summed over the queries, on log-log axes so that linear growth is the diagonal.
"""

from __future__ import annotations

import math
from collections import defaultdict

WIDTH, HEIGHT, PAD, LEGEND = 760, 420, 60, 120
COLORS = {
    "linear": "#999999",
    "replay": "#1f77b4",
    "handwritten": "#2ca02c",
    "floor": "#8c564b",
    "duckdb": "#ff7f0e",
    "live": "#d62728",
}


def series(results) -> dict[str, dict[float, float]]:
    """Per way of running (replay, handwritten, floor, duckdb, live): scale -> summed median seconds
    over the queries measured that way at every one of the way's scales (so that a line never
    changes which queries it sums)."""
    seconds: dict[str, dict[str, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in results:
        for what in r.times:
            seconds[what][r.query][r.scale] = r.median(what)
        if r.live:
            seconds["live"][r.query][r.scale] = r.live["seconds"]
    lines = {}
    for what, by_query in seconds.items():
        scales = set().union(*(set(points) for points in by_query.values()))
        complete = [points for points in by_query.values() if set(points) == scales]
        if len(scales) > 1 and complete:
            lines[what] = {scale: sum(points[scale] for points in complete) for scale in scales}
    return lines


def scaling_svg(results) -> str:
    """The chart as an SVG document."""
    lines = series(results)
    scales = sorted({s for line in lines.values() for s in line}) or [1.0]
    lo, hi = min(scales), max(max(scales), min(scales) * 2)
    ratios = [v / line[min(line)] for line in lines.values() for v in line.values()]
    top = max([hi / lo, *ratios])
    bottom = 2.0 ** math.floor(math.log2(min([1.0, *ratios])))
    right = WIDTH - PAD - LEGEND

    def x(scale: float) -> float:
        return PAD + (right - PAD) * math.log(scale / lo) / math.log(hi / lo)

    def y(ratio: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * math.log(ratio / bottom) / math.log(max(top, 2.0) / bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">Time relative to the smallest scale '
        "(sum over queries, log-log)</text>",
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{right}" y2="{HEIGHT - PAD}" stroke="black"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="black"/>',
        f'<text x="{(PAD + right) / 2}" y="{HEIGHT - 20}" text-anchor="middle">data scale (x hours of events at a fixed rate)</text>',
    ]
    for scale in scales:
        parts.append(
            f'<text x="{x(scale):.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle">{scale:g}x</text>'
        )
    tick = bottom
    while tick <= top * 1.01:
        parts.append(f'<text x="{PAD - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g}x</text>')
        parts.append(
            f'<line x1="{PAD}" y1="{y(tick):.1f}" x2="{right}" y2="{y(tick):.1f}" stroke="#eeeeee"/>'
        )
        tick *= 2
    linear = {s: s / lo for s in scales}
    for index, (name, points) in enumerate([("linear", linear), *sorted(lines.items())]):
        base = points[min(points)] if name != "linear" else 1.0
        coords = " ".join(f"{x(s):.1f},{y(v / base):.1f}" for s, v in sorted(points.items()))
        dash = ' stroke-dasharray="6,4"' if name == "linear" else ""
        color = COLORS.get(name, "#333333")
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{right + 12}" y="{PAD + 16 * index}" fill="{color}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
