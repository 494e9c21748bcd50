"""The logs screen: a tab per process plus the supervisor's events.

Only the visible pane is flushed (every 80 ms), so hidden panes cost nothing while their
process prints; a pane catches up from its bounded buffer when shown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Input, TabbedContent, TabPane

from grpo_tui.run_state import SUPERVISOR_LOG
from grpo_tui.widgets.log_pane import LogPane, dom_id
from grpo_tui.widgets.run_header import RunHeader

if TYPE_CHECKING:
    from grpo_tui.app import GrpoTuiApp

LOG_FLUSH_PERIOD = 0.08
NEW_STREAMS_PERIOD = 0.5


class LogsScreen(Screen[None]):
    """Per-process log panes with follow / pause, a filter and full screen."""

    app: GrpoTuiApp

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "toggle_follow", "Follow/pause", id="logs-follow"),
        Binding("slash", "filter", "Filter", id="logs-filter"),
        Binding("z", "full_screen", "Full screen", id="logs-full-screen"),
        Binding("right_square_bracket", "next_tab", "Next", id="logs-next"),
        Binding("left_square_bracket", "previous_tab", "Previous", id="logs-previous"),
        Binding("escape", "escape", "Back", show=False, id="logs-escape"),
    ]

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with TabbedContent(id="log-tabs"):
            for name in self._streams():
                with TabPane(name, id=dom_id("tab", name)):
                    yield LogPane(name, self.app.state.logs[name])
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(LOG_FLUSH_PERIOD, self.flush)
        self.set_interval(NEW_STREAMS_PERIOD, self.add_new_streams)
        self.flush()

    def _streams(self) -> list[str]:
        names = [name for name in self.app.state.logs if name != SUPERVISOR_LOG]
        return [*names, SUPERVISOR_LOG]

    def add_new_streams(self) -> None:
        """Add a tab for each process that appeared since the screen was built."""
        tabs = self.query_one(TabbedContent)
        for name in self._streams():
            tab_id = dom_id("tab", name)
            if not self.query(f"#{tab_id}"):
                pane = LogPane(name, self.app.state.logs[name])
                tabs.add_pane(TabPane(name, pane, id=tab_id))
        if self.is_current:
            app = self.app
            self.query_one(RunHeader).show(app.state, app.clock(), read_only=app.read_only)

    def flush(self) -> None:
        pane = self.active_pane
        if pane is not None and self.is_current:
            pane.flush()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        pane = self.active_pane
        if pane is not None:
            pane.reload()

    @property
    def active_pane(self) -> LogPane | None:
        tabs = self.query_one(TabbedContent)
        if not tabs.active:
            return None
        return tabs.get_pane(tabs.active).query_one(LogPane)

    @property
    def selected_process(self) -> str | None:
        pane = self.active_pane
        if pane is None or pane.stream == SUPERVISOR_LOG:
            return None
        return pane.stream

    def show_stream(self, name: str) -> None:
        """Bring ``name``'s pane to the front (once mounted, if it is not yet)."""
        if not self.is_mounted:
            self.app.call_after_refresh(self.show_stream, name)
            return
        self.add_new_streams()
        self.query_one(TabbedContent).active = dom_id("tab", name)

    def action_toggle_follow(self) -> None:
        if pane := self.active_pane:
            pane.toggle_follow()

    def action_filter(self) -> None:
        if pane := self.active_pane:
            pane.open_filter()

    def action_full_screen(self) -> None:
        if self.maximized is not None:
            self.minimize()
        elif pane := self.active_pane:
            self.maximize(pane, container=False)

    def action_next_tab(self) -> None:
        self._step_tab(1)

    def action_previous_tab(self) -> None:
        self._step_tab(-1)

    def _step_tab(self, delta: int) -> None:
        tabs = self.query_one(TabbedContent)
        ids = [pane.id for pane in tabs.query(TabPane) if pane.id]
        if tabs.active in ids:
            tabs.active = ids[(ids.index(tabs.active) + delta) % len(ids)]

    def action_escape(self) -> None:
        focused = self.focused
        if isinstance(focused, Input) and (pane := self.active_pane):
            pane.close_filter()
        elif self.maximized is not None:
            self.minimize()
