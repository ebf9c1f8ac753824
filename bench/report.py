"""The benchmark report: bench/results/report.md, tables of ratios against the targets."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TARGETS = {"handwritten": 1.2, "floor": 1.5, "live": 20.0, "marginal": 1.3}


def _cell(value: float, target: float | None = None, at_most: bool = True) -> str:
    text = f"{value:.2f}"
    if target is None:
        return text
    met = value <= target if at_most else value >= target
    return text if met else f"**{text}** (missed)"


def write_report(path: Path, results, run: dict) -> None:
    """Write the markdown report for `results` (bench.run.QueryResult) of `run` (finished, minutes,
    machine, cores; an older run without `cores` gives them in `machine`)."""
    scales = ", ".join(f"{s:g}x" for s in sorted({r.scale for r in results}))
    cores = run.get("cores") or int(run["machine"].split(" cores")[0])
    rounds = max((len(r.times.get("replay", [])) for r in results), default=0)
    lines = [
        "# streamjoin benchmark",
        "",
        f"Run finished {run['finished']} ({run['minutes']} min) on {run['machine']}; "
        f"scales {scales}, {rounds} timed rounds per query and scale.",
        "Ratios are medians over rounds of times measured in the same round; seconds are medians too.",
        "",
        "## Correctness first",
        "",
        "| scale | query | rows in | rows out (exact) | complete replay = hand-written PySpark | = DuckDB | live = exact replay |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        live = "" if not r.live else ("yes" if r.live["same_as_replay"] else "**NO**")
        duck = "" if r.same_as_duckdb is None else ("yes" if r.same_as_duckdb else "**NO**")
        lines.append(
            f"| {r.scale:g}x | {r.query} | {r.rows_in:,} | {r.rows_out:,} | "
            f"{'yes' if r.same_as_handwritten else '**NO**'} | {duck} | {live} |"
        )
    lines += [
        "",
        "## Replay against the engine floor",
        "",
        "replay / hand-written: target at most 1.2; replay / scan-and-write floor: target at most 1.5.",
        "",
        f"Throughput: input rows per second of the exact replay, per core ({cores} cores), to read "
        'beside the peers\' published figures (bench/README.md, "Peers").',
        "",
        "| scale | query | replay s | hand-written s | floor s | DuckDB s | replay / hand-written | (min-max) | replay / floor | Spark hand-written / DuckDB | replay rows/s per core |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        duck = "duckdb" in r.times
        duck_s = f"{r.median('duckdb'):.2f}" if duck else "-"
        spread = r.ratios("replay", "handwritten")
        lines.append(
            f"| {r.scale:g}x | {r.query} | {r.median('replay'):.1f} | {r.median('handwritten'):.1f} | {r.median('floor'):.1f} | "
            f"{duck_s} | {_cell(r.ratio('replay', 'handwritten'), TARGETS['handwritten'])} | "
            f"{min(spread):.2f}-{max(spread):.2f} | "
            f"{_cell(r.ratio('replay', 'floor'), TARGETS['floor'])} | "
            f"{_cell(r.ratio('handwritten', 'duckdb')) if duck else '-'} | "
            f"{r.rows_in / r.median('replay') / cores:,.0f} |"
        )
    live = [r for r in results if r.live]
    if live:
        lines += [
            "",
            "## Replay against catching up live",
            "",
            "The live runner processes the same history from its first commit, one commit per source per "
            "micro-batch (as it ran live). Target: the replay at least 20 times faster.",
            "",
            "| scale | query | live s | micro-batches | replay s | live / replay | peak state rows | peak state KiB | driver heap after GC, max MiB | driver heap peak MiB |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in live:
            ratio = r.live["seconds"] / r.median("replay")
            lines.append(
                f"| {r.scale:g}x | {r.query} | {r.live['seconds']:.0f} | {r.live['batches']} | {r.median('replay'):.1f} | "
                f"{_cell(ratio, TARGETS['live'], at_most=False)} | {r.live['peak_state_rows']:,} | {r.live['peak_state_kib']:,} | "
                f"{r.live['peak_heap_after_gc_mib']:,} | {r.live['peak_heap_mib']:,} |"
            )
    by_query = defaultdict(dict)
    for r in results:
        by_query[r.query][r.scale] = r
    scales = sorted({r.scale for r in results})
    if len(scales) > 1:
        base = scales[0]
        lines += [
            "",
            "## Scaling",
            "",
            f"Time at each scale divided by the time at {base:g}x (linear growth: the scale ratio itself). "
            "Chart: `scaling.svg`.",
            "",
            "![scaling](scaling.svg)",
            "",
            "| query | way | " + " | ".join(f"{s:g}x" for s in scales) + " |",
            "|---|---|" + "---|" * len(scales),
        ]
        for query, at in by_query.items():
            if base not in at:
                continue
            for way in ("replay", "handwritten", "floor", "duckdb"):
                if way not in at[base].times:
                    continue
                cells = [
                    f"{at[s].median(way) / at[base].median(way):.2f}" if s in at else "-" for s in scales
                ]
                lines.append(f"| {query} | {way} | " + " | ".join(cells) + " |")
            if at[base].live:
                cells = [
                    f"{at[s].live['seconds'] / at[base].live['seconds']:.2f}"
                    if s in at and at[s].live
                    else "-"
                    for s in scales
                ]
                lines.append(f"| {query} | live | " + " | ".join(cells) + " |")
        top = scales[-1]
        lines += [
            "",
            f"Marginal cost: what the extra data of {top:g}x over {base:g}x cost the replay, divided by what it cost "
            "the hand-written query and the floor (fixed costs per run cancel out). Target: replay / hand-written "
            "at most 1.3.",
            "",
            "| query | replay extra s | hand-written extra s | floor extra s | replay / hand-written | replay / floor |",
            "|---|---|---|---|---|---|",
        ]
        for query, at in by_query.items():
            if base not in at or top not in at:
                continue
            extra = {
                way: at[top].median(way) - at[base].median(way) for way in ("replay", "handwritten", "floor")
            }
            ratio = {
                way: _cell(
                    extra["replay"] / extra[way], TARGETS["marginal"] if way == "handwritten" else None
                )
                if extra[way] > 0
                else "-"
                for way in ("handwritten", "floor")
            }
            lines.append(
                f"| {query} | {extra['replay']:.1f} | {extra['handwritten']:.1f} | {extra['floor']:.1f} | "
                f"{ratio['handwritten']} | {ratio['floor']} |"
            )
    if run.get("fixed_cost"):  # bench/fixed_cost.py's measurements
        from bench.fixed_cost import report_lines

        lines += ["", *report_lines(run["fixed_cost"])]
    slices = path.parent / "slices.md"  # `python -m bench.slices`, run by `make bench` after this report
    if slices.exists():
        lines += ["", "## " + slices.read_text().removeprefix("# ")]
    path.write_text("\n".join(lines) + "\n")
