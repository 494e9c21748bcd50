"""What the dashboard shows, as plain data: processes, metric series, log buffers, notices.

One subscriber task feeds supervisor events into a :class:`RunState` with :meth:`apply`;
widgets read it on their own timers and never see an event. The same state is rebuilt from
a finished run's files by :mod:`grpo_tui.run_files`, so the live app, the read-only viewer
and the snapshot tests draw exactly the same thing. No textual import here.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_tui.supervisor.events import (
    Event,
    GpuSample,
    LogBatch,
    MetricsRecord,
    NeedLost,
    NeedRegained,
    Notice,
    ProbeResult,
    RequestReceived,
    ResourceSample,
    Restarting,
    Stalled,
    State,
    StateChanged,
)
from grpo_tui.supervisor.health import SELF

SUPERVISOR_LOG = "supervisor"
"""Name of the log buffer holding the supervisor's own events."""

CRASH_LOOP_RESTARTS = 3
"""Restarts within :data:`CRASH_LOOP_WINDOW` seconds that make a crash loop."""
CRASH_LOOP_WINDOW = 120.0

TRAINER_STEP_METRICS = ("training_steps", "loss")
"""Metrics the trainer sends once per optimizer step: their ``step`` is the run's step."""
SYNC_SUCCEEDED = "sync_time"
SYNC_FAILED = "sync/failed_attempts"
"""A step record's sync result: ``sync_time`` when its sync succeeded, the attempts that
failed (``sync_retries`` + 1 of them, without ``sync_time``, when every one did)."""

LIVE_STATES = frozenset({State.STARTING, State.RUNNING, State.READY, State.UNHEALTHY})

RUN_ENDED = "run ended: "
"""How the supervisor's last notice starts (``Supervisor.run``): a record with it is over."""

ETA_STEPS = 10
"""Steps whose pace the ETA assumes for the rest of the run."""


class LogBuffer:
    """The last ``max_lines`` lines of one stream, plus how many were ever appended.

    Readers remember :attr:`total` and ask :meth:`since` for what is new, so a pane that
    flushes every 100 ms never copies more than the buffer holds.
    """

    def __init__(self, max_lines: int) -> None:
        self.lines: deque[str] = deque(maxlen=max_lines)
        self.total = 0

    def extend(self, lines: Sequence[str]) -> None:
        self.lines.extend(lines)
        self.total += len(lines)

    def since(self, seen: int) -> tuple[list[str], int]:
        """Lines appended after ``seen`` (at most the buffer), and the new total."""
        new = self.total - seen
        if new <= 0:
            return [], self.total
        count = min(new, len(self.lines))
        return list(self.lines)[-count:], self.total


@dataclass
class ProcessRow:
    """One row of the process table."""

    name: str
    role: str = "process"
    state: State = State.PENDING
    pid: int | None = None
    started_at: float | None = None
    restarts: int = 0
    health: str | None = None
    failing: dict[str, str] = field(default_factory=dict)
    """``check -> what it saw`` for each failing check (``ProcessStatus.failing``)."""
    port: int | None = None
    external: str | None = None
    """The URL of a process that is not ours (a server attached by URL): no pid."""
    exit_code: int | None = None
    last_reason: str = ""
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    gpu_memory_bytes: int | None = None
    incarnation: int = 0
    """How many times it became ready: the number of the ready one (0: never yet)."""
    restart_times: deque[float] = field(default_factory=lambda: deque(maxlen=32))

    def crash_looping(self, now: float) -> bool:
        """Restarted often lately, or gave up after restarting."""
        recent = sum(1 for t in self.restart_times if now - t <= CRASH_LOOP_WINDOW)
        return recent >= CRASH_LOOP_RESTARTS or (self.state is State.FAILED and self.restarts > 0)


@dataclass(frozen=True)
class SyncFailure:
    """A trainer step whose weight sync failed every attempt."""

    t: float
    step: int | None
    attempts: int


Point = tuple[float, int | None, float]
"""(t, step, value) of one metric sample."""


class SeriesStore:
    """Bounded time series by metric name; :attr:`version` moves on every change."""

    def __init__(self, max_points: int = 2000) -> None:
        self._series: dict[str, deque[Point]] = {}
        self._max_points = max_points
        self.latest: dict[str, float] = {}
        self.latest_step: dict[str, int | None] = {}
        self.version = 0

    def add(self, name: str, t: float, step: int | None, value: float) -> None:
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = deque(maxlen=self._max_points)
        series.append((t, step, value))
        self.latest[name] = value
        self.latest_step[name] = step
        self.version += 1

    def series(self, name: str) -> list[Point]:
        return list(self._series.get(name, ()))

    def names(self) -> list[str]:
        return sorted(self._series)


