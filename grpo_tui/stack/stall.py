"""The stall watchdog: when the trainer has made no progress for a while, say why.

Progress is a trainer step (a metrics record with a step past the last one). The clock
starts at the first step: start-up (imports, model load, the first batch) is not a stall.
Once ``after`` seconds pass without a step, a ``Stalled`` event names what the supervisor
can see, most telling first:

- a server down or restarting (inference, the API) or one alive but not answering
  (its liveness probe failing);
- environments failed, backing off or not answering;
- the rollout API holding the environments until the trainer pushes its weights to the
  inference incarnation up now (the trainer must re-attach after an inference restart);
- the trainer itself restarting;
- a weight sync that has not returned (the trainer's phase, ``grpo_trainer.train.phases``);
- the API's queue short of a batch while environments drop every group as all-equal (a
  policy that became deterministic) or send nothing.

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
from dataclasses import dataclass, field
from typing import Any

import httpx

from grpo_trainer.train.phases import CURRENT, PHASES
from grpo_tui.supervisor.bus import Subscription
from grpo_tui.supervisor.events import MetricsRecord, Stalled, State
from grpo_tui.supervisor.lifecycle import ProcessStatus
from grpo_tui.supervisor.supervisor import Supervisor

TICK = 1.0
SERVERS = ("inference", "api")
"""Roles the trainer needs to answer, named first when down."""
STEP_METRIC = "loss"
"""In every record of a trainer step, and only there."""
SYNC_PHASES = ("sleeping", "syncing", "waking")
ENV_SENT = "env/groups_sent"
ENV_DROPPED = "env/groups_dropped_equal_scores"
ENV_ERRORS = "env/errors"
COUNTED = (ENV_SENT, ENV_DROPPED, ENV_ERRORS)
LINE_CHARS = 240
"""The most of a process's last warning line a cause quotes."""
WARNS = re.compile(r"\b(WARNING|ERROR|CRITICAL|Error|error)\b")


@dataclass
class Progress:
    """What the watch has seen of the trainer and the environments."""

    step: int | None = None
    step_at: float = 0.0
    phase: str = "generating"
    phase_at: float = 0.0
    envs: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each environment's cumulative counters, latest."""
    envs_at_step: dict[str, dict[str, float]] = field(default_factory=dict)
    """The same, when the trainer's last step arrived."""

    def fold(self, record: MetricsRecord, trainer: str, envs: set[str]) -> bool:
        """Take one metrics record; True when it is a new trainer step."""
        if record.process in envs:
            counts = self.envs.setdefault(record.process, {})
            counts.update({k: v for k, v in record.data.items() if k in COUNTED})
            return False
        if record.process != trainer:
            return False
        if CURRENT in record.data:
            phase = PHASES[int(record.data[CURRENT])]
            if phase != self.phase:
                self.phase, self.phase_at = phase, record.t
        if record.step is None or STEP_METRIC not in record.data:
            return False  # a phase change is not progress; a step (even one redone) is
        self.step, self.step_at = record.step, record.t
        self.envs_at_step = {name: dict(counts) for name, counts in self.envs.items()}
        return True

    def env_delta(self, key: str, name: str | None = None) -> int:
        """How much ``key`` rose since the last step, over every environment or in ``name``
        (a restarted environment counts from 0 again)."""
        total = 0.0
        for env, counts in self.envs.items():
            if name is not None and env != name:
                continue
            before = self.envs_at_step.get(env, {}).get(key, 0.0)
            now = counts.get(key, 0.0)
            total += now - before if now >= before else now
        return int(total)


def process_causes(statuses: Mapping[str, ProcessStatus], trainer: str) -> list[str]:
    """Causes in the processes' states: servers first, then environments, the trainer."""
    order = [n for role in SERVERS for n, s in statuses.items() if s.role == role]
    order += [n for n, s in statuses.items() if s.role == "env"]
    order.append(trainer)
    causes = []
    for name in order:
        status = statuses[name]
        why = f": {status.last_reason}" if status.last_reason else ""
        if status.state not in (State.READY, State.RUNNING):
            doing = "restarting" if status.state in (State.BACKOFF, State.STARTING) else "down"
            causes.append(f"{name} is {doing} ({status.state}{why})")
        elif status.health == "failing":
            causes.append(f"{name} is alive but not answering (its liveness probe fails)")
    return causes


def error_causes(progress: Progress, last_warning: Callable[[str], str | None]) -> list[str]:
    """Environments that counted errors since the trainer's last step, each with its last
    warning line (``inference refused (404): The model `policy` does not exist``)."""
    causes = []
    for name in sorted(progress.envs):
        errors = progress.env_delta(ENV_ERRORS, name)
        if errors:
            line = last_warning(name)
            said = f"; its last: {line[:LINE_CHARS]}" if line else ""
            causes.append(f"{name} counted {errors} errors since the trainer's last step{said}")
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
            if isinstance(event, MetricsRecord) and self.progress.fold(event, trainer, envs):
                self._reported = ()

    async def _check(self, trainer: str, http: httpx.AsyncClient) -> None:
        progress, now = self.progress, time.time()
        quiet = now - progress.step_at
        if progress.step is None or quiet < self.after or self.supervisor.closing:
            return
        statuses = self.supervisor.status()
        api_status, unread = await self._api_status(http)
        causes = process_causes(statuses, trainer)
        causes += error_causes(progress, self._last_warning)
        causes += hold_causes(statuses, api_status)
        causes += restart_causes(statuses, trainer, progress, now)
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
