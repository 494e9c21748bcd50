"""Processes alive that make no progress: what the OS and the supervisor say of them.

A process tree with a stopped process in it (SIGSTOP, a debugger: psutil's state) is a
stall's cause whatever its symptoms elsewhere; an environment whose counters do not move
and that prints nothing is blocked (its OS state sleeping: a wait on what does not
answer, or a deadlock) or busy in a loop (running, or using half a core or more). Each is
described with its pid, since when it is quiet, its CPU use (the supervisor's resource
samples) and its last line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import psutil

from grpo_tui.stack.progress import COUNTED, Progress
from grpo_tui.supervisor.events import LogBatch, ResourceSample, State
from grpo_tui.supervisor.record import ProcessStatus

LINE_CHARS = 240
"""The most of a process's last line a cause quotes."""
STOPPED_STATES = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
BUSY_CPU = 50.0
"""CPU % (of one core, the process tree's) from which a process without progress is busy,
not blocked (as is one the OS finds running: on a loaded machine a loop may get less)."""
LIVE = (State.READY, State.RUNNING, State.UNHEALTHY)


@dataclass
class Activity:
    """What the supervisor saw each process do lately: output, CPU use."""

    output_at: dict[str, float] = field(default_factory=dict)
    """When each process last printed a line."""
    cpu: dict[str, float] = field(default_factory=dict)
    """Each process tree's CPU % at the supervisor's last resource sample."""

    def fold(self, event: LogBatch | ResourceSample) -> None:
        if isinstance(event, LogBatch):
            if event.lines:
                self.output_at[event.process] = event.t
        else:
            self.cpu[event.process] = event.cpu_percent


@dataclass(frozen=True)
class Look:
    """What the OS says of a process tree: the leader's state, and a stopped process in it."""

    state: str
    stopped: int | None = None
    """The pid of a stopped process of the tree (the leader's own, or a descendant's)."""
    stopped_state: str = ""


def look(pid: int) -> Look | None:
    """The OS's view of the tree led by ``pid`` (None: gone)."""
    try:
        leader = psutil.Process(pid)
        state = leader.status()
        tree = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return None
    for proc in tree:
        try:
            status = proc.status()
        except psutil.Error:
            continue
        if status in STOPPED_STATES:
            return Look(state, proc.pid, status)
    return Look(state)


@dataclass(frozen=True)
class Quiet:
    """How to describe one process that makes no progress: since when, its last line."""

    since: float
    cpu: float | None
    line: str | None

    def describe(self, now: float) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(self.since))
        cpu = "CPU not sampled yet" if self.cpu is None else f"{self.cpu:.0f}% CPU"
        said = f"; its last line: {self.line[:LINE_CHARS]}" if self.line else ""
        return f"quiet since {clock} ({now - self.since:.0f} s), {cpu}{said}"


def stopped_causes(
    statuses: Mapping[str, ProcessStatus],
    looks: Mapping[str, Look],
    quiet: Callable[[str], Quiet],
    now: float,
) -> dict[str, str]:
    """Processes alive whose tree holds a stopped process, by name: the stall's cause
    whatever else (a liveness probe, the environments' counts) shows its symptoms."""
    causes = {}
    for name, status in statuses.items():
        seen = looks.get(name)
        if status.state not in LIVE or seen is None or seen.stopped is None:
            continue
        child = "" if seen.stopped == status.pid else f", a child of pid {status.pid}"
        causes[name] = (
            f"{name} (pid {seen.stopped}{child}) is stopped (OS state {seen.stopped_state}: "
            f"SIGSTOP or a debugger; SIGCONT resumes it), {quiet(name).describe(now)}"
        )
    return causes


def quiet_env_causes(
    statuses: Mapping[str, ProcessStatus],
    looks: Mapping[str, Look],
    quiet: Callable[[str], Quiet],
    progress: Progress,
    now: float,
    after: float,
) -> list[str]:
    """Environments alive that made no progress since the trainer's last step and were
    quiet (no group, no error, no line) for ``after`` s: blocked or busy, as their OS
    state and CPU use say."""
    causes = []
    for name, status in statuses.items():
        seen = looks.get(name)
        if status.role != "env" or status.state not in LIVE or seen is None:
            continue
        moved = sum(progress.env_delta(key, name) for key in COUNTED)
        still = quiet(name)
        if moved or now - still.since < after:
            continue
        busy = seen.state == psutil.STATUS_RUNNING or (still.cpu or 0.0) >= BUSY_CPU
        doing = (
            "busy in a loop without output"
            if busy
            else "blocked: waiting on what does not answer, or deadlocked"
        )
        causes.append(
            f"{name} (pid {status.pid}) made no progress (no group, no error, no output): "
            f"OS state {seen.state}, {doing}; {still.describe(now)}"
        )
    return causes
