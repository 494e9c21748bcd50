"""The inference server's incarnations, written for the trainer and the rollout API to follow.

Each time the inference process becomes ready its incarnation goes up by one; when it
leaves ready (a crash, a restart, a stop) the run directory says it is down at once
(``grpo_trainer.run_notices.InferenceLife``). The trainer re-attaches its weight path to
a new incarnation by itself; the rollout API holds the environments from "down" until the
trainer has pushed its weights to the incarnation that is up, so that no group is sampled
from a restarted server's stale weights (issue 27: before this, every sync after a vLLM
restart failed until the trainer stopped on its max sync lag and was restarted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

from grpo_trainer.run_notices import INFERENCE_FILE, InferenceLife, write_notice
from grpo_tui.supervisor.events import State, StateChanged
from grpo_tui.supervisor.supervisor import RunOutcome, Supervisor

INFERENCE = "inference"


class InferenceLifeWriter:
    """Follows the inference process's state changes into ``inference.json``."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.path: Path = supervisor.run_dir / INFERENCE_FILE
        self.life = InferenceLife()

    def apply(self, event: StateChanged) -> None:
        """Write the file when ``event`` moves the inference process into or out of ready."""
        if event.new == State.READY:
            self.life = InferenceLife(
                incarnation=event.incarnation, up=True, pid=event.pid, t=event.t
            )
        elif self.life.up:
            self.life = self.life.model_copy(update={"up": False, "t": event.t})
        else:
            return
        write_notice(self.path, self.life)

    async def run(self, run: Awaitable[RunOutcome]) -> RunOutcome:
        """Await ``run`` (the supervisor's ``run()``), following its events meanwhile:
        subscribed before it starts, so no state change is missed."""
        try:
            name = self.supervisor.by_role(INFERENCE)
        except KeyError:
            return await run
        subscription = self.supervisor.subscribe()

        async def follow() -> None:
            async for event in subscription:
                if isinstance(event, StateChanged) and event.process == name:
                    self.apply(event)

        follower = asyncio.create_task(follow(), name="inference-life")
        try:
            return await run
        finally:
            subscription.close()
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
