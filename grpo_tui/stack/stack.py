"""One GRPO run: a supervisor and what the GRPO stack adds over it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_tui.stack.edits import Editor, apply_edit
from grpo_tui.stack.modes import switch_mode
from grpo_tui.stack.requests import stack_requests
from grpo_tui.supervisor.supervisor import Supervisor

if TYPE_CHECKING:
    from grpo_tui.plan.roles import Plan


class GrpoStack:
    """A :class:`Supervisor` with the GRPO actions: mode switch, live edits, and their
    control-socket requests. Also what the dashboard acts on in a run it started (the
    process operations are the supervisor's)."""

    def __init__(self, supervisor: Supervisor, *, editor: Editor | None = None) -> None:
        self.supervisor = supervisor
        self.editor = editor
        for action, handler in stack_requests(self).items():
            supervisor.handle(action, handler)

    @classmethod
    def from_plan(cls, plan: Plan) -> GrpoStack:
        """The stack of a checked plan: its specs, exit process, respec and edit callbacks."""
        supervisor = Supervisor(
            plan.specs,
            plan.run_dir,
            exit_with=plan.exit_with,
            respec=plan.respec,
            control=plan.roles.control_endpoint,
            on_needed_failure=plan.profile.run.on_needed_failure,
        )
        return cls(supervisor, editor=plan.edit)

    @property
    def run_dir(self) -> Path:
        return self.supervisor.run_dir

    async def switch_mode(self, mode: str) -> None:
        """See :func:`grpo_tui.stack.modes.switch_mode`."""
        await switch_mode(self.supervisor, mode)

    def edit(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """See :func:`grpo_tui.stack.edits.apply_edit`."""
        return apply_edit(self.supervisor, self.editor, values)

    async def restart(self, name: str) -> None:
        await self.supervisor.restart(name)

    async def stop(self, name: str) -> None:
        await self.supervisor.stop(name)

    async def start(self, name: str) -> None:
        await self.supervisor.start(name)

    async def kill(self, name: str) -> None:
        await self.supervisor.kill(name)
