"""The step timeline in ``grpo-tui report``: inline SVG, no script (``timeline_view.py`` is
the terminal's).

Two figures and a table: the last steps as swimlanes (each span a bar, its phase, seconds
and step in a tooltip); every step's seconds by phase on the first trainer lane as stacked
bars (steps binned when there are many), so a run that became serial or a sync that grew
shows at a glance; and the mean seconds per step of each phase on each lane.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from grpo_trainer.records.timeline import PHASES
from grpo_trainer.records.timeline_reader import IDLE, PHASE_NAMES, Timeline
from grpo_tui.timeline_view import PHASE_COLORS as COLORS

WIDTH = 940
LANE_H, LANE_GAP, LABEL_W = 22, 6, 120
SWIMLANE_STEPS = 5
MAX_BARS = 300


def _legend() -> str:
    items = "".join(
        f'<span class=item><span class=swatch style="background:{COLORS[name]}"></span>'
        f"{html.escape(label)}</span>"
        for name, label in PHASES.items()
    )
    return f"<div class=legend>{items}</div>"


def swimlanes(timeline: Timeline, steps: list[int]) -> str:
    """The lanes over the time of ``steps``, one ``<rect>`` per span."""
    t0, t1 = timeline.span_of(steps[0], steps[-1])
    plot = WIDTH - LABEL_W - 10
    height = 30 + len(timeline.lanes) * (LANE_H + LANE_GAP) + 24

    def x(t: float) -> float:
        return LABEL_W + (t - t0) / ((t1 - t0) or 1) * plot

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="step timeline">'
    ]
    for step in steps:
        start = timeline.step_window(step)[0]
        parts.append(
            f'<line x1="{x(start):.1f}" x2="{x(start):.1f}" y1="14" y2="{height - 20}" '
            f'stroke="#bbb" stroke-dasharray="3,3"/><text x="{x(start) + 3:.1f}" y="12">'
            f"step {step}</text>"
        )
    for row, (name, lane) in enumerate(timeline.lanes.items()):
        y = 22 + row * (LANE_H + LANE_GAP)
        weight = "bold" if lane.role == "trainer" else "normal"
        parts.append(
            f'<text x="4" y="{y + LANE_H * 0.7:.1f}" style="font-weight:{weight}">'
            f"{html.escape(name)}</text>"
            f'<rect x="{LABEL_W}" y="{y}" width="{plot}" height="{LANE_H}" fill="#f6f6f6"/>'
        )
        phase, start, end = lane.window(t0, t1)
        for code, s, e in zip(phase.tolist(), start.tolist(), end.tolist(), strict=True):
            left, right = x(max(s, t0)), x(min(e, t1))
            name_ = PHASE_NAMES[code]
            parts.append(
                f'<rect x="{left:.2f}" y="{y}" width="{max(right - left, 0.6):.2f}" '
                f'height="{LANE_H}" fill="{COLORS[name_]}"><title>{PHASES[name_]} '
                f"{e - s:.3g} s</title></rect>"
            )
    parts.append(
        f'<text x="{LABEL_W}" y="{height - 4}">0 s</text>'
        f'<text x="{WIDTH - 10}" y="{height - 4}" text-anchor="end">+{t1 - t0:.3g} s</text>'
        "</svg>"
    )
    return "".join(parts)


def step_bars(timeline: Timeline, lane: str) -> str:
    """Stacked bars of ``lane``'s seconds by phase per step (means of bins of steps when
    there are more than :data:`MAX_BARS`)."""
    steps = timeline.steps()
    table = np.zeros((len(steps), len(PHASE_NAMES) + 1))
    for i, step in enumerate(steps):
        spent = timeline.breakdown(*timeline.step_window(step)).get(lane, {})
        for j, name in enumerate((*PHASE_NAMES, IDLE)):
            table[i, j] = spent.get(name, 0.0)
    bins = int(np.ceil(len(steps) / MAX_BARS))
    if bins > 1:
        cut = len(steps) // bins * bins
        table = table[:cut].reshape(-1, bins, table.shape[1]).mean(axis=1)
    plot_w, plot_h, left, top = WIDTH - 70, 200, 56, 14
    tallest = float(table.sum(axis=1).max()) or 1.0
    bar = plot_w / len(table)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{plot_h + 40}" '
        f'role="img" aria-label="seconds per step by phase">'
        f'<text x="{left}" y="10">{html.escape(lane)}: seconds per step by phase'
        f"{f' (means of {bins} steps)' if bins > 1 else ''}</text>"
    ]
    for i, row in enumerate(table):
        y = top + plot_h
        for j, seconds in enumerate(row):
            if seconds <= 0:
                continue
            h = seconds / tallest * plot_h
            y -= h
            color = COLORS[PHASE_NAMES[j]] if j < len(PHASE_NAMES) else "#e8e8e8"
            parts.append(
                f'<rect x="{left + i * bar:.2f}" y="{y:.2f}" width="{max(bar - 0.5, 0.5):.2f}" '
                f'height="{h:.2f}" fill="{color}"/>'
            )
    parts.append(
        f'<text x="{left - 6}" y="{top + 8}" text-anchor="end">{tallest:.3g} s</text>'
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end">0</text>'
        f'<text x="{left}" y="{top + plot_h + 16}">step {steps[0]}</text>'
        f'<text x="{left + plot_w}" y="{top + plot_h + 16}" text-anchor="end">'
        f"step {steps[len(table) * bins - 1]}</text></svg>"
    )
    return "".join(parts)


def mean_table(timeline: Timeline) -> str:
    """Mean seconds per step of each phase on each lane, over the whole run."""
    steps = timeline.steps()
    sums: dict[str, dict[str, float]] = {}
    for step in steps:
        for lane, spent in timeline.breakdown(*timeline.step_window(step)).items():
            for phase, seconds in spent.items():
                sums.setdefault(lane, {}).setdefault(phase, 0.0)
                sums[lane][phase] += seconds
    names = [*PHASE_NAMES, IDLE]
    head = "".join(
        f"<th>{html.escape(PHASES.get(n, n))}</th>"
        for n in names
        if any(n in s for s in sums.values())
    )
    rows = []
    for lane, spent in sums.items():
        cells = "".join(
            f"<td>{spent.get(n, 0.0) / len(steps):.3g}</td>"
            for n in names
            if any(n in s for s in sums.values())
        )
        rows.append(f"<tr><td class=id>{html.escape(lane)}</td>{cells}</tr>")
    return f"<table><tr><th class=id>lane (s per step)</th>{head}</tr>{''.join(rows)}</table>"


def timeline_section(run_dir: Path) -> str:
    """The report's timeline section ("" when the run recorded no step)."""
    timeline = Timeline(run_dir)
    timeline.poll()
    steps = timeline.steps()
    if not steps:
        return ""
    trainer = next(name for name, lane in timeline.lanes.items() if lane.role == "trainer")
    last = steps[-SWIMLANE_STEPS:]
    return (
        f"<h2>Step timeline</h2><div class=meta>{len(steps)} steps, "
        f"{len(timeline.lanes)} lanes; the last {len(last)} steps:</div>"
        f'<div class="chart timeline">{swimlanes(timeline, last)}</div>{_legend()}'
        f'<div class="chart timeline">{step_bars(timeline, trainer)}</div>'
        f"{mean_table(timeline)}"
    )
