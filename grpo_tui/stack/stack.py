"""One GRPO run: a supervisor and what the GRPO stack adds over it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_trainer.serve.attach import LeaseHeld
from grpo_trainer.serve.external import Unreachable
from grpo_tui.plan.roles import Plan
from grpo_tui.plan.settings import trainer_config
from grpo_tui.stack.edits import Editor, apply_edit
from grpo_tui.stack.inference_life import InferenceLifeWriter
from grpo_tui.stack.lease import LeaseKeeper
from grpo_tui.stack.modes import SwitchAnswers, SwitchPlanner, switch_mode
from grpo_tui.stack.requests import stack_requests
from grpo_tui.stack.stall import StallWatch
from grpo_tui.supervisor.outcome import RunOutcome
from grpo_tui.supervisor.supervisor import Supervisor

REFUSED = 2
"""The exit code of bad input, nothing started: here a server another run holds."""


class GrpoStack:
    """A :class:`Supervisor` with the GRPO actions: mode switch, live edits, and their
    control-socket requests; the stall watchdog over its trainer; the lease on a server it
    attaches to (``lease.py``). Also what the dashboard acts on in a run it started (the
    process operations are the supervisor's)."""

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        editor: Editor | None = None,
        stall: StallWatch | None = None,
        planner: SwitchPlanner | None = None,
        lease: LeaseKeeper | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.editor = editor
        self.stall = stall
        self.planner = planner
        self.lease = lease
        self.switch_answers = SwitchAnswers()
        requests = stack_requests(self.edit, self.switch_mode, self.switch_answers)
        for action, handler in requests.items():
            supervisor.handle(action, handler)

    @classmethod
    def from_plan(cls, plan: Plan) -> GrpoStack:
        """The stack of a checked plan: its specs, exit process, respec and edit callbacks,
        what to do when a needed process fails, and the stall watchdog over its trainer."""
        run = plan.profile.run
        supervisor = Supervisor(
            plan.specs,
            plan.run_dir,
            exit_with=plan.exit_with,
            respec=plan.respec,
            control=plan.roles.control_endpoint,
            on_needed_failure=run.on_needed_failure,
        )
        stall = None
        if "trainer" in plan.roles.roles:
            settings = plan.roles.settings
            api = settings.api
            token = api.token.get_secret_value() if api and api.token else None
            stall = StallWatch(
                supervisor,
                after=run.stall_after,
                api_url=settings.api_url if api is not None else None,
                headers={"Authorization": f"Bearer {token}"} if token else None,
                step_sequences=trainer_config(settings, plan.roles.mode).step_batch_size,
            )
        return cls(
            supervisor,
            editor=plan.edit,
            stall=stall,
            planner=plan.mode_switch,
            lease=LeaseKeeper.for_plan(plan),
        )

    @property
    def run_dir(self) -> Path:
        return self.supervisor.run_dir

    async def run(self) -> RunOutcome:
        """Supervise the run to its end (``Supervisor.run``), watching for stalls and writing
        inference's incarnations for the trainer and the rollout API (``inference_life.py``).
        A run attached to a server takes its lease first (refused, exit 2, nothing started,
        when another run holds it), keeps it while it runs and lets it go at the end."""
        lease = self.lease
        if lease is not None:
            try:
                await lease.take()
            except (LeaseHeld, Unreachable) as error:
                return RunOutcome(REFUSED, f"inference at {lease.url}: {error}; nothing started")
        tasks = [asyncio.create_task(self.stall.watch())] if self.stall else []
        if lease is not None:
            tasks.append(asyncio.create_task(lease.keep(self.supervisor)))
        try:
            return await InferenceLifeWriter(self.supervisor).run(self.supervisor.run())
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if lease is not None:
                await lease.release()

    async def switch_mode(self, mode: str) -> None:
        """See :func:`grpo_tui.stack.modes.switch_mode`: in place when the plan says nothing
        must restart (a stack without a plan restarts inference and the trainer)."""
        await switch_mode(self.supervisor, mode, planner=self.planner, answers=self.switch_answers)

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
