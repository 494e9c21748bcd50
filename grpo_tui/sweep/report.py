"""``grpo-tui report``: one self-contained HTML file with a sweep's (or a run's) curves and table.

The curves are inline SVG drawn here (no JavaScript, no fonts or scripts fetched), so the
file opens anywhere, offline, and can be attached to an issue or a mail as it is.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from grpo_tui.sweep.results import (
    CURVE_METRICS,
    EVAL_PREFIX,
    REWARD_WINDOW,
    RunResults,
    Summary,
    SweepResults,
)
from grpo_tui.sweep.store import SweepDir
from grpo_tui.timeline_svg import timeline_section

COLORS = (
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
    "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
)  # fmt: skip
WIDTH, HEIGHT = 460, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 28, 34

Series = Mapping[str, Sequence[tuple[float, float]]]

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
.meta { color: #666; margin-bottom: 16px; }
table { border-collapse: collapse; margin-bottom: 20px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f4f4f4; } td.id, th.id { text-align: left; font-family: monospace; }
td.best { font-weight: bold; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.chart { border: 1px solid #ddd; padding: 4px; }
svg text { font: 11px sans-serif; fill: #444; }
h2 { font-size: 16px; margin: 24px 0 4px; }
.legend { margin: 4px 0 12px; } .legend .item { margin-right: 14px; white-space: nowrap; }
.chart.timeline { margin-bottom: 8px; }
"""


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (1, 2 or 5 times a power of ten) covering the range."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    start = math.floor(low / step) * step
    ticks = []
    value = start
    while value <= high + step * 0.5:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def svg_chart(title: str, series: Series, colors: Mapping[str, str], x_label: str) -> str:
    """A line chart of every series (same axes), with ticks, grid and the title on top."""
    points = [p for values in series.values() for p in values]
    xs = nice_ticks(min(p[0] for p in points), max(p[0] for p in points))
    ys = nice_ticks(min(p[1] for p in points), max(p[1] for p in points))
    x0, x1, y0, y1 = xs[0], xs[-1], ys[0], ys[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / ((x1 - x0) or 1) * plot_w

    def sy(y: float) -> float:
        return TOP + plot_h - (y - y0) / ((y1 - y0) or 1) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{LEFT}" y="16" style="font-weight:bold;font-size:13px">'
        f"{html.escape(title)}</text>",
    ]
    for y in ys:
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
            'stroke="#e5e5e5"/>'
            f'<text x="{LEFT - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{_fmt(y)}</text>'
        )
    for x in xs:
        parts.append(
            f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{TOP}" y2="{TOP + plot_h}" '
            'stroke="#f0f0f0"/>'
            f'<text x="{sx(x):.1f}" y="{TOP + plot_h + 14}" text-anchor="middle">{_fmt(x)}</text>'
        )
    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#999"/>'
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 4}" text-anchor="middle">'
        f"{html.escape(x_label)}</text>"
    )
    for name, values in series.items():
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in values)
        color = colors[name]
        if len(values) == 1:
            x, y = values[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>')
        else:
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.6">'
                f"<title>{html.escape(name)}</title></polyline>"
            )
    parts.append("</svg>")
    return "".join(parts)


