"""The stall watchdog: when the trainer has made no progress for a while, say why.

Progress is a trainer step (a metrics record with a step past the last one). The clock
starts at the first step: start-up (imports, model load, the first batch) is not a stall,
unless the supervisor can name a process that keeps the first step from coming (the
clock then starts when the trainer is ready: a process stopped, down, counting errors or
making no progress). Once ``after`` seconds pass without a step, a ``Stalled`` event names
what the supervisor can see, most telling first:

- a process stopped (SIGSTOP, a debugger): the OS says so (psutil), whatever its probes
  say; named with its pid, since when it is quiet, its CPU use and its last line;
- a server down or restarting (inference, the API), one alive but not answering (its
  liveness probe failing) or answering but doing no work (its progress probe failing:
  inference's generation probe), a process that reports itself failing (an environment
  whose task keeps raising);
- environments failed, backing off or not answering;
- the rollout API holding the environments until the trainer pushes its weights to the
  inference incarnation up now (the trainer must re-attach after an inference restart);
- the environments paused by back-pressure while the queue is short of a step and the
  trainer is not on one (``/status``'s ``backpressure``: with ``max_batches_offpolicy =
  0``, a batch leased and never acknowledged);
- the trainer itself restarting;
- a weight sync that has not returned (the trainer's phase, ``grpo_trainer.train.phases``);
- the API's queue short of a batch while an environment alive makes no progress (no
  group, no error, no output for ``after`` s): named with its OS state and CPU use,
  blocked (a deadlock, a wait that never returns) or busy in a loop; else while the
  environments drop every group as all-equal (a policy that became deterministic) or
  send nothing.

A process's cause is the process, never the symptom it causes in another: with an
environment stopped, the report does not say "the environments sent no group".

The event is repeated when the causes change (at most every ``after`` s), so the cause of
a long stall is never stale. A stall over the threshold is thus always reported with a
cause; the trainer's own "no batch" warning cannot see the processes around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from grpo_tui.stack.progress import ENV_DROPPED, ENV_ERRORS, ENV_SENT, Progress
from grpo_tui.stack.stuck import (
    LINE_CHARS,
    LIVE,
    Activity,
    Quiet,
    look,
    quiet_env_causes,
    stopped_causes,
)
from grpo_tui.supervisor.bus import Subscription
from grpo_tui.supervisor.events import (
    LogBatch,
    MetricsRecord,
    ResourceSample,
    Stalled,
    State,
    StateChanged,
)
from grpo_tui.supervisor.health import SELF
from grpo_tui.supervisor.record import ProcessStatus
from grpo_tui.supervisor.supervisor import Supervisor

TICK = 1.0
SERVERS = ("inference", "api")
"""Roles the trainer needs to answer, named first when down."""
SYNC_PHASES = ("sleeping", "syncing", "waking")
WARNS = re.compile(r"\b(WARNING|ERROR|CRITICAL|Error|error)\b")
"""A line that warns or errs (the last one an environment counting errors printed)."""


def process_causes(statuses: Mapping[str, ProcessStatus], trainer: str) -> list[str]:
    """Causes in the processes' states: servers first, then environments, the trainer."""
    order = [n for role in SERVERS for n, s in statuses.items() if s.role == role]
    order += [n for n, s in statuses.items() if s.role == "env"]
    order.append(trainer)
    causes = []
    for name in order:
        status = statuses.get(name)
        if status is None:
            continue
        why = f": {status.last_reason}" if status.last_reason else ""
        if status.external is not None and status.state not in (State.READY, State.RUNNING):
            causes.append(external_cause(name, status))
        elif status.state not in (State.READY, State.RUNNING):
            doing = "restarting" if status.state in (State.BACKOFF, State.STARTING) else "down"
            causes.append(f"{name} is {doing} ({status.state}{why})")
        elif status.health == "failing":
            causes.append(f"{name} {failing_cause(status.failing)}")
    return causes


def external_cause(name: str, status: ProcessStatus) -> str:
    """A server the run attaches to and cannot reach: where, since when, what it does
    about it (it attaches again by itself once the server answers)."""
    if status.down_since is None:
        since = "not attached yet"
    else:
        since = f"unreachable since {time.strftime('%H:%M:%S', time.localtime(status.down_since))}"
    why = f": {status.last_reason}" if status.last_reason else ""
    return (
        f"{name} at {status.external} {since} ({status.state}{why}); the run waits and "
        "attaches again when it answers"
    )


