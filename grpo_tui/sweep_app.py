"""The sweep dashboard: :class:`SweepScreen` over a sweep directory, live or read-only.

Live (``grpo-tui sweep`` without ``--headless``) the app runs the :class:`SweepRunner` in its
own event loop; ``q`` stops the running cells in order and waits for them before leaving,
so that no cell outlives the dashboard. Read-only (``grpo-tui view SWEEP_DIR``) it only
draws.
"""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType

from grpo_tui.screens.sweep import SweepScreen
from grpo_tui.sweep.results import SweepResults
from grpo_tui.sweep.runner import SweepRunner
from grpo_tui.sweep.store import SweepDir


class SweepApp(App[int]):
    """A sweep's comparison screen; runs the sweep too when given a runner."""

    CSS_PATH = "app.tcss"
    TITLE = "grpo-tui sweep"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "Quit", id="quit")]

    def __init__(self, sweep: SweepDir, *, runner: SweepRunner | None, threshold: float) -> None:
        super().__init__()
        self.sweep = sweep
        self.runner = runner
        self.threshold = threshold
        self.exit_code: int | None = None
        self._quit_asked = False
        self.comparison = SweepScreen(SweepResults(sweep), threshold=threshold)

    def on_mount(self) -> None:
        self.push_screen(self.comparison)
        if self.runner is not None:
            self.runner.log = self._status
            self._run_sweep()

    def _status(self, line: str) -> None:
        self.comparison.status_line = line

    @work(exclusive=True, group="sweep")
    async def _run_sweep(self) -> None:
        assert self.runner is not None
        self.exit_code = await self.runner.run()
        self.comparison.refresh_data()
        if self._quit_asked:
            self.exit(self.exit_code, return_code=self.exit_code)

    async def action_quit(self) -> None:
        """Leave; a live sweep first stops its running cells (the table shows it)."""
        if self.runner is None or self.exit_code is not None:
            self.exit(self.exit_code or 0, return_code=self.exit_code or 0)
            return
        self._quit_asked = True
        self.runner.stop()
        self.comparison.refresh_data()


def run_sweep_app(sweep: SweepDir, *, runner: SweepRunner | None, threshold: float) -> int:
    """Open the sweep dashboard; returns the sweep's exit code (0 for a read-only view)."""
    app = SweepApp(sweep, runner=runner, threshold=threshold)
    result = app.run()
    return result if result is not None else 0
