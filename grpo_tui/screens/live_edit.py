"""The live-edit dialog (``e``): change hyperparameters while the run goes on.

The user types ``key=value`` pairs; the stack validates them like the profile (a
refusal is shown here with its reason, the dialog stays open), records them in the run
directory and the event log, and each process takes them at its next step boundary.
"""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from grpo_trainer.live_edits import EDITABLE, parse_assignments, read_edits
from grpo_tui.screens.host import DashboardHost


class LiveEditScreen(ModalScreen[dict[str, Any] | None]):
    """Dismissed with the values applied (or None when cancelled)."""

    app: DashboardHost

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="live-edit-cancel")
    ]

    def compose(self) -> ComposeResult:
        assert self.app.control is not None
        in_force = read_edits(self.app.control.run_dir).values
        edited = "  ".join(f"{k}={v}" for k, v in in_force.items()) or "none yet"
        keys = ", ".join(f"{key} ({role})" for key, role in EDITABLE.items())
        dialog = Vertical(id="edit-dialog", classes="dialog")
        dialog.border_title = "[b]Live edit[/b]: applied at each process's next step"
        with dialog:
            yield Static(f"editable: {keys}\nedited so far: {edited}", id="edit-keys")
            yield Input(placeholder="e.g. lr=3e-5 temperature=0.8", id="edit-input")
            yield Static(id="edit-result")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted)
    def submit(self, event: Input.Submitted) -> None:
        event.stop()
        result = self.query_one("#edit-result", Static)
        assert self.app.control is not None
        try:
            values = parse_assignments(event.value.split())
            applied = self.app.control.edit(values)
        except ValueError as error:
            result.update(f"[red]refused:[/] {error}")
            return
        self.dismiss(applied)

    def action_cancel(self) -> None:
        self.dismiss(None)
