"""A supervised run of a plan inside the test's event loop (the real Supervisor and GRPO
stack over the real role plan), for tests that act on a run while it goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from grpo_tui.headless import write_run_dir
from grpo_tui.plan.roles import Plan
from grpo_tui.stack.modes import SwitchPlanner
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.supervisor import RunOutcome, Supervisor


class Stack:
    """A supervised run of a plan, as a task of this event loop; ``planner`` answers what a
    mode switch restarts (None: the stack restarts inference and the trainer)."""

    def __init__(self, plan: Plan, planner: SwitchPlanner | None) -> None:
        self.plan = plan
        write_run_dir(plan)
        self.supervisor = Supervisor(
            plan.specs, plan.run_dir, exit_with=plan.exit_with, respec=plan.respec
        )
        self.grpo = GrpoStack(self.supervisor, planner=planner)
        self.task: asyncio.Task[RunOutcome] = asyncio.create_task(self.grpo.run())

    def latest_step(self) -> int:
        series = self.supervisor.metrics.series("loss")
        return int(series[-1][1] or 0) if series else 0

    async def until(self, condition: Callable[[], bool], deadline_s: float, what: str) -> None:
        """Poll ``condition`` (a real state of the run) until true; fail on run end."""
        async with asyncio.timeout(deadline_s):
            while not condition():
                if self.task.done():
                    raise AssertionError(f"run ended while waiting for {what}: {self.task}")
                await asyncio.sleep(0.1)
