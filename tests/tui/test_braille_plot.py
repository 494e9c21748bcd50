"""The braille plot under the dashboard's charts (``grpo_tui/widgets/braille_plot.py``): where
the dots of a line go, which line owns a shared cell, and the axes' labels."""

from __future__ import annotations

import numpy as np

from grpo_tui.widgets.braille_plot import BRAILLE, Y_LABELS, Line, chart_rows, dots, plot_rows
from grpo_tui.widgets.metric_chart import StepAxisFormatter, ValueAxisFormatter


def test_a_segment_sets_a_dot_in_every_row_and_column_it_crosses() -> None:
    line = Line(np.array([0.0, 1.0]), np.array([0.0, 1.0]), "cyan")
    rows, cols = dots(line, (0.0, 1.0), (0.0, 1.0), (8, 16))
    assert sorted(set(cols.tolist())) == list(range(8))
    assert sorted(set(rows.tolist())) == list(range(16)), "no gap in a steep segment"
    drawn = set(zip(rows.tolist(), cols.tolist(), strict=True))
    assert (15, 0) in drawn and (0, 7) in drawn, "y grows upwards: row 0 is the top"


def test_points_off_the_chart_and_not_finite_are_left_out() -> None:
    line = Line(np.array([0.0, 0.5, 1.0]), np.array([np.nan, 0.5, 9.0]), "cyan")
    rows, cols = dots(line, (0.0, 1.0), (0.0, 1.0), (8, 16))
    assert len(rows) and (rows >= 0).all() and (rows < 16).all()
    assert (cols >= 4).all(), "the segment from the NaN point is not drawn"


def test_a_flat_line_fills_one_row_and_the_last_line_drawn_owns_the_cell() -> None:
    low = Line(np.array([0.0, 1.0]), np.array([0.0, 0.0]), "red")
    high = Line(np.array([0.0, 1.0]), np.array([1.0, 1.0]), "green")
    over = Line(np.array([0.0, 1.0]), np.array([1.0, 1.0]), "blue")
    rows = plot_rows([low, high, over], (0.0, 1.0), (0.0, 1.0), width=5, height=3)
    assert [len(r.plain) for r in rows] == [5, 5, 5]
    assert all(BRAILLE < ord(c) <= BRAILLE + 0xFF for c in rows[0].plain + rows[2].plain)
    assert rows[1].plain.strip() == ""
    assert {str(span.style) for span in rows[0].spans} == {"blue"}
    assert {str(span.style) for span in rows[2].spans} == {"red"}


def test_the_axes_label_steps_and_values_inside_the_size() -> None:
    line = Line(np.arange(1.0, 41.0), np.linspace(0.1, 0.5, 40), "cyan")
    out = chart_rows(
        [line], (0.0, 41.0), (0.0, 0.55), (40, 9), StepAxisFormatter(), ValueAxisFormatter()
    )
    assert len(out) == 9 and all(len(row.plain) <= 40 for row in out)
    steps = [int(label) for label in out[-1].plain.split()]
    assert steps == sorted(steps) and steps[0] >= 0 and steps[-1] <= 41 and len(steps) >= 2
    values = [float(row.plain[:Y_LABELS]) for row in out[:-2] if row.plain[:Y_LABELS].strip()]
    assert values == sorted(values, reverse=True) and len(values) >= 2