def failing_cause(failing: Mapping[str, str]) -> str:
    """What a process's failing checks (``ProcessStatus.failing``) say of it."""
    said = []
    if "liveness" in failing:  # (a server that does not answer does no work either)
        said.append(f"is alive but not answering (its liveness probe fails: {failing['liveness']})")
    elif "progress" in failing:
        said.append(f"answers but does no work (its progress probe fails: {failing['progress']})")
    if SELF in failing:
        said.append(f"reports itself failing: {failing[SELF]}")
    return "; ".join(said) or "is alive but its health check fails"


def error_causes(progress: Progress, last_warning: Callable[[str], str | None]) -> list[str]:
    """Environments that counted errors since the trainer's last step, each with its last
    warning line (``inference refused (404): The model `policy` does not exist``)."""
    since = "the trainer's last step" if progress.step is not None else "they started"
    causes = []
    for name in sorted(progress.envs):
        errors = progress.env_delta(ENV_ERRORS, name)
        if errors:
            line = last_warning(name)
            said = f"; its last: {line[:LINE_CHARS]}" if line else ""
            causes.append(f"{name} counted {errors} errors since {since}{said}")
    return causes


def hold_causes(
    statuses: Mapping[str, ProcessStatus], api_status: Mapping[str, Any] | None
) -> list[str]:
    """The rollout API holding the environments (``/status``'s ``inference_held``): once
    inference is up, the trainer has not pushed its weights to that incarnation."""
    if not api_status or not api_status.get("inference_held"):
        return []
    pushed = api_status.get("served_incarnation")
    up = [s for s in statuses.values() if s.role == "inference" and s.state == State.READY]
    if not up:
        return [
            "the rollout API holds the environments until inference is up again and the "
            f"trainer pushed its weights to it (it last pushed to incarnation {pushed})"
        ]
    return [
        f"the rollout API holds the environments: inference incarnation {up[0].incarnation} "
        f"is up and the trainer has not pushed its weights to it (it last pushed to "
        f"incarnation {pushed}; it re-attaches by itself after a restart)"
    ]


def backpressure_causes(api_status: Mapping[str, Any] | None, progress: Progress) -> list[str]:
    """The environments paused by the API's back-pressure (``/status``'s ``backpressure``)
    while the trainer waits for a batch the queue is short of: the room is held by leased
    batches no trainer is training."""
    if not api_status or not api_status.get("backpressure"):
        return []
    if progress.phase != "generating":
        return []  # a trainer on a step holds its leased batch by design
    return [
        "the environments are paused by back-pressure: the rollout API's queue is at "
        f"max_batches_offpolicy {api_status.get('max_batches_offpolicy')} with "
        f"{api_status.get('queue_sequences')} sequences queued and "
        f"{api_status.get('leased_batches')} batches leased and not acknowledged, and no "
        "step is training"
    ]


def restart_causes(
    statuses: Mapping[str, ProcessStatus], trainer: str, progress: Progress, now: float
) -> list[str]:
    """Processes up again that restarted since the trainer's last step: the stall is most
    likely their restart (a restarted trainer is still on its first step)."""
    causes = []
    for name, status in statuses.items():
        up = status.state in (State.READY, State.RUNNING) and status.health != "failing"
        if not up or status.started_at is None or status.started_at <= progress.step_at:
            continue
        ago = f"{now - status.started_at:.0f} s ago"
        if name == trainer:
            causes.append(f"the trainer restarted {ago} and is {progress.phase} its first step")
        else:
            causes.append(f"{name} restarted {ago}, since the trainer's last step")
    return causes


def progress_causes(progress: Progress, now: float, queued: str, need: str) -> list[str]:
    """Causes in what the trainer is doing and what the environments report."""
    in_phase = now - progress.phase_at
    if progress.phase in SYNC_PHASES:
        return [f"a weight sync has not returned: {progress.phase} for {in_phase:.0f} s"]
    if progress.phase == "training":
        return [f"the trainer has been training one step for {in_phase:.0f} s"]
    sent, dropped = progress.env_delta(ENV_SENT), progress.env_delta(ENV_DROPPED)
    queue = f"the API holds {queued} queued sequences of the {need} a step needs"
    if dropped and not sent:
        return [
            f"{queue} while the environments dropped {dropped} all-equal groups and sent "
            "none: every group scores the same (a policy that became deterministic?)"
        ]
    if not sent:
        return [f"{queue} and the environments sent no group since the last step"]
    return [f"{queue}; the environments sent {sent} groups and dropped {dropped} all-equal"]


