"""The scaling chart of the benchmark report: time at each scale relative to scale 1, against linear.

A small hand-written SVG (no plotting library to install): one line per way of running a query,
summed over the queries, on log-log axes so that linear growth is the diagonal.
"""

from __future__ import annotations

import math
from collections import defaultdict

WIDTH, HEIGHT, PAD = 640, 400, 60
COLORS = {"linear": "#999999", "replay": "#1f77b4", "handwritten": "#2ca02c", "floor": "#8c564b",
          "duckdb": "#ff7f0e", "live": "#d62728"}


def series(results) -> dict[str, dict[float, float]]:
    """Per way of running (replay, handwritten, floor, duckdb, live): scale -> summed median seconds
    over the queries measured at every scale."""
    totals: dict[str, dict[float, float]] = defaultdict(dict)
    for r in results:
        for what in r.times:
            totals[what][r.scale] = totals[what].get(r.scale, 0.0) + r.median(what)
        if r.live:
            totals["live"][r.scale] = totals["live"].get(r.scale, 0.0) + r.live["seconds"]
    return {k: v for k, v in totals.items() if len(v) > 1}


def scaling_svg(results) -> str:
    """The chart as an SVG document."""
    lines = series(results)
    scales = sorted({s for line in lines.values() for s in line}) or [1.0]
    lo, hi = min(scales), max(max(scales), min(scales) * 2)
    ratios = [v / line[min(line)] for line in lines.values() for v in line.values()]
    top = max([hi / lo, *ratios])

    def x(scale: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * math.log(scale / lo) / math.log(hi / lo)

    def y(ratio: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * math.log(max(ratio, 1e-9)) / math.log(max(top, 2.0))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">Time relative to the smallest scale '
        '(sum over queries, log-log)</text>',
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="black"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="black"/>',
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 20}" text-anchor="middle">data scale (x hours of events at a fixed rate)</text>',
    ]
    for scale in scales:
        parts.append(f'<text x="{x(scale):.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle">{scale:g}x</text>')
    tick = 1.0
    while tick <= top * 1.01:
        parts.append(f'<text x="{PAD - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g}x</text>')
        parts.append(f'<line x1="{PAD}" y1="{y(tick):.1f}" x2="{WIDTH - PAD}" y2="{y(tick):.1f}" stroke="#eeeeee"/>')
        tick *= 2
    linear = {s: s / lo for s in scales}
    for index, (name, points) in enumerate([("linear", linear), *sorted(lines.items())]):
        base = points[min(points)] if name != "linear" else 1.0
        coords = " ".join(f"{x(s):.1f},{y(v / base):.1f}" for s, v in sorted(points.items()))
        dash = ' stroke-dasharray="6,4"' if name == "linear" else ""
        color = COLORS.get(name, "#333333")
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{WIDTH - PAD + 6}" y="{PAD + 16 * index}" fill="{color}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
