"""The sweep comparison: one row per cell, sortable, and one metric's curves overlaid.

Drawn from the sweep directory on a timer (:class:`SweepResults` reads the journal and
whatever the cells' ``metrics.jsonl`` appended), so a live sweep and ``grpo-tui view
SWEEP_DIR`` show the same thing. ``s`` sorts by the next column (``S`` reverses), a click on
a header sorts by it; ``m`` shows the next metric's curves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Static

from grpo_tui.run_state import SeriesStore
from grpo_tui.sweep.results import EVAL_PREFIX, REWARD, REWARD_WINDOW, Summary, SweepResults
from grpo_tui.widgets.metric_chart import PALETTE, ChartSpec, MetricChart

REFRESH_PERIOD = 1.0

STATE_STYLES = {
    "done": "green",
    "running": "cyan",
    "queued": "dim",
    "pending": "dim",
    "detached": "magenta",
    "failed": "bold red",
    "interrupted": "yellow",
}


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


class SweepScreen(Screen[None]):
    """The comparison table and the overlaid curves of a sweep directory."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "sort_next", "Sort", id="sweep-sort"),
        Binding("S", "sort_reverse", "Reverse", id="sweep-sort-reverse"),
        Binding("m", "next_metric", "Metric", id="sweep-metric"),
    ]

    def __init__(
        self,
        results: SweepResults,
        *,
        threshold: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.results = results
        self.threshold = threshold
        self.clock = clock
        self.keys = [axis.key for axis in results.record.axes]
        self.columns: list[tuple[str, Callable[[Summary], Any]]] = [
            ("cell", lambda s: s.id),
            *[(key.rsplit(".", 1)[-1], self._override(key)) for key in self.keys],
            ("state", lambda s: s.state),
            ("step", lambda s: s.step),
            (f"reward({REWARD_WINDOW})", lambda s: s.reward),
            ("eval mean@k", lambda s: s.eval_value),
            ("KL", lambda s: s.kl),
            (f"t→{threshold:g}", lambda s: s.threshold_s),
            ("elapsed", lambda s: s.elapsed_s),
        ]
        ids = [cell.id for cell in results.record.cells]  # coloured as on the chart
        self.cell_colors = {cell: PALETTE[i % len(PALETTE)] for i, cell in enumerate(ids)}
        self.sort_column = 0
        self.sort_reverse = False
        self.metric = REWARD
        self.status_line = ""

    @staticmethod
    def _override(key: str) -> Callable[[Summary], Any]:
        return lambda s: s.overrides.get(key)

    def compose(self) -> ComposeResult:
        yield Static(id="sweep-header")
        yield DataTable(id="sweep-table", cursor_type="row", zebra_stripes=True)
        yield MetricChart(self._spec(), t0=0.0)
        yield Static("[b]s[/] sort  [b]S[/] reverse  [b]m[/] metric  [b]q[/] quit", id="sweep-keys")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for label, _ in self.columns:
            table.add_column(label, key=label)
        self.refresh_data()
        self.set_interval(REFRESH_PERIOD, self.refresh_data)

    def _spec(self) -> ChartSpec:
        ids = tuple(cell.id for cell in self.results.record.cells)
        title = f"{self.metric}k" if self.metric == EVAL_PREFIX else self.metric
        return ChartSpec("sweep", f"{title} by step", names=ids)

    def refresh_data(self) -> None:
        """Re-read the sweep directory and redraw the header, the table and the chart."""
        self.results.poll(self.threshold)
        self.summaries = self.results.summaries(self.clock())
        self._draw_header()
        self._draw_table()
        self._draw_chart()

    def sorted_summaries(self) -> list[Summary]:
        """The rows in the chosen order; cells without a value always come last."""
        key = self.columns[self.sort_column][1]

        def order(summary: Summary) -> tuple[int, Any]:
            value = key(summary)
            missing = value is None or (isinstance(value, float) and math.isnan(value))
            return (1, 0) if missing else (0, value)

        present = [s for s in self.summaries if order(s)[0] == 0]
        absent = [s for s in self.summaries if order(s)[0] == 1]
        try:
            present.sort(key=order, reverse=self.sort_reverse)
        except TypeError:  # mixed value types in one override column: compare as text
            present.sort(key=lambda s: str(key(s)), reverse=self.sort_reverse)
        return present + absent

    def _draw_header(self) -> None:
        counts: dict[str, int] = {}
        for summary in self.summaries:
            counts[str(summary.state)] = counts.get(str(summary.state), 0) + 1
        states = "  ".join(
            f"[{STATE_STYLES.get(state, '')}]{state} {count}[/]" for state, count in counts.items()
        )
        label, _ = self.columns[self.sort_column]
        arrow = "↓" if self.sort_reverse else "↑"
        self.query_one("#sweep-header", Static).update(
            f"[b]sweep[/b] {self.results.sweep.path.name}  ·  {states}  ·  "
            f"sorted by {label} {arrow}  ·  threshold {self.threshold:g}"
            + (f"  ·  {self.status_line}" if self.status_line else "")
        )

    def _draw_table(self) -> None:
        table = self.query_one(DataTable)
        selected = None
        if table.row_count and table.cursor_row < table.row_count:
            selected = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        table.clear()
        for summary in self.sorted_summaries():
            style = STATE_STYLES.get(str(summary.state), "")
            job = f" [dim]job {summary.job}[/]" if summary.job else ""
            step = _number(summary.step, "{:d}")
            if summary.total_steps:
                step += f"/{summary.total_steps}"
            reached = "-"
            if summary.threshold_s is not None:
                reached = f"{summary.threshold_s:.0f}s@{summary.threshold_step}"
            table.add_row(
                f"[{self.cell_colors[summary.id]}]{summary.id}[/]",
                *[str(summary.overrides.get(key, "")) for key in self.keys],
                f"[{style}]{summary.state}[/]{job}",
                step,
                _number(summary.reward, "{:.3f}"),
                _number(summary.eval_value, "{:.3f}"),
                _number(summary.kl, "{:.4f}"),
                reached,
                _number(summary.elapsed_s, "{:.0f}s"),
                key=summary.id,
            )
        if selected is not None and selected in {s.id for s in self.summaries}:
            table.move_cursor(row=table.get_row_index(selected))

    def _draw_chart(self) -> None:
        store = SeriesStore(max_points=100_000)
        starts = {s.id: s.started_at for s in self.summaries}
        for cell_id, points in self.results.curves(self.metric).items():
            t0 = starts.get(cell_id) or points[0][0]
            for t, step, value in points:
                store.add(cell_id, t - t0, step, value)
        self.query_one(MetricChart).redraw(store)

    def row_ids(self) -> list[str]:
        """The cell ids in the table's current order (for tests and the status line)."""
        table = self.query_one(DataTable)
        return [
            str(table.coordinate_to_cell_key((i, 0)).row_key.value) for i in range(table.row_count)
        ]

    def action_sort_next(self) -> None:
        self.sort_column = (self.sort_column + 1) % len(self.columns)
        self.refresh_data()

    def action_sort_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self.refresh_data()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if event.column_index == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column, self.sort_reverse = event.column_index, False
        self.refresh_data()

    def action_next_metric(self) -> None:
        metrics = self.results.metrics() or [REWARD]
        index = metrics.index(self.metric) + 1 if self.metric in metrics else 0
        self.metric = metrics[index % len(metrics)]
        self.query_one(MetricChart).show_spec(self._spec())
        self._draw_chart()
