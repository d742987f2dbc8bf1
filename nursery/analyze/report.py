"""What ``analyze`` writes: a Markdown report, every candidate as CSV, a plot of throughput
against latency (an SVG written here: no plotting library needed), the recommended
config.pbtxt beside the original (never over it) and the figures as JSON."""

from __future__ import annotations

import csv
import html
import json
import math
from pathlib import Path
from typing import Any

from nursery.analyze.search import Calibration, Goal, Load, Scored

RECOMMENDED = "config.pbtxt.recommended"


def _ms(value: float) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2f}"


def candidates_csv(path: Path, ranked: list[Scored]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["rank", "candidate", "policy", "instances", "max_batch_size",
                         "max_queue_delay_us", "preferred_batch_size", "meets", "score",
                         "over", "load", "throughput", "goodput", "p50_ms", "p99_ms",
                         "at_percentile_ms", "shed", "mean_batch"])
        for i, s in enumerate(ranked, 1):
            c = s.candidate
            for p in s.predictions:
                writer.writerow([i, c.label(), c.policy, c.instances, c.max_batch_size,
                                 c.max_queue_delay_us, c.preferred_batch_size, s.meets,
                                 f"{s.score:.3f}", f"{s.over:.4f}", p.load.label(),
                                 f"{p.throughput:.3f}", f"{p.goodput:.3f}", f"{p.p50_ms:.4f}",
                                 f"{p.p99_ms:.4f}", f"{p.at_percentile_ms:.4f}",
                                 f"{p.shed:.4f}", f"{p.mean_batch:.3f}"])


