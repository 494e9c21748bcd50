"""The mode-switch modal: says what a switch will do, then shows it happening.

It opens on the current mode. For the mode under the cursor it says what the switch would
do, from the same plan the switch asks (``GrpoStack.planner``, the run's
``Plan.mode_switch``; ``grpo_tui/stack/modes.py`` follows it): in place, the trainer alone
restarted, or inference and the trainer restarted, each with the plan's reason, or why the
run cannot use that mode. Confirming runs ``GrpoStack.switch_mode`` (an attached run's over
its socket) in a worker; the progress pane follows the supervisor's event log from the
moment the switch began. The dialog's title is its border's, so it never scrolls away.
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
from grpo_tui.stack.modes import SwitchPlan, SwitchPlanner
from grpo_tui.widgets.log_pane import LogPane

MODE_SUMMARIES: dict[str, str] = {
    "none": "full checkpoint; inference restarted on it at each sync",
    "shared_vllm": "weights shared in memory, updated in place; generation paused",
    "lora_only": "LoRA adapter hot-loaded into the running server",
    "lora_restart": "LoRA adapter; inference restarted with it at each sync",
    "colocate": "shared weights on one device; inference sleeps while training",
}
"""The five weight-sync modes (the profile's ``run.mode`` values), in order, and what each does."""

KEPT = "The API and the environments keep running; queued rollouts are kept."


def describe_switch(mode: str, plan: SwitchPlan | None) -> str:
    """What switching to ``mode`` does under ``plan`` (None: an attached run, whose own
    supervisor plans it), as ``grpo_tui/stack/modes.py`` carries it out."""
    if plan is None:
        return (
            f"The running supervisor plans the switch to {mode}: in place where the run "
            "allows it, else by restarts. Its steps show below once confirmed.\n" + KEPT
        )
    if plan.inference is None and plan.trainer is None:
        return (
            f"In place: inference keeps serving and the trainer switches to {mode} at its "
            "next step boundary; both keep their pids and the step count.\n" + KEPT
        )
    if plan.inference is None:
        return (
            f"The trainer restarts ({plan.trainer}): it finishes its step, writes a "
            f"checkpoint, and resumes from it in {mode}. Inference keeps serving.\n" + KEPT
        )
    return "\n".join(
        (
            f"By restarts ({plan.inference}):",
            "1. the trainer finishes its step, writes a checkpoint, exits",
            "2. inference stops",
            f"3. inference starts with {mode}'s flags and is waited for until ready",
            f"4. the trainer starts in {mode}, resuming from its checkpoint",
            KEPT,
        )
    )


class ModeSwitchScreen(ModalScreen[str | None]):
    """Pick a mode, confirm, watch the switch; dismissed with the new mode (or None)."""

    app: DashboardHost

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="mode-switch-cancel")
    ]

    def __init__(self, current: str | None, planner: SwitchPlanner | None = None) -> None:
        """``planner``: what a switch to a mode restarts, the one the switch asks (None:
        an attached run, whose own supervisor plans it)."""
        super().__init__()
        self.current = current
        self.planner = planner
        self.switching = False
        self.result: str | None = None

    def compose(self) -> ComposeResult:
        dialog = Vertical(id="mode-dialog", classes="dialog")
        dialog.border_title = f"Switch weight-sync mode (now: [b]{self.current or '-'}[/b] •)"
        with dialog:
            yield OptionList(
                *(
                    Option(f"{'•' if mode == self.current else ' '} {mode:<13} {summary}", id=mode)
                    for mode, summary in MODE_SUMMARIES.items()
                ),
                id="mode-options",
            )
            yield Static(id="mode-plan")
            yield LogPane(SUPERVISOR_LOG, self.app.state.logs[SUPERVISOR_LOG], max_lines=200)
            with Horizontal(classes="buttons"):
                yield Button("Switch", id="mode-confirm", variant="warning", disabled=True)
                yield Button("Cancel", id="mode-cancel")

    def on_mount(self) -> None:
        pane = self.query_one(LogPane)
        pane.border_title = "progress"
        pane.display = False
        options = self.query_one(OptionList)
        modes = list(MODE_SUMMARIES)
        options.highlighted = modes.index(self.current) if self.current in modes else 0
        options.focus()
        self.set_interval(0.08, pane.flush)

    @property
    def highlighted(self) -> str | None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return None
        return options.get_option_at_index(options.highlighted).id

    @property
    def chosen(self) -> str | None:
        """The mode under the cursor, where a switch to it can go ahead."""
        mode = self.highlighted
        return mode if mode is not None and self._plan(mode)[1] else None

    def _plan(self, mode: str) -> tuple[str, bool]:
        """What a switch to ``mode`` does, and whether it can go ahead."""
        if mode == self.current:
            return f"{mode} is the current mode: pick another one to switch to.", False
        try:
            plan = self.planner(mode) if self.planner is not None else None
        except ValueError as error:
            return f"This run cannot switch to {mode}: {error}", False
        return describe_switch(mode, plan), True

    @on(OptionList.OptionHighlighted)
    def show_plan(self) -> None:
        mode = self.highlighted
        text, possible = self._plan(mode) if mode is not None else ("", False)
        self.query_one("#mode-plan", Static).update(text)
        self.query_one("#mode-confirm", Button).disabled = not possible or self.switching

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
        dialog = self.query_one("#mode-dialog")
        dialog.border_title = f"Switching to [b]{mode}[/b] ..."
        started = time.monotonic()
        try:
            await self.app.switch_training_mode(mode)
        except Exception as error:
            dialog.border_title = f"[b red]Switch to {mode} failed[/]"
            plan = self.query_one("#mode-plan", Static)
            plan.update(f"[red]{error}[/]")
            plan.display = True
        else:
            self.result = mode
            dialog.border_title = f"[b green]Now in {mode}[/] ({time.monotonic() - started:.1f} s)"
        self.switching = False
        close = self.query_one("#mode-cancel", Button)
        close.label = "Close"
        close.disabled = False
        close.focus()

    @on(Button.Pressed, "#mode-cancel")
    def action_cancel(self) -> None:
        if not self.switching:
            self.dismiss(self.result)
