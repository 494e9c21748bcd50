"""The mode-switch modal: says what a switch will do, then shows it happening.

Confirming runs ``GrpoStack.switch_mode`` (an attached run's over its socket) in a worker;
the progress pane follows the supervisor's event log (state changes of trainer and
inference, the switch's notices) from the moment the switch began.
"""

from __future__ import annotations

import time
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, OptionList, Static
from textual.widgets.option_list import Option

from grpo_tui.run_state import SUPERVISOR_LOG
from grpo_tui.screens.host import DashboardHost
from grpo_tui.widgets.log_pane import LogPane

MODE_SUMMARIES: dict[str, str] = {
    "none": "legacy: full checkpoint, inference restarted on it at each sync",
    "shared_vllm": "weights shared in memory, updated in place; generation paused per step",
    "lora_only": "LoRA adapter hot-loaded into the running server (/v1/load_lora_adapter)",
    "lora_restart": "LoRA adapter, inference restarted with it preloaded at each sync",
    "colocate": "shared weights, one device time-shared: inference sleeps while the trainer steps",
}
"""The five weight-sync modes (the profile's ``run.mode`` values), in order, and what each does."""

PLAN = (
    "1. SIGTERM the trainer: it finishes its step, writes a checkpoint, exits 0",
    "2. stop the inference server",
    "3. start inference with {mode}'s flags and wait until it is ready",
    "4. start the trainer in {mode}; it resumes from the checkpoint",
    "The API and the environments keep running; queued rollouts are kept.",
)


class ModeSwitchScreen(ModalScreen[str | None]):
    """Pick a mode, confirm, watch the switch; dismissed with the new mode (or None)."""

    app: DashboardHost

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="mode-switch-cancel")
    ]

    def __init__(self, current: str | None) -> None:
        super().__init__()
        self.current = current
        self.switching = False
        self.result: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="mode-dialog", classes="dialog"):
            yield Static(
                f"Switch weight-sync mode (now: [b]{self.current or '-'}[/b])", id="mode-title"
            )
            yield OptionList(
                *(
                    Option(f"{mode:<13} {summary}", id=mode, disabled=mode == self.current)
                    for mode, summary in MODE_SUMMARIES.items()
                ),
                id="mode-options",
            )
            yield Static(id="mode-plan")
            yield LogPane(
                SUPERVISOR_LOG, self.app.state.logs[SUPERVISOR_LOG], max_lines=200, wrap=True
            )
            with Horizontal(classes="buttons"):
                yield Button("Switch", id="mode-confirm", variant="warning", disabled=True)
                yield Button("Cancel", id="mode-cancel")

    def on_mount(self) -> None:
        pane = self.query_one(LogPane)
        pane.border_title = "progress"
        pane.display = False
        options = self.query_one(OptionList)
        options.highlighted = next(
            (i for i, mode in enumerate(MODE_SUMMARIES) if mode != self.current), None
        )
        options.focus()
        self.set_interval(0.08, pane.flush)

    @property
    def chosen(self) -> str | None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return None
        option = options.get_option_at_index(options.highlighted)
        return None if option.disabled else option.id

    @on(OptionList.OptionHighlighted)
    def show_plan(self) -> None:
        mode = self.chosen
        plan = "\n".join(line.format(mode=mode) for line in PLAN) if mode else ""
        self.query_one("#mode-plan", Static).update(plan)
        self.query_one("#mode-confirm", Button).disabled = mode is None or self.switching

    @on(OptionList.OptionSelected)
    def select_and_confirm(self) -> None:
        self.query_one("#mode-confirm", Button).press()

    @on(Button.Pressed, "#mode-confirm")
    def confirm(self) -> None:
        mode = self.chosen
        if mode is None or self.switching:
            return
        self.switching = True
        pane = self.query_one(LogPane)
        pane.start_from_now()
        pane.display = True
        self.query_one("#mode-plan").display = False  # read already; room for the progress
        self.query_one(OptionList).disabled = True
        self.query_one("#mode-confirm", Button).disabled = True
        self.query_one("#mode-cancel", Button).disabled = True
        self.run_switch(mode)

    @work(exclusive=True, group="mode-switch")
    async def run_switch(self, mode: str) -> None:
        title = self.query_one("#mode-title", Static)
        title.update(f"Switching to [b]{mode}[/b] ...")
        started = time.monotonic()
        try:
            await self.app.switch_training_mode(mode)
        except Exception as error:
            title.update(f"[b red]Switch to {mode} failed:[/] {error}")
        else:
            self.result = mode
            title.update(f"[b green]Now in {mode}[/] ({time.monotonic() - started:.1f} s)")
        self.switching = False
        close = self.query_one("#mode-cancel", Button)
        close.label = "Close"
        close.disabled = False
        close.focus()

    @on(Button.Pressed, "#mode-cancel")
    def action_cancel(self) -> None:
        if not self.switching:
            self.dismiss(self.result)
