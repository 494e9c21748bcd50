"""A line plot drawn as text: braille dots (2x4 per cell) for the lines, a left axis with
value labels and a bottom axis with step or time labels. No textual here: it returns the
rows as rich ``Text``, which one widget shows.

Why not a library: with textual-plot (each chart four canvas widgets whose cells each
carry their own style) a dashboard redraw at 100x30 over 1,000 steps cost 99 ms of CPU, for
a target of 30 ms; plotext (through textual-plotext, not installed) builds one 45x9 chart in
4.3 ms with the ANSI re-parse. Here the dots of every series are set with a few numpy
operations (each segment sampled at every dot it crosses), and each row is a handful of
style runs: 0.7 ms a chart, a redraw 26 ms (``benchmarks/results/tui_views.md``). The ticks
are textual-plot's (``NumericAxisFormatter``: intervals of 1, 2, 5 and 10).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual_plot import NumericAxisFormatter

Y_LABELS = 6
"""Columns for the value labels (the axis line is one more)."""
BRAILLE = 0x2800
BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.uint8)
"""The dot of each (row, column) inside a braille cell of 4 rows and 2 columns."""


@dataclass(frozen=True)
class Line:
    """One series to draw: x and y values, in order, and the rich style of its dots."""

    xs: np.ndarray
    ys: np.ndarray
    style: str


def dots(
    line: Line, x_range: tuple[float, float], y_range: tuple[float, float], size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The (row, column) of every dot the line's segments cross on a ``size`` (width,
    height) grid of dots, row 0 at the top."""
    width, height = size
    (x0, x1), (y0, y1) = x_range, y_range
    px = (line.xs - x0) / ((x1 - x0) or 1.0) * (width - 1)
    py = (y1 - line.ys) / ((y1 - y0) or 1.0) * (height - 1)
    keep = np.isfinite(px) & np.isfinite(py)
    px, py = px[keep], py[keep]
    if len(px) == 1:
        return np.rint(py).astype(int), np.rint(px).astype(int)
    if not len(px):
        return np.zeros(0, int), np.zeros(0, int)
    dx, dy = np.diff(px), np.diff(py)
    steps = np.ceil(np.maximum(np.abs(dx), np.abs(dy))).astype(int) + 1
    segment = np.repeat(np.arange(len(steps)), steps)
    offset = np.arange(len(segment)) - np.repeat(np.cumsum(steps) - steps, steps)
    fraction = offset / np.maximum(steps - 1, 1)[segment]
    cols = np.rint(px[:-1][segment] + dx[segment] * fraction).astype(int)
    rows = np.rint(py[:-1][segment] + dy[segment] * fraction).astype(int)
    inside = (cols >= 0) & (cols < width) & (rows >= 0) & (rows < height)
    return rows[inside], cols[inside]


def plot_rows(
    lines: Sequence[Line],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    width: int,
    height: int,
) -> list[Text]:
    """``height`` rows of ``width`` braille cells; a cell takes the style of the last line
    drawn through it."""
    code = np.zeros((height, width), dtype=np.uint8)
    owner = np.full((height, width), -1, dtype=np.int16)
    for index, line in enumerate(lines):
        rows, cols = dots(line, x_range, y_range, (2 * width, 4 * height))
        np.bitwise_or.at(code, (rows // 4, cols // 2), BITS[rows % 4, cols % 2])
        owner[rows // 4, cols // 2] = index
    styles = [line.style for line in lines]
    out = []
    for r in range(height):
        text = Text(no_wrap=True)
        chars = "".join(chr(BRAILLE + c) if c else " " for c in code[r].tolist())
        runs = owner[r]
        start = 0
        for c in range(1, width + 1):
            if c == width or runs[c] != runs[start]:
                who = int(runs[start])
                text.append(chars[start:c], styles[who] if who >= 0 else "")
                start = c
        out.append(text)
    return out


def ticks(
    formatter: NumericAxisFormatter, low: float, high: float, room: int
) -> list[tuple[float, str]]:
    """Tick values within ``[low, high]`` and their labels, at most ``room`` of them."""
    values = [t for t in formatter.get_ticks(low, high, max_ticks=max(2, room)) if low <= t <= high]
    while len(values) > max(2, room):
        values = values[::2]
    return list(zip(values, formatter.get_labels_for_ticks(values), strict=True))


def chart_rows(
    lines: Sequence[Line],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    size: tuple[int, int],
    x_format: NumericAxisFormatter,
    y_format: NumericAxisFormatter,
) -> list[Text]:
    """The whole chart in ``size`` (width, height) cells: value labels and the plot, then
    the bottom axis and its labels (the last two rows)."""
    width, height = size
    plot_w, plot_h = width - Y_LABELS - 1, height - 2
    if plot_w < 4 or plot_h < 1:
        return [Text("")] * max(0, height)
    rows = plot_rows(lines, x_range, y_range, plot_w, plot_h)
    (y0, y1), (x0, x1) = y_range, x_range
    labels: dict[int, str] = {}
    for value, label in ticks(y_format, y0, y1, max(2, plot_h // 2 + 1)):
        row = round((y1 - value) / ((y1 - y0) or 1.0) * (4 * plot_h - 1)) // 4
        labels.setdefault(row, label)
    out = []
    for r, row in enumerate(rows):
        label = labels.get(r)
        margin = Text(f"{label[-Y_LABELS:] if label else '':>{Y_LABELS}}", style="dim")
        margin.append("┤" if label is not None else "│", style="dim")
        out.append(Text.assemble(margin, row))
    axis = ["─"] * plot_w
    under = [" "] * plot_w
    last_end = -1
    for value, label in ticks(x_format, x0, x1, max(2, plot_w // 8)):
        col = round((value - x0) / ((x1 - x0) or 1.0) * (2 * plot_w - 1)) // 2
        axis[col] = "┬"
        start = min(max(0, col - len(label) // 2), plot_w - len(label))
        if start > last_end and start >= 0:
            under[start : start + len(label)] = label
            last_end = start + len(label)
    out.append(Text(" " * Y_LABELS + "└" + "".join(axis), style="dim", no_wrap=True))
    out.append(Text(" " * (Y_LABELS + 1) + "".join(under), style="dim", no_wrap=True))
    return out
