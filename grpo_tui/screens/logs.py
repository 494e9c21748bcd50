"""The logs screen: a tab per process plus the supervisor's events, over one log pane.

Long lines are folded at the pane's width, so the end of an error is on screen; ``w``
shows them whole instead, scrolled sideways.

The tabs choose which stream the one pane shows; each stream keeps its own follow / filter
setting. One pane instead of a pane per tab keeps the screen to a few dozen widgets, which
is what Textual restyles each time the screen is shown. The pane is flushed every 80 ms
while the screen is on top, so hidden streams cost nothing while their process prints; a
stream catches up from its bounded buffer when shown.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Input, Tab, Tabs

from grpo_tui.run_state import SUPERVISOR_LOG
from grpo_tui.screens.host import DashboardHost
from grpo_tui.widgets.key_bar import KeyBar
from grpo_tui.widgets.log_pane import LogPane, dom_id
from grpo_tui.widgets.run_header import RunHeader

LOG_FLUSH_PERIOD = 0.08
NEW_STREAMS_PERIOD = 0.5


class LogsScreen(Screen[None]):
    """Per-process logs with follow / pause, a filter and full screen."""

    app: DashboardHost

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "toggle_follow", "Follow/pause", id="logs-follow"),
        Binding("slash", "filter", "Filter", id="logs-filter"),
        Binding("w", "toggle_wrap", "Wrap/scroll", id="logs-wrap"),
        Binding("z", "full_screen", "Full screen", id="logs-full-screen"),
        Binding("right_square_bracket", "next_tab", "Next", id="logs-next"),
        Binding("left_square_bracket", "previous_tab", "Previous", id="logs-previous"),
        Binding("escape", "escape", "Back", show=False, id="logs-escape"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._tab_streams: dict[str, str] = {}
        """Tab id -> stream name, for every tab added so far."""

    def compose(self) -> ComposeResult:
        streams = self._streams()
        self._tab_streams = {dom_id("tab", name): name for name in streams}
        yield RunHeader(id="header")
        yield Tabs(*(Tab(name, id=tab_id) for tab_id, name in self._tab_streams.items()))
        first = streams[0]
        yield LogPane(first, self.app.state.logs[first], id="logs-pane")
        yield KeyBar()

    def on_mount(self) -> None:
        self.set_interval(LOG_FLUSH_PERIOD, self.flush)
        self.set_interval(NEW_STREAMS_PERIOD, self.add_new_streams)

    def _streams(self) -> list[str]:
        names = [name for name in self.app.state.logs if name != SUPERVISOR_LOG]
        return [*names, SUPERVISOR_LOG]

    def add_new_streams(self) -> bool:
        """Add a tab (before the supervisor's) for each process that appeared since.

        Returns whether any was added (a new tab can be activated after the next refresh).
        """
        known = set(self._tab_streams.values())
        new = [name for name in self._streams() if name not in known]
        tabs = self.query_one(Tabs)
        for name in new:
            tab_id = dom_id("tab", name)
            self._tab_streams[tab_id] = name
            tabs.add_tab(Tab(name, id=tab_id), before=dom_id("tab", SUPERVISOR_LOG))
        if self.is_active:
            app = self.app
            self.query_one(RunHeader).show(app.state, app.clock(), read_only=app.read_only)
        return bool(new)

    def flush(self) -> None:
        if self.is_active:
            self.pane.flush()

    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        name = self._tab_streams[event.tab.id or ""]
        self.pane.show(name, self.app.state.logs[name])

    @property
    def pane(self) -> LogPane:
        return self.query_one(LogPane)

    @property
    def active_pane(self) -> LogPane | None:
        """The pane, once mounted."""
        return self.pane if self.is_mounted else None

    @property
    def selected_process(self) -> str | None:
        pane = self.active_pane
        if pane is None or pane.stream == SUPERVISOR_LOG:
            return None
        return pane.stream

    def show_stream(self, name: str) -> None:
        """Bring ``name``'s log to the front (once mounted, if it is not yet)."""
        if not self.is_mounted:
            self.app.call_after_refresh(self.show_stream, name)
            return
        if self.add_new_streams():
            self.app.call_after_refresh(self.show_stream, name)
            return
        self.query_one(Tabs).active = dom_id("tab", name)

    def action_toggle_follow(self) -> None:
        self.pane.toggle_follow()

    def action_toggle_wrap(self) -> None:
        """Long lines folded at the pane's width (the default), or whole: scroll sideways
        with ← / → (the pane focused) to read their end."""
        self.pane.toggle_wrap()
        if not self.pane.wrap:
            self.pane.log_view.focus()

    def action_filter(self) -> None:
        self.pane.open_filter()

    def action_full_screen(self) -> None:
        if self.maximized is not None:
            self.minimize()
        else:
            self.maximize(self.pane, container=False)

    def action_next_tab(self) -> None:
        self.query_one(Tabs).action_next_tab()

    def action_previous_tab(self) -> None:
        self.query_one(Tabs).action_previous_tab()

    def action_escape(self) -> None:
        if isinstance(self.focused, Input):
            self.pane.close_filter()
        elif self.maximized is not None:
            self.minimize()
