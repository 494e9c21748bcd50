"""The help screen: every key, what it does, and the binding id to remap it with."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.keys import format_key
from textual.screen import ModalScreen
from textual.widgets import Static

from grpo_tui.screens.dashboard import DashboardScreen
from grpo_tui.screens.host import DashboardHost
from grpo_tui.screens.inspector import InspectorScreen
from grpo_tui.screens.logs import LogsScreen
from grpo_tui.screens.timeline import TimelineScreen

KEYMAP_HINT = (
    'Remap keys in {path} with lines like  restart-inference = "ctrl+r"  '
    "(binding id = key). Every action is also in the command palette (ctrl+p)."
)


def key_display(keys: str) -> str:
    """``question_mark,f1`` -> ``? / f1``: how the keys look on a keyboard."""
    return " / ".join(format_key(key.strip()) for key in keys.split(","))


def bindings_table(title: str, bindings: list[Binding], keymap: dict[str, str]) -> Table:
    """Key, action and id of each binding that has an id, after the user's keymap."""
    table = Table(title=title, title_justify="left", expand=True, box=None, padding=(0, 2))
    table.add_column("key", style="bold cyan", no_wrap=True)
    table.add_column("action")
    table.add_column("id", style="dim", no_wrap=True)
    for binding in bindings:
        if binding.id is None:
            continue
        key = keymap.get(binding.id, binding.key)
        table.add_row(key_display(key), binding.description or binding.action, binding.id)
    return table


class HelpScreen(ModalScreen[None]):
    """Key bindings of the app and of each screen."""

    app: DashboardHost

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "Close", id="help-close")
    ]

    def compose(self) -> ComposeResult:
        keymap = self.app.keymap
        dialog = VerticalScroll(id="help-dialog", classes="dialog")
        dialog.border_title = "[b]grpo-tui keys[/b] (scroll: ↑ ↓ pgup pgdn)"
        with dialog:
            yield Static(bindings_table("everywhere", self.app.key_bindings(), keymap))
            for title, screen in (
                ("dashboard", DashboardScreen),
                ("logs screen", LogsScreen),
                ("rollouts screen", InspectorScreen),
                ("timeline screen", TimelineScreen),
            ):
                bindings = [b for b in screen.BINDINGS if isinstance(b, Binding)]
                yield Static(bindings_table(title, bindings, keymap))
            yield Static(KEYMAP_HINT.format(path=self.app.keymap_path), classes="hint")

    def action_dismiss(self) -> None:
        self.dismiss()
