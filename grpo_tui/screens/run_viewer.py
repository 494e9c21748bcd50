"""The read-only dashboard of a finished run (``grpo-tui view runs/<run>/``), or of a
followed one whose supervisor does not answer (``grpo-tui attach``, with the reason).

The same header, table and charts as the live dashboard, drawn from the run's files, with
a summary line instead of actions: how the run ended and what was recorded.
"""

from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.widgets import Static

from grpo_tui.screens.dashboard import DashboardScreen


class RunViewerScreen(DashboardScreen):
    """Dashboard without actions, plus a one-line summary of the run's records."""

    def compose(self) -> ComposeResult:
        yield Static(self.summary(), id="viewer-summary")
        yield from super().compose()

    def summary(self) -> str:
        state = self.app.state
        steps = state.step()
        metrics = sum(len(state.metrics.series(name)) for name in state.metrics.names())
        failed = [row.name for row in state.processes.values() if row.state == "failed"]
        parts = [
            f"[b]{state.run_name}[/b] (read-only)",
            f"{len(state.processes)} processes",
            f"last step {steps if steps is not None else '-'}",
            f"{metrics} metric samples",
        ]
        if failed:
            parts.append(f"[b red]failed: {', '.join(failed)}[/]")
        if self.app.notice:
            parts.append(f"[b yellow]{escape(self.app.notice)}[/]")
        return " · ".join(parts)