def _finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _clock_text(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class RunState:
    """Everything the UI draws, updated by :meth:`apply` and :meth:`sync_status`."""

    def __init__(
        self,
        run_name: str,
        *,
        mode: str | None = None,
        started_at: float | None = None,
        max_log_lines: int = 5000,
        run_dir: Path | None = None,
    ) -> None:
        self.run_name = run_name
        self.run_dir = run_dir
        """Where the run's records are (the inspector and the timeline read them there)."""
        self.mode = mode
        self.started_at = started_at
        self.finished_at: float | None = None
        self.outcome: str | None = None
        self.processes: dict[str, ProcessRow] = {}
        self.gpus: dict[int, GpuSample] = {}
        """The latest sample of each GPU (NVML), by index: memory, utilisation, holders."""
        self.metrics = SeriesStore()
        self.logs: dict[str, LogBuffer] = {SUPERVISOR_LOG: LogBuffer(max_log_lines)}
        self.notices: deque[Notice] = deque(maxlen=200)
        self.sync_failure: SyncFailure | None = None
        """The last step whose sync failed, until a sync succeeds again."""
        self.needs_lost: dict[str, NeedLost] = {}
        """Processes that cannot go on, by name: what they lack (until regained)."""
        self.stall: Stalled | None = None
        """The stall reported last, until its process makes progress again."""
        self.dropped_lines = 0
        self._max_log_lines = max_log_lines

    # -- events -----------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Fold one supervisor event into the state (cheap: called per event)."""
        if self.started_at is None:
            self.started_at = event.t
        match event:
            case LogBatch():
                self.log(event.process).extend(event.lines)
                if event.dropped:
                    self.dropped_lines += event.dropped
                    self._event_line(
                        event.t, f"{event.process}: {event.dropped} log lines dropped (slow UI)"
                    )
            case MetricsRecord():
                for name, value in event.data.items():
                    if _finite_number(value):
                        self.metrics.add(name, event.t, event.step, float(value))
                if self._progressed(event):
                    self.stall = None
                self._sync_result(event)
            case NeedLost():
                self.needs_lost[event.process] = event
                failed = "; ".join(f"{name}: {why}" for name, why in event.failed.items())
                then = "stopping the run" if event.action == "stop" else "waiting"
                self._event_line(
                    event.t,
                    f"[error] {event.process} cannot go on without {event.need} ({failed}); {then}",
                )
                for name, lines in event.last_lines.items():
                    self.logs[SUPERVISOR_LOG].extend([f"    {name} | {line}" for line in lines])
            case NeedRegained():
                self.needs_lost.pop(event.process, None)
                self._event_line(event.t, f"{event.process} has {event.need} again")
            case Stalled():
                self.stall = event
                self._event_line(
                    event.t,
                    f"[warning] {event.process} stalled {event.seconds:.0f} s: "
                    + "; ".join(event.causes),
                )
            case StateChanged():
                row = self.process(event.process)
                row.state = event.new
                if event.new not in LIVE_STATES:
                    row.health = None  # stopping, stopped, ended: nothing probes it
                    row.failing = {}
                if event.pid is not None:
                    row.pid = event.pid
                if event.new in (State.STARTING, State.RUNNING) and event.old not in LIVE_STATES:
                    row.started_at = event.t
                if event.new is State.READY and event.incarnation:
                    row.incarnation = event.incarnation
                if event.exit_code is not None:
                    row.exit_code = event.exit_code
                if event.reason:
                    row.last_reason = event.reason
                pid = f" pid {event.pid}" if event.pid else ""
                why = f" ({event.reason})" if event.reason else ""
                self._event_line(event.t, f"{event.process}: {event.old} -> {event.new}{pid}{why}")
            case Restarting():
                row = self.process(event.process)
                row.restarts = max(row.restarts, event.attempt)
                row.restart_times.append(event.t)
                self._event_line(
                    event.t,
                    f"{event.process}: restart #{event.attempt} in {event.delay:.1f}s"
                    f" ({event.reason})",
                )
            case ProbeResult():
                # a readiness probe failing while a process starts is expected: only a
                # failing liveness or progress probe, or the process's own word (``self``),
                # makes a row unhealthy (until that check passes again) and an event line
                row = self.process(event.process)
                if event.ok:
                    row.failing.pop(event.probe, None)
                elif event.probe != "readiness":
                    row.failing[event.probe] = event.message
                    what = (
                        "reports itself failing"
                        if event.probe == SELF
                        else f"{event.probe} probe failed"
                    )
                    self._event_line(event.t, f"{event.process}: {what}: {event.message}")
                if event.ok or event.probe != "readiness":
                    row.health = "failing" if row.failing else "ok"
            case RequestReceived():
                target = f" {event.target}" if event.target else ""
                self._event_line(
                    event.t, f"{event.process} asks: {event.action}{target} {event.args or ''}"
                )
            case ResourceSample():
                row = self.process(event.process)
                row.cpu_percent = event.cpu_percent
                row.rss_bytes = event.rss_bytes
                row.gpu_memory_bytes = event.gpu_memory_bytes
                self.metrics.add(f"rss_mb/{event.process}", event.t, None, event.rss_bytes / 2**20)
            case GpuSample():
                self.gpus[event.index] = event
                self.metrics.add(
                    f"gpu_memory_gb/{event.index}", event.t, None, event.memory_used_bytes / 1e9
                )
            case Notice():
                self.notices.append(event)
                if event.level != "debug":  # recorded, not shown (NVML absent on a CPU box)
                    self._event_line(event.t, f"[{event.level}] {event.message}")
                if event.message.startswith(RUN_ENDED) and self.outcome is None:
                    self.outcome = event.message.removeprefix(RUN_ENDED)

    def _sync_result(self, record: MetricsRecord) -> None:
        """A trainer step's sync result (its metrics, not the words of a notice: a warning
        about a slower sync is no failure)."""
        if SYNC_SUCCEEDED in record.data:
            self.sync_failure = None
        elif record.data.get(SYNC_FAILED):
            attempts = int(record.data[SYNC_FAILED])
            self.sync_failure = SyncFailure(t=record.t, step=record.step, attempts=attempts)

    def _progressed(self, record: MetricsRecord) -> bool:
        """A step record of the stalled process, past the step the stall was reported at."""
        stall = self.stall
        if stall is None or record.process != stall.process or record.step is None:
            return False
        return stall.step is None or record.step > stall.step

    def sync_status(self, statuses: Mapping[str, Any]) -> None:
        """Copy the supervisor's ``status()`` snapshot (authoritative for the table)."""
        for name, status in statuses.items():
            row = self.process(name)
            row.role = status.role
            row.state = State(status.state)
            row.pid = status.pid
            row.started_at = status.started_at
            row.restarts = status.restarts
            row.health = status.health
            row.failing = dict(status.failing)
            row.port = status.port
            row.external = getattr(status, "external", None)
            row.exit_code = status.exit_code
            row.last_reason = status.last_reason or ""
            row.incarnation = status.incarnation

    # -- helpers ----------------------------------------------------------------------

    def process(self, name: str) -> ProcessRow:
        row = self.processes.get(name)
        if row is None:
            row = self.processes[name] = ProcessRow(name=name)
            self.log(name)
        return row

    def log(self, name: str) -> LogBuffer:
        buffer = self.logs.get(name)
        if buffer is None:
            buffer = self.logs[name] = LogBuffer(self._max_log_lines)
        return buffer

    def _event_line(self, t: float, text: str) -> None:
        self.logs[SUPERVISOR_LOG].extend((f"{_clock_text(t)} {text}",))

    def step(self) -> int | None:
        """The trainer's latest optimizer step (from its per-step metrics)."""
        for name in TRAINER_STEP_METRICS:
            step = self.metrics.latest_step.get(name)
            if step is not None:
                return step
        return None

    def total_steps(self) -> int | None:
        total = self.metrics.latest.get("training_steps")
        return int(total) if total else None

    def eta_seconds(self) -> float | None:
        """Seconds left at the rate of the last :data:`ETA_STEPS` steps (``loss`` records).

        Recent steps only: a run's first steps drain the rollouts queued while the trainer
        loaded, several times faster than the steady rate, and a mean over them read "ETA
        0:14" with 35 s left.
        """
        total, points = self.total_steps(), self.metrics.series("loss")[-(ETA_STEPS + 1) :]
        if total is None or len(points) < 2:
            return None
        (t0, s0, _), (t1, s1, _) = points[0], points[-1]
        if s0 is None or s1 is None or s1 <= s0 or t1 <= t0:
            return None
        return max(0, total - s1) * (t1 - t0) / (s1 - s0)

    def served_weights(self) -> dict[str, str]:
        """What each inference process serves, by name, as the rollout API has it from the
        trainer (``<api>/served_version`` and ``served_incarnation``, scraped by the
        supervisor): ``v12`` (the weights of step 12), or ``pending`` for an incarnation
        the trainer has not pushed to yet (a restarted server serves what it started with
        until then). Absent where nothing is known."""
        api = next((row.name for row in self.processes.values() if row.role == "api"), None)
        latest = self.metrics.latest
        version = latest.get(f"{api}/served_version") if api is not None else None
        if version is None:
            return {}
        pushed_to = latest.get(f"{api}/served_incarnation")
        served = {}
        for row in self.processes.values():
            if row.role != "inference" or row.state is not State.READY:
                continue
            current = pushed_to is None or not row.incarnation or row.incarnation == pushed_to
            served[row.name] = f"v{version:.0f}" if current else "pending"
        return served

    def training(self) -> bool:
        """A trainer is alive and the run is not over."""
        return self.outcome is None and any(
            row.role == "trainer" and row.state in LIVE_STATES for row in self.processes.values()
        )