def _cell(value: float | int | None, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(rows: Sequence[Summary], keys: Sequence[str], colors: Mapping[str, str]) -> str:
    rewards = [r.reward for r in rows if r.reward is not None]
    best = max(rewards) if rewards else None
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    eval_head = next((r.eval_name for r in rows if r.eval_name), f"{EVAL_PREFIX}k")
    out = [
        "<table><tr><th class=id>cell</th>"
        f"{head}<th>state</th><th>step</th><th>reward ({REWARD_WINDOW}-step)</th>"
        f"<th>{html.escape(eval_head)}</th><th>KL</th><th>time to threshold</th>"
        "<th>elapsed</th></tr>"
    ]
    for row in rows:
        step = _cell(row.step, "{:d}")
        if row.total_steps:
            step += f"/{row.total_steps}"
        reached = "-"
        if row.threshold_s is not None:
            reached = f"{row.threshold_s:.0f} s (step {row.threshold_step})"
        klass = ' class="best"' if best is not None and row.reward == best else ""
        values = "".join(f"<td>{html.escape(str(row.overrides.get(k, '')))}</td>" for k in keys)
        out.append(
            f'<tr><td class=id><span class=swatch style="background:{colors[row.id]}"></span>'
            f"{html.escape(row.id)}</td>{values}<td>{html.escape(str(row.state))}</td>"
            f"<td>{step}</td><td{klass}>{_cell(row.reward)}</td><td>{_cell(row.eval_value)}</td>"
            f"<td>{_cell(row.kl, '{:.4f}')}</td><td>{reached}</td>"
            f"<td>{_cell(row.elapsed_s, '{:.0f} s')}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _xy(points: Sequence[tuple[float, int | None, float]], t0: float) -> list[tuple[float, float]]:
    """Points by step (time since start for metrics without one)."""
    return [(float(step) if step is not None else t - t0, v) for t, step, v in points]


def render(
    title: str,
    meta: str,
    rows: Sequence[Summary],
    curves: Mapping[str, Mapping[str, Sequence[tuple[float, int | None, float]]]],
    keys: Sequence[str],
    extra: str = "",
) -> str:
    """The whole HTML document (``extra``: sections after the curves)."""
    colors = {row.id: COLORS[i % len(COLORS)] for i, row in enumerate(rows)}
    charts = []
    for metric, per_cell in curves.items():
        if not per_cell:
            continue
        series = {}
        for cell_id, points in per_cell.items():
            t0 = next((r.started_at for r in rows if r.id == cell_id), None) or points[0][0]
            series[cell_id] = _xy(points, t0)
        label = f"{metric}k (largest k)" if metric == EVAL_PREFIX else metric
        charts.append(f'<div class="chart">{svg_chart(label, series, colors, "step")}</div>')
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><div class=meta>{meta}</div>"
        f"{_table(rows, keys, colors)}<div class=charts>{''.join(charts)}</div>{extra}"
        "</body></html>\n"
    )


def write_report(target: Path, output: Path, *, threshold: float) -> Path:
    """Write the report of a sweep or run directory to ``output``; ``ValueError`` if neither."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    extra = ""
    if SweepDir.is_sweep(target):
        results = SweepResults(SweepDir(target))
        results.poll(threshold)
        record = results.record
        rows = results.summaries(now)
        curves = {m: results.curves(m) for m in results.metrics()}
        keys = [axis.key for axis in record.axes]
        done = sum(1 for r in rows if r.state == "done")
        meta = (
            f"sweep of {html.escape(record.profile)} · {len(rows)} cells "
            f"({'zipped' if record.zip else 'grid'}), {done} done · threshold {threshold:g} "
            f"({REWARD_WINDOW}-step mean of reward/mean, time from the cell's start) · {stamp}"
        )
        title = f"Sweep {target.resolve().name}"
    elif (target / "metrics.jsonl").is_file() or (target / "events.jsonl").is_file():
        run = RunResults(target)
        run.poll(threshold)
        rows = [run.summary(target.resolve().name, {}, None, now)]
        names = run.store.names()
        curves = {}
        for metric in CURVE_METRICS:
            name = run.eval_metric()[0] if metric == EVAL_PREFIX else metric
            if name in names:
                curves[metric] = {rows[0].id: run.store.series(name)}
        keys = []
        meta = f"run {html.escape(str(target.resolve()))} · threshold {threshold:g} · {stamp}"
        title = f"Run {target.resolve().name}"
        extra = timeline_section(target)
    else:
        raise ValueError(f"{target}: neither a sweep directory nor a run directory")
    output.write_text(render(title, meta, rows, curves, keys, extra), encoding="utf-8")
    return output
