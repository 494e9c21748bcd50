"""The step timeline drawn as text: one row of cells per lane over a time window, a row of
step marks, and where a step's time went (``grpo_trainer/records/timeline_reader.py``).

No textual: the timeline screen and the benchmark use it. Each cell shows the phase that
covered most of its slice of time (``█`` at least three quarters covered, ``▌`` a quarter,
``▏`` less), so a short phase (a 20 ms sync in a 2 s step) still shows as a sliver. The
cover of every cell is summed with one ``bincount`` per lane, whatever the number of spans:
a thousand steps of eight processes redraw as fast as five steps.
"""

from __future__ import annotations

import math

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from grpo_trainer.records.timeline import PHASES
from grpo_trainer.records.timeline_reader import IDLE, PHASE_NAMES, Lane, Timeline

PHASE_COLORS: dict[str, str] = {
    "generate": "#2ca02c",
    "room": "#8c8c8c",
    "wait": "#5a5a5a",
    "sleep": "#1f77b4",
    "forward_backward": "#9467bd",
    "pause": "#e6c619",
    "optimizer": "#17becf",
    "resume": "#ff7f0e",
    "transfer": "#d62728",
    "finish": "#e377c2",
    "wake": "#6fa8ff",
}
"""One colour per phase, the same in the terminal and in the report's SVG."""
LABEL = 14
"""Columns for the lane names."""


def cover(lane: Lane, t0: float, t1: float, width: int) -> np.ndarray:
    """``[phases, width]``: the fraction of each cell's time each phase covered."""
    phase, start, end = lane.window(t0, t1)
    cells = np.zeros((len(PHASE_NAMES), width + 1))
    if not len(phase) or width <= 0 or t1 <= t0:
        return cells[:, :width]
    scale = width / (t1 - t0)
    s = np.clip((start - t0) * scale, 0, width)
    e = np.clip((end - t0) * scale, 0, width)
    c0 = np.minimum(np.floor(s).astype(int), width - 1)
    c1 = np.minimum(np.floor(e).astype(int), width)
    size = width + 1
    base = phase.astype(int) * size
    one = c0 == c1
    weights = np.zeros(len(PHASE_NAMES) * size)
    weights += np.bincount(base[one] + c0[one], (e - s)[one], minlength=len(PHASE_NAMES) * size)
    many = ~one
    weights += np.bincount(
        base[many] + c0[many], (c0[many] + 1 - s[many]), minlength=len(PHASE_NAMES) * size
    )
    weights += np.bincount(
        base[many] + c1[many], (e[many] - c1[many]), minlength=len(PHASE_NAMES) * size
    )
    full = np.bincount(base[many] + c0[many] + 1, minlength=len(PHASE_NAMES) * size + 1)[:-1]
    full -= np.bincount(base[many] + c1[many], minlength=len(PHASE_NAMES) * size)
    cells = (weights + np.cumsum(full.reshape(-1, size), axis=1).ravel()).reshape(-1, size)
    return cells[:, :width]


def lane_text(lane: Lane, t0: float, t1: float, width: int) -> Text:
    """One lane's cells: the most-covering phase of each, shaded by how covered it is."""
    covered = cover(lane, t0, t1, width)
    best = covered.argmax(axis=0)
    total = np.minimum(covered.sum(axis=0), 1.0)
    text = Text(no_wrap=True)
    run_char, run_style, run = "", "", 0
    for cell in range(width):
        amount = total[cell]
        char = "█" if amount >= 0.75 else "▌" if amount >= 0.25 else "▏" if amount > 0 else " "
        style = PHASE_COLORS[PHASE_NAMES[best[cell]]] if amount > 0 else ""
        if (char, style) != (run_char, run_style) and run:
            text.append(run_char * run, run_style)
            run = 0
        run_char, run_style = char, style
        run += 1
    if run:
        text.append(run_char * run, run_style)
    return text


def step_marks(
    timeline: Timeline, steps: list[int], t0: float, t1: float, width: int, selected: int | None
) -> Text:
    """``▏12`` where each step starts (the selected step in bold), as room allows."""
    marks = [" "] * width
    styles = [""] * width
    last_end = -1
    for step in steps:
        start = timeline.step_window(step)[0]
        cell = int((start - t0) / (t1 - t0) * width) if t1 > t0 else 0
        label = f"▏{step}"
        if cell <= last_end or cell >= width:
            continue
        for i, char in enumerate(label[: width - cell]):
            marks[cell + i] = char
            styles[cell + i] = "bold reverse" if step == selected else "dim"
        last_end = cell + len(label)
    text = Text(no_wrap=True)
    for char, style in zip(marks, styles, strict=True):
        text.append(char, style)
    return text


def chart(timeline: Timeline, steps: list[int], width: int, selected: int | None) -> RenderableType:
    """The lanes of the steps ``steps`` (consecutive) over their time, with step marks and
    a time axis."""
    cells = max(10, width - LABEL)
    t0, t1 = timeline.span_of(steps[0], steps[-1])
    rows = [Text.assemble(Text(" " * LABEL), step_marks(timeline, steps, t0, t1, cells, selected))]
    for name, lane in timeline.lanes.items():
        label = Text(name[: LABEL - 1].ljust(LABEL), style="bold" if lane.role == "trainer" else "")
        rows.append(Text.assemble(label, lane_text(lane, t0, t1, cells)))
    span = t1 - t0
    axis = Text(" " * LABEL + f"0 s{f'+{span:.3g} s':>{cells - 3}}", style="dim", no_wrap=True)
    rows.append(axis)
    return Group(*rows)


def legend() -> Text:
    text = Text(no_wrap=False)
    for name, label in PHASES.items():
        text.append("██", PHASE_COLORS[name])
        text.append(f" {label}  ")
    return text


def breakdown_table(timeline: Timeline, step: int) -> Table:
    """Where step ``step``'s time went on each lane: seconds and share of each phase, idle."""
    t0, t1 = timeline.step_window(step)
    spent = timeline.breakdown(t0, t1)
    table = Table(box=None, padding=(0, 1), show_edge=False, expand=True)
    table.add_column(f"step {step}: {t1 - t0:.3g} s", no_wrap=True, style="bold")
    table.add_column("where the time went", ratio=1)
    for name, phases in spent.items():
        parts = Text()
        ordered = sorted(phases.items(), key=lambda kv: (kv[0] == IDLE, -kv[1]))
        for phase, seconds in ordered:
            if seconds < 5e-4 and phase != IDLE:
                continue
            share = seconds / (t1 - t0) if t1 > t0 else math.nan
            label = "idle" if phase == IDLE else PHASES[phase]
            style = "dim" if phase == IDLE else PHASE_COLORS[phase]
            parts.append(f"{label} {seconds:.3g}s {share:.0%}", style)
            parts.append("  ")
        table.add_row(name, parts)
    return table
