"""Confirm quitting while a trainer is running (quitting stops every process, in order)."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class QuitConfirmScreen(ModalScreen[bool]):
    """Dismissed with True to quit."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,n", "cancel", "Cancel", id="quit-cancel"),
        Binding("y", "confirm", "Quit", id="quit-confirm"),
    ]

    def __init__(self, progress: str) -> None:
        super().__init__()
        self.progress = progress

    def compose(self) -> ComposeResult:
        dialog = Vertical(id="quit-dialog", classes="dialog")
        dialog.border_title = "[b]Quit?[/b]"
        with dialog:
            yield Static(
                f"Training is running ({self.progress}).\n\n"
                "Quitting stops every process in reverse dependency order; the trainer "
                "finishes its step and writes a checkpoint first. Quit?"
            )
            with Horizontal(classes="buttons"):
                yield Button("Quit (y)", id="quit-yes", variant="error")
                yield Button("Cancel (n)", id="quit-no")

    @on(Button.Pressed, "#quit-yes")
    def action_confirm(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#quit-no")
    def action_cancel(self) -> None:
        self.dismiss(False)
