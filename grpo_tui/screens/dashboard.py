"""The dashboard: header, process and GPU tables, chart grid and the supervisor's event tail.

Everything here is drawn from the app's :class:`RunState` on timers, never per event: the
event tail at ~12 Hz, and every 1/8 s three charts in turn (the first three with the
header and table), so everything is redrawn twice a second but no single frame redraws
all twelve charts (a frame that does blocks the keys pressed meanwhile). Nothing is drawn
while another screen is on top: Textual keeps the screen under a pushed one "current",
and drawing there would only leave charts to re-render on the key press that comes back.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid
from textual.screen import Screen

from grpo_tui.run_state import SUPERVISOR_LOG
from grpo_tui.screens.host import DashboardHost
from grpo_tui.widgets.gpu_table import GpuTable
from grpo_tui.widgets.key_bar import KeyBar
from grpo_tui.widgets.log_pane import LogPane
from grpo_tui.widgets.metric_chart import DASHBOARD_CHARTS, MetricChart
from grpo_tui.widgets.process_table import ProcessTable
from grpo_tui.widgets.run_header import RunHeader

REDRAW_PERIOD = 0.5
CHARTS_PER_TICK = 3
"""Charts redrawn together: a row of the grid per frame (one per frame costs ~4 % more CPU in
per-frame overhead, all of them in one frame block keys for ~25-50 ms)."""
LOG_FLUSH_PERIOD = 0.08


class DashboardScreen(Screen[None]):
    """The main screen of a live run (and, read-only, of a finished one)."""

    app: DashboardHost

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "pagedown",
            "scroll_charts(1)",
            "Charts down",
            show=False,
            priority=True,
            id="charts-down",
        ),
        Binding(
            "pageup", "scroll_charts(-1)", "Charts up", show=False, priority=True, id="charts-up"
        ),
    ]

    def compose(self) -> ComposeResult:
        state = self.app.state
        yield RunHeader(id="header")
        yield ProcessTable(id="processes")
        yield GpuTable(id="gpus")
        with Grid(id="charts"):
            for spec in DASHBOARD_CHARTS:
                yield MetricChart(spec, t0=state.started_at or 0.0)
        yield LogPane(SUPERVISOR_LOG, state.logs[SUPERVISOR_LOG], max_lines=500)
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one(LogPane).border_title = "events"
        self._charts = list(self.query(MetricChart))
        self._grid = self.query_one("#charts", Grid)
        self._next_chart = 0
        self.redraw()
        self.flush_events()
        for chart in self._charts:
            self._redraw_chart(chart, hidden_too=True)
        rows = len(self._charts) / CHARTS_PER_TICK
        self.set_interval(REDRAW_PERIOD / rows, self.redraw_next_charts)
        self.set_interval(LOG_FLUSH_PERIOD, self.flush_events)

    def flush_events(self) -> None:
        if self.is_active:
            self.query_one(LogPane).flush()

    def redraw(self) -> None:
        """Draw the latest snapshot: header, table, alert highlights."""
        if not self.is_active:
            return
        app = self.app
        state, now = app.state, app.clock()
        self.query_one(RunHeader).show(state, now, read_only=app.read_only)
        self.query_one(ProcessTable).show(
            list(state.processes.values()), now, state.served_weights()
        )
        self.query_one(GpuTable).show(state.gpus)
        alerted = {alert.chart for alert in app.check_alerts() if alert.chart}
        for chart in self._charts:
            chart.set_class(chart.spec.id in alerted, "-alert")

    def redraw_next_charts(self) -> None:
        """Redraw the next :data:`CHARTS_PER_TICK` charts in turn (those whose data changed).

        With the first row comes the header, table and alerts: one frame for both, not two.
        """
        if self.is_active:
            if self._next_chart == 0:
                self.redraw()
            for _ in range(CHARTS_PER_TICK):
                self._redraw_chart(self._charts[self._next_chart])
                self._next_chart = (self._next_chart + 1) % len(self._charts)

    def _redraw_chart(self, chart: MetricChart, *, hidden_too: bool = False) -> None:
        """Redraw ``chart`` if its data changed, and (unless ``hidden_too``) only if it is in
        view: at 100x30 eight of the twelve are scrolled out, and drawing them cost a third
        of a redraw. One scrolled into view is drawn by the next turn (or the scroll key)."""
        if not (hidden_too or chart.region.overlaps(self._grid.region)):
            return
        state = self.app.state
        if chart.spec.x == "time":
            chart.t0 = state.started_at or 0.0
        chart.redraw(state.metrics)

    @property
    def selected_process(self) -> str | None:
        return self.query_one(ProcessTable).selected

    def action_scroll_charts(self, pages: int) -> None:
        """Scroll the chart grid a page (where it does not fit: short or narrow terminals),
        and draw the charts it brings into view."""
        grid = self._grid
        grid.scroll_to(
            y=grid.scroll_y + pages * grid.scrollable_content_region.height, animate=False
        )
        self.call_after_refresh(self._draw_charts_in_view)

    def _draw_charts_in_view(self) -> None:
        for chart in self._charts:
            self._redraw_chart(chart)