class StallWatch:
    """Watches one run's trainer; publishes ``Stalled`` through the supervisor."""

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        after: float,
        api_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        step_sequences: int | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.after = after
        self.api_url = api_url
        self.headers = dict(headers or {})
        self.step_sequences = step_sequences
        self.progress = Progress()
        self.activity = Activity()
        self._reported: tuple[str, ...] = ()
        self._reported_at = 0.0

    async def watch(self) -> None:
        """Fold the run's metrics and check every second, until cancelled."""
        trainer = self.supervisor.by_role("trainer")
        envs = {n for n in self.supervisor.names if self.supervisor.spec(n).role == "env"}
        async with self.supervisor.subscribe() as events, httpx.AsyncClient(timeout=2.0) as http:
            folding = asyncio.create_task(self._fold(events, trainer, envs))
            try:
                while True:
                    await asyncio.sleep(TICK)
                    await self._check(trainer, http)
            finally:
                folding.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await folding

    async def _fold(self, events: Subscription, trainer: str, envs: set[str]) -> None:
        async for event in events:
            if isinstance(event, LogBatch | ResourceSample):
                self.activity.fold(event)
            elif isinstance(event, StateChanged):
                if event.process == trainer and event.new == State.READY:
                    self.progress.ready_at = event.t
            elif isinstance(event, MetricsRecord) and self.progress.fold(event, trainer, envs):
                self._reported = ()

    async def _check(self, trainer: str, http: httpx.AsyncClient) -> None:
        progress, now = self.progress, time.time()
        first = progress.step is None
        start = progress.ready_at if first else progress.step_at
        if start is None or now - start < self.after or self.supervisor.closing:
            return
        quiet = now - start
        statuses = self.supervisor.status()
        api_status, unread = await self._api_status(http)
        looks = {
            name: seen
            for name, status in statuses.items()
            if status.state in LIVE and status.pid and (seen := look(status.pid)) is not None
        }
        stopped = stopped_causes(statuses, looks, self._quiet, now)
        others = {name: s for name, s in statuses.items() if name not in stopped}
        causes = [*stopped.values(), *process_causes(others, trainer)]
        causes += error_causes(progress, self._last_warning)
        causes += hold_causes(statuses, api_status)
        if self._short(api_status):
            causes += backpressure_causes(api_status, progress)
        if not first:
            causes += restart_causes(statuses, trainer, progress, now)
        if not causes and self._short(api_status):
            causes = quiet_env_causes(statuses, looks, self._quiet, progress, now, self.after)
        if not causes and first:
            return  # start-up that nothing named holds up is no stall
        if not causes:
            queued = str(api_status["queue_sequences"]) if api_status else f"? {unread}".strip()
            causes = progress_causes(progress, now, queued, self._need())
        if tuple(causes) == self._reported or (
            self._reported and now - self._reported_at < self.after
        ):
            return
        self._reported, self._reported_at = tuple(causes), now
        self.supervisor.publish(
            Stalled(process=trainer, seconds=quiet, step=progress.step, causes=tuple(causes))
        )

    def _short(self, api_status: Mapping[str, Any] | None) -> bool:
        """The API's queue is short of a step (or the API could not say)."""
        if api_status is None or not self.step_sequences:
            return True
        return int(api_status["queue_sequences"]) < self.step_sequences

    def _quiet(self, name: str) -> Quiet:
        """Since when ``name`` shows no sign of progress (output, an environment's counts,
        its start), its CPU use and its last line."""
        status = self.supervisor.status()[name]
        signs = [
            self.activity.output_at.get(name),
            self.progress.envs_moved_at.get(name),
            status.started_at,
        ]
        lines = [line for line in self.supervisor.recent_lines(name) if line.strip()]
        return Quiet(
            since=max(t for t in signs if t is not None) if any(signs) else time.time(),
            cpu=self.activity.cpu.get(name),
            line=lines[-1] if lines else None,
        )

    def _last_warning(self, name: str) -> str | None:
        """The last line ``name`` printed that warns or errs (from the supervisor's ring)."""
        lines = self.supervisor.recent_lines(name)
        return next((line for line in reversed(lines) if WARNS.search(line)), None)

    async def _api_status(self, http: httpx.AsyncClient) -> tuple[dict[str, Any] | None, str]:
        """The API's ``/status`` (queue, hold), or None and why it could not say."""
        if self.api_url is None:
            return None, ""
        try:
            answer = await http.get(f"{self.api_url}/status", headers=self.headers)
            found = answer.json()
            if not isinstance(found, dict) or "queue_sequences" not in found:
                raise ValueError(f"not a status: {str(found)[:80]}")
            return found, ""
        except (httpx.HTTPError, ValueError) as error:
            return None, f"({type(error).__name__})"

    def _need(self) -> str:
        return str(self.step_sequences) if self.step_sequences else "?"