def plot_svg(path: Path, ranked: list[Scored], chosen: Scored | None, goal: Goal,
             width: int = 720, height: int = 440) -> None:
    """Throughput (x) against latency at the goal's percentile (y, log scale) of every
    candidate at its heaviest load; the chosen one ringed; the budget a dashed line."""
    points = []
    for s in ranked:
        p = s.predictions[-1]
        if math.isfinite(p.throughput) and math.isfinite(p.at_percentile_ms) and (
                p.at_percentile_ms > 0):
            points.append((p.throughput, p.at_percentile_ms, s))
    left, right, top, bottom = 70, 20, 30, 50
    w, h = width - left - right, height - top - bottom
    xs = [x for x, _, _ in points] or [0.0, 1.0]
    ys = [y for _, y, _ in points] or [1.0, 10.0]
    if goal.budget_s is not None:
        ys.append(goal.budget_s * 1e3)
    x_max = max(xs) * 1.05 or 1.0
    y_lo, y_hi = math.log10(min(ys) / 1.3), math.log10(max(ys) * 1.3)
    if y_hi - y_lo < 1e-9:
        y_hi = y_lo + 1

    def px(x: float) -> float:
        return left + w * x / x_max

    def py(y: float) -> float:
        return top + h * (1 - (math.log10(y) - y_lo) / (y_hi - y_lo))
    colours = {"fifo": "#888888", "dynamic": "#1f77b4", "latency": "#d62728"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="black"/>']
    for k in range(6):
        x = x_max * k / 5
        out.append(f'<text x="{px(x):.1f}" y="{top + h + 15}" text-anchor="middle">'
                   f'{x:.0f}</text>')
    for e in range(math.floor(y_lo), math.ceil(y_hi) + 1):
        for m in (1, 2, 5):
            y = m * 10.0 ** e
            if y_lo <= math.log10(y) <= y_hi:
                out.append(f'<line x1="{left - 4}" y1="{py(y):.1f}" x2="{left + w}" '
                           f'y2="{py(y):.1f}" stroke="#eeeeee"/>')
                out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">'
                           f'{y:g}</text>')
    if goal.budget_s is not None:
        b = goal.budget_s * 1e3
        out.append(f'<line x1="{left}" y1="{py(b):.1f}" x2="{left + w}" y2="{py(b):.1f}" '
                   f'stroke="#2ca02c" stroke-dasharray="6,4"/>')
        out.append(f'<text x="{left + w - 4}" y="{py(b) - 4:.1f}" text-anchor="end" '
                   f'fill="#2ca02c">budget {b:g} ms</text>')
    for x, y, s in points:
        colour = colours.get(s.candidate.policy, "black")
        title = html.escape(s.candidate.label())
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}" '
                   f'fill-opacity="0.6"><title>{title}</title></circle>')
        if s is chosen:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="9" fill="none" '
                       f'stroke="black" stroke-width="2"/>')
            out.append(f'<text x="{px(x) + 12:.1f}" y="{py(y) - 10:.1f}" font-weight="bold">'
                       f'chosen: {title}</text>')
    load = ranked[0].predictions[-1].load.label() if ranked else ""
    out.append(f'<text x="{left + w / 2}" y="{height - 10}" text-anchor="middle">throughput '
               f'(infer/s) at {html.escape(load)}</text>')
    out.append(f'<text x="15" y="{top + h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 15 {top + h / 2})">p{goal.percentile:g} latency (ms, '
               'log)</text>')
    for k, (name, colour) in enumerate(colours.items()):
        out.append(f'<circle cx="{left + 10 + 90 * k}" cy="{top - 12}" r="4" fill="{colour}"/>'
                   f'<text x="{left + 18 + 90 * k}" y="{top - 8}">{name}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def markdown(model: str, goal: Goal, loads: list[Load], calibration: Calibration | None,
             line: tuple[float, float] | None, ranked: list[Scored], chosen: Scored | None,
             verified: list[Scored], notes: list[str], top: int = 10,
             timings: dict[str, float] | None = None) -> str:
    out = [f"# nursery analyze: {model}", "",
           f"Goal: {goal.describe()}; loads: {', '.join(load.label() for load in loads)}; "
           f"{len(ranked)} candidates simulated.", ""]
    if timings:
        out += ["Time: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()), ""]
    out += notes + ([""] if notes else [])
    if calibration is not None:
        out += ["## Profile", "",
                "| rows | execution ms |", "|---:|---:|"]
        out += [f"| {r} | {s * 1e3:.3f} |" for r, s in calibration.cost.points]
        if line is not None:
            out += ["", f"Fitted: {line[0] * 1e3:.3f} ms per batch + {line[1] * 1e3:.4f} ms "
                    "per row."]
        out += ["", f"Server: {calibration.frontend_s * 1e3:.3f} ms of its frontend per "
                f"request + {calibration.frontend_batch_s * 1e3:.3f} ms per batch; outside "
                f"the server (network, client): {calibration.overhead}.", ""]
    out += [f"## Best {min(top, len(ranked))} of {len(ranked)} (simulated)", "",
            "| rank | candidate | meets | " + " | ".join(
                f"{load.label()}: thru/s, p{goal.percentile:g} ms" for load in loads) + " |",
            "|---:|---|---|" + "---|" * len(loads)]
    for i, s in enumerate(ranked[:top], 1):
        mark = " **(chosen)**" if s is chosen else ""
        cells = " | ".join(f"{p.throughput:.0f}, {_ms(p.at_percentile_ms)}"
                           + (f" (shed {p.shed:.0%})" if p.shed else "")
                           for p in s.predictions)
        out.append(f"| {i} | {s.candidate.label()}{mark} | {'yes' if s.meets else 'no'} | "
                   f"{cells} |")
    if verified:
        out += ["", "## Verified on the real server (perf_analyzer)", "",
                "| candidate | load | predicted thru/s | measured thru/s | predicted p50 ms | "
                "measured p50 ms | predicted p99 ms | measured p99 ms |",
                "|---|---|---:|---:|---:|---:|---:|---:|"]
        for s in verified:
            for p, m in zip(s.predictions, s.measured, strict=False):
                label = s.candidate.label() + (" **(chosen)**" if s is chosen else "")
                if "error" in m:
                    out.append(f"| {label} | {p.load.label()} | {p.throughput:.0f} | "
                               f"failed: {m['error']} | {_ms(p.p50_ms)} | - | "
                               f"{_ms(p.p99_ms)} | - |")
                else:
                    out.append(f"| {label} | {p.load.label()} | {p.throughput:.0f} | "
                               f"{m['throughput']:.0f} | {_ms(p.p50_ms)} | {_ms(m['p50_ms'])} "
                               f"| {_ms(p.p99_ms)} | {_ms(m['p99_ms'])} |")
    out += ["", "Plot: `plot.svg` (throughput against latency of every candidate at the "
            "heaviest load, the chosen one ringed). Every candidate: `candidates.csv`.", ""]
    return "\n".join(out)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def write_recommended(model_path: Path, text: str) -> Path:
    """The recommended config beside the original, never over it."""
    target = model_path / RECOMMENDED
    if target.name == "config.pbtxt":  # pragma: no cover - a guard, not a path taken
        raise ValueError("refusing to write over config.pbtxt")
    target.write_text(text)
    return target
