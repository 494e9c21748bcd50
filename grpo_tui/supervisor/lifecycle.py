"""One process's life: a state machine driven by one task.

A :class:`ProcessLife` is the process's record (``record.py``: its one state, changed only
through the checked ``transition``) with the task that runs it and the operations that ask
it to start or stop. The task waits for the dependencies (event-driven: every state change
wakes the waiters, no polling), runs incarnations (``incarnation.py``: spawn or adopt the
standby, start gate, probes, wait), and applies the restart policy to each end
(``restart.py``), backing off before the next. An operation changes the state only to ask:
a start (an ended state -> PENDING, a new task), a stop (-> STOPPING) or a kill (->
KILLING: SIGKILL, no grace period); the task acts on a stop at its next step (it looks at
the state after each of its waits), stops the probes, then the child, and ends in
STOPPED. So one place decides what a process does, and nothing else is state: the restart
counters are counters, kept here.
"""

from __future__ import annotations

import asyncio
import signal

from grpo_tui.supervisor import incarnation, restart
from grpo_tui.supervisor.events import ProcessPlanned, Restarting, State
from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.record import Hooks, ProcessRecord
from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.transitions import EDGES, ENDED


class ProcessLife(ProcessRecord):
    """The supervisor's record of one process and the task that runs it."""

    def __init__(self, spec: ProcessSpec, sink: OutputSink, hooks: Hooks) -> None:
        super().__init__(spec, sink, hooks)
        self.task: asyncio.Task[None] | None = None
        self._attempts = 0
        """Restarts since the last start asked for or the last run of ``reset_after`` s:
        what ``max_restarts`` caps."""
        self.lock = asyncio.Lock()  # one start/stop/restart at a time

    @property
    def active(self) -> bool:
        """Its life task has not ended (waiting, running, in backoff, or tidying up)."""
        return self.task is not None and not self.task.done()

    # ------------------------------------------------------------------ operations

    def launch(self) -> None:
        """Start the life task afresh: PENDING, then waiting for the dependencies. A start
        asked for gets the whole ``max_restarts`` again."""
        if self.active:
            raise RuntimeError(f"{self.name}: its life task still runs")
        if self.state is not State.PENDING:
            self.transition(State.PENDING, reason="start requested")
        self._attempts = 0
        self.task = asyncio.create_task(self._life(), name=f"life:{self.name}")

    async def stop(self, *, keep_standby: bool = False) -> None:
        """Ask for a stop (STOPPING) and return once the life is STOPPED: its task stops
        the probes, then the process (shutdown signal, timeout, SIGKILL, confirm). A life
        that has ended stays as it is, one stopping or killing goes on as it does. Its
        standby is stopped too unless ``keep_standby`` (a restart, which adopts it)."""
        if self.state not in ENDED and not self.stopping:
            self.transition(State.STOPPING, reason="stop requested")
        if self.task is not None and self.active:
            await asyncio.shield(self.task)
        if self.stopping:  # no task ran to end it (never launched, or it ended as the run closed)
            self.transition(State.STOPPED, reason="stopped on request")
        if not keep_standby:
            await self.standby.discard()

    async def kill_now(self) -> None:
        """SIGKILL the process and its descendants without waiting for the lock; the life
        ends in STOPPED (``Supervisor.kill`` waits for that with a stop). KILLING, also
        during a stop: what its task stops from now on (a child a spawn in flight brings)
        it SIGKILLs, with no grace period."""
        if self.state not in ENDED and self.state is not State.KILLING:
            self.transition(State.KILLING, reason="kill requested")
        child = self.child
        if child is not None and child.returncode is None:
            self.report_survivors(await child.kill())
        await self.standby.discard(signal.SIGKILL)

    def replace_spec(self, spec: ProcessSpec) -> None:
        """Use ``spec`` from the next start on (a changed one is published as planned); its
        liveness and progress probes at once, where the process runs (a mode switched in
        place may turn one off)."""
        if spec != self.spec:
            self.hooks.publish(planned(spec))
        if (spec.liveness, spec.progress) != (self.spec.liveness, self.spec.progress):
            self.reprobe.set()
        self.spec = spec

    # ------------------------------------------------------------------- the task

    async def _life(self) -> None:
        try:
            await self._live()
        except Exception as exc:  # a bug here: said, and the process is not left running
            self.notice(f"its life ended on an internal error: {exc!r}", "error")
            if self.child is not None and self.child.returncode is None:
                self.report_survivors(await self.child.kill())
            if State.FAILED in EDGES[self.state]:
                self.transition(State.FAILED, reason=f"internal error: {exc!r}")
        finally:
            if self.stopping:
                self.transition(State.STOPPED, reason="stopped on request")
            elif self.state in (State.FAILED, State.COMPLETED):
                await self.standby.discard()  # nothing will start it any more

    async def _live(self) -> None:
        if not self.spec.prestart and not await self._dependencies_met():
            return
        while not self.hooks.closing():
            ended = await incarnation.run(self)
            if ended is None:  # a stop asked, or failed for good
                return
            delay = self._apply_policy(ended)
            if delay is None or not await self._back_off(delay):
                return
            if not self.hooks.closing():
                self._refresh_spec()

    def _apply_policy(self, ended: restart.Ended) -> float | None:
        """The restart policy on an incarnation's end: the backoff before the next one
        (BACKOFF, with a ``Restarting`` event), or None where the life ends (COMPLETED or
        FAILED)."""
        step = restart.step(ended, self.spec.restart, self._attempts)
        self._attempts = step.attempts
        if step.state is State.BACKOFF:
            self.restarts += 1
            self.hooks.publish(
                Restarting(
                    process=self.name, attempt=step.attempts, delay=step.delay, reason=ended.reason
                )
            )
        self.transition(step.state, reason=step.reason, exit_code=ended.code)
        return step.delay if step.state is State.BACKOFF else None

    async def _back_off(self, delay: float) -> bool:
        """Wait ``delay`` seconds; False when a stop was asked meanwhile."""
        sleeping = asyncio.ensure_future(self.hooks.clock.sleep(delay))
        try:
            await self.first(sleeping)
        finally:
            sleeping.cancel()
        return not self.stopping

    def _refresh_spec(self) -> None:
        """Before a crash restart: the newest spec (e.g. a server on the latest adapter);
        if building it raises, say so and keep the last spec."""
        if self.hooks.refresh is None:
            return
        try:
            spec = self.hooks.refresh(self.name)
        except Exception as exc:  # the callback is the plan's code; a restart must go on
            self.notice(f"respec failed, restarting with the last spec: {exc}", "warning")
            return
        self.replace_spec(spec)

    async def _dependencies_met(self) -> bool:
        """Wait for every dependency's condition; False when a stop came first or one
        failed for good (then FAILED)."""
        failed = await self.failed_dependency()
        if self.stopping:
            return False
        if failed:
            self.transition(State.FAILED, reason=failed)
        return not failed


def planned(spec: ProcessSpec) -> ProcessPlanned:
    """The event that says what a process will run (``events.jsonl`` starts with these)."""
    return ProcessPlanned(
        process=spec.name,
        role=spec.role,
        port=spec.port,
        command=tuple(spec.command),
        external=spec.external.url if spec.external is not None else None,
    )
