"""``[run] notify``: the user's command, run when the run ends, a process fails for good,
the run stalls or an alert starts, with the facts as one JSON object on its stdin.

That is enough to post to a chat (a ``curl`` to a webhook, a script), as trackio and W&B
alerts do. A command is bounded: after :data:`NOTIFY_TIMEOUT` seconds its process group
is killed. Its failures (not found, a non-zero exit, the timeout) are reported as warning
notices, and it never blocks the run: each runs in a task of its own, at most
:data:`MAX_RUNNING` at once (one more is dropped and said so). The run's end waits for the
commands still running, within the same bound.

The payload (``Notification.payload``)::

    {"event": "end" | "failure" | "stall" | "alert", "message": "...", "run": NAME,
     "run_dir": PATH, "t": EPOCH, "step": 12, "total_steps": 60, "reward": 0.81,
     ...the event's own fields: "exit_code", "reason" (end); "process", "reason"
     (failure); "process", "seconds", "causes" (stall); "alert" (alert)}

No textual here: ``grpo-tui run`` and the dashboard both notify through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from grpo_tui.alerts import evaluate
from grpo_tui.plan.launchers import GPU_ENV
from grpo_tui.run_state import RunState
from grpo_tui.supervisor.bus import Subscription
from grpo_tui.supervisor.events import Event, Stalled, State, StateChanged
from grpo_tui.supervisor.outcome import RunOutcome
from grpo_tui.supervisor.supervisor import Supervisor

NOTIFY_TIMEOUT = 10.0
"""Seconds a notify command may run before its process group is killed."""
MAX_RUNNING = 4
"""Notify commands running at once; one more is dropped (and said so)."""
ALERTS_EVERY = 1.0
"""Seconds between two checks of the alerts."""
STALL_ALERT = "stall:"
"""The key of the stall alert (``alerts.py``), which is notified as a ``stall``."""


class Notifier:
    """Follows one run's events and runs ``command`` on what a person should hear of."""

    def __init__(
        self,
        command: Sequence[str],
        supervisor: Supervisor,
        run_name: str,
        *,
        timeout: float = NOTIFY_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.command = list(command)
        self.supervisor = supervisor
        self.timeout = timeout
        self.clock = clock
        self.state = RunState(run_name, run_dir=supervisor.run_dir)
        self.running: set[asyncio.Task[None]] = set()
        self.problems: list[str] = []
        """What went wrong with the commands, in order (reported as notices while the run
        goes on; after its end only here, for the exit summary)."""
        self._alerts: set[str] = set()
        self._alerts_at = 0.0
        self._ended = False

    async def run(self, run: Awaitable[RunOutcome]) -> RunOutcome:
        """Await ``run`` (``GrpoStack.run()``), notifying as its events come, then notify its
        end and wait (bounded) for the commands still running."""
        subscription = self.supervisor.subscribe()
        follower = asyncio.create_task(self._follow(subscription), name="notify")
        try:
            outcome = await run
        finally:
            subscription.close()  # what is queued is still read
            await follower
            self._ended = True
        ok = outcome.exit_code == 0
        self.send(
            "end",
            f"run {'finished' if ok else 'failed'} (exit {outcome.exit_code}): {outcome.reason}",
            exit_code=outcome.exit_code,
            reason=outcome.reason,
        )
        await self.wait()
        return outcome

    async def _follow(self, subscription: Subscription) -> None:
        async for event in subscription:
            self.state.apply(event)
            self.on_event(event)

    def on_event(self, event: Event) -> None:
        """Notify what ``event`` means (and the alerts that started since the last check)."""
        match event:
            case StateChanged(new=State.FAILED):
                why = event.reason or (
                    f"exit {event.exit_code}" if event.exit_code is not None else ""
                )
                self.send(
                    "failure",
                    f"{event.process} failed for good: {why}",
                    process=event.process,
                    reason=why,
                )
            case Stalled():
                self.send(
                    "stall",
                    f"{event.process} made no progress for {event.seconds:.0f} s: "
                    + "; ".join(event.causes),
                    process=event.process,
                    seconds=event.seconds,
                    causes=list(event.causes),
                )
        now = self.clock()
        if now - self._alerts_at >= ALERTS_EVERY:
            self._alerts_at = now
            active = {alert.key: alert for alert in evaluate(self.state, now)}
            for key in sorted(active.keys() - self._alerts):
                if not key.startswith(STALL_ALERT):  # sent as a stall, with its causes
                    self.send("alert", active[key].message, alert=key)
            self._alerts = set(active)

    def payload(self, event: str, message: str, fields: dict[str, Any]) -> dict[str, Any]:
        state = self.state
        return {
            "event": event,
            "message": f"{state.run_name}: {message}",
            "run": state.run_name,
            "run_dir": str(state.run_dir),
            "t": self.clock(),
            "step": state.step(),
            "total_steps": state.total_steps(),
            "reward": state.metrics.latest.get("reward/mean"),
            **fields,
        }

    def send(self, event: str, message: str, **fields: Any) -> None:
        """Run the command on this notification, in a task of its own (never waited for
        here)."""
        if len(self.running) >= MAX_RUNNING:
            self._problem(f"notify: {len(self.running)} commands still running; {event} dropped")
            return
        body = json.dumps(self.payload(event, message, fields), default=str).encode()
        task = asyncio.get_running_loop().create_task(self._run_command(event, body))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def wait(self) -> None:
        """Wait for the commands still running (each is bounded by the timeout)."""
        while self.running:
            await asyncio.gather(*self.running, return_exceptions=True)

    async def _run_command(self, event: str, body: bytes) -> None:
        what = f"notify command for {event}"
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own group: killed whole at the timeout
                env={**os.environ, **GPU_ENV},
            )
        except OSError as error:
            self._problem(f"{what} could not start ({self.command[0]}): {error}")
            return
        try:
            async with asyncio.timeout(self.timeout):
                output, _ = await proc.communicate(body)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            self._problem(f"{what} killed after {self.timeout:g} s")
            return
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        if proc.returncode != 0:
            tail = output.decode("utf-8", "replace").strip().splitlines()[-1:] if output else []
            said = f": {tail[0][:200]}" if tail else ""
            self._problem(f"{what} exited {proc.returncode}{said}")

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        if not self._ended:
            self.supervisor.notice(message, level="warning")
