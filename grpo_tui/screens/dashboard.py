"""The dashboard: header, process table, chart grid and the supervisor's event tail.

Everything here is drawn from the app's :class:`RunState` on timers (2 Hz for the table,
header and charts; ~12 Hz for the event tail), never per event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Grid
from textual.screen import Screen
from textual.widgets import Footer

from grpo_tui.run_state import SUPERVISOR_LOG
from grpo_tui.widgets.log_pane import LogPane
from grpo_tui.widgets.metric_chart import DASHBOARD_CHARTS, MetricChart
from grpo_tui.widgets.process_table import ProcessTable
from grpo_tui.widgets.run_header import RunHeader

if TYPE_CHECKING:
    from grpo_tui.app import GrpoTuiApp

REDRAW_PERIOD = 0.5
LOG_FLUSH_PERIOD = 0.08


class DashboardScreen(Screen[None]):
    """The main screen of a live run (and, read-only, of a finished one)."""

    app: GrpoTuiApp

    def compose(self) -> ComposeResult:
        state = self.app.state
        yield RunHeader(id="header")
        yield ProcessTable(id="processes")
        with Grid(id="charts"):
            for spec in DASHBOARD_CHARTS:
                yield MetricChart(spec, t0=state.started_at or 0.0)
        yield LogPane(SUPERVISOR_LOG, state.logs[SUPERVISOR_LOG], max_lines=500)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(LogPane).border_title = "events"
        self.redraw()
        self.set_interval(REDRAW_PERIOD, self.redraw)
        self.set_interval(LOG_FLUSH_PERIOD, self.query_one(LogPane).flush)

    def redraw(self) -> None:
        """Draw the latest snapshot: header, table, changed charts, alert highlights."""
        if not self.is_current:
            return
        app = self.app
        state, now = app.state, app.clock()
        self.query_one(RunHeader).show(state, now, read_only=app.read_only)
        self.query_one(ProcessTable).show(list(state.processes.values()), now)
        alerted = {alert.chart for alert in app.check_alerts() if alert.chart}
        for chart in self.query(MetricChart):
            if chart.spec.x == "time":
                chart.t0 = state.started_at or 0.0
            chart.redraw(state.metrics)
            chart.set_class(chart.spec.id in alerted, "-alert")
        self.query_one(LogPane).flush()

    @property
    def selected_process(self) -> str | None:
        return self.query_one(ProcessTable).selected
