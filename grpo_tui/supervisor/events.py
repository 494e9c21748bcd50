"""Typed events: everything the supervisor tells its subscribers (headless console, TUI, files).

Plain frozen dataclasses so that sinks can render them without knowing the supervisor, and
``to_json`` gives the one JSON shape used by ``events.jsonl`` and ``grpo-tui run --json``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class State(StrEnum):
    """Life-cycle of one supervised process: its one state value. The changes a life may
    make between them are the table in ``transitions.py``."""

    PENDING = "pending"  # started, not spawned yet (waiting for its dependencies)
    STARTING = "starting"  # spawned; its start gate or readiness probe not yet passed
    RUNNING = "running"  # spawned and past its gate; no readiness probe configured
    READY = "ready"  # readiness probe passed (the dependency condition process_healthy)
    UNHEALTHY = "unhealthy"  # a liveness or progress probe failed; being stopped to restart
    STOPPING = "stopping"  # a stop was asked; its process is being stopped
    KILLING = "killing"  # a kill was asked; its process is being SIGKILLed
    BACKOFF = "backoff"  # ended or could not spawn; waiting to restart
    COMPLETED = "completed"  # exited 0 and will not restart
    STOPPED = "stopped"  # stopped on request
    FAILED = "failed"  # failed for good: no restart left, or none would help


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of all events; ``t`` is wall-clock seconds since the epoch."""

    t: float = field(default_factory=time.time)

    @property
    def kind(self) -> str:
        return type(self).__name__

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class StateChanged(Event):
    process: str
    old: State
    new: State
    pid: int | None = None
    incarnation: int = 0
    """How many times the process had become ready, this change included: a change into
    ready carries the number of that incarnation (a restart request's reply names it)."""
    reason: str = ""
    exit_code: int | None = None


@dataclass(frozen=True, kw_only=True)
class ProcessPlanned(Event):
    """One process of the plan: sent for each at run start (in start order) and again when
    its spec is rebuilt, so that ``events.jsonl`` alone tells a viewer role, port, command."""

    process: str
    role: str
    port: int | None
    command: tuple[str, ...]
    external: str | None = None
    """The URL of a process that is not ours (the command attaches to it)."""


@dataclass(frozen=True, kw_only=True)
class ProbeResult(Event):
    process: str
    probe: str  # "readiness" | "liveness" | "progress"
    ok: bool
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class LogBatch(Event):
    """Lines a process printed since the last batch; ``dropped`` lines this subscriber missed."""

    process: str
    lines: tuple[str, ...]
    dropped: int = 0


@dataclass(frozen=True, kw_only=True)
class Restarting(Event):
    process: str
    attempt: int
    delay: float
    reason: str


@dataclass(frozen=True, kw_only=True)
class MetricsRecord(Event):
    """One metrics record a child sent on the control socket (``step`` may be None)."""

    process: str
    step: int | None
    data: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class RequestReceived(Event):
    """A control request from a child (e.g. one asking for another's restart)."""

    process: str
    action: str
    target: str | None
    args: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ResourceSample(Event):
    """CPU %, RSS and GPU memory of one process tree."""

    process: str
    cpu_percent: float
    rss_bytes: int
    gpu_memory_bytes: int | None = None


@dataclass(frozen=True, kw_only=True)
class GpuSample(Event):
    """One GPU (NVML's index, as ``nvidia-smi`` numbers it) and the processes holding it.

    ``holders``: supervised processes pinned to this GPU (``CUDA_VISIBLE_DEVICES``) or with
    memory on it, in name order.
    """

    index: int
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: float
    holders: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Notice(Event):
    """A message from the supervisor itself (mode switch progress, run finished, ...), or
    one a process sent it (``"<process>: ..."``).

    ``message`` is for people; what a program reads is ``code``, a stable name for what
    happened (``standby_adopted``, ``resumed``; empty for prose only), and ``data``, its
    values: tests and benchmarks read these, never the wording."""

    level: str  # "debug" | "info" | "warning" | "error"; debug: recorded, not shown
    message: str
    code: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class NeedLost(Event):
    """``process`` cannot go on: what it needs (``need``, e.g. ``at least 1 of feeder-0,
    feeder-1``) has failed for good. ``failed``: each such process's reason; ``last_lines``:
    the end of its output (where the real error usually is). ``action``: ``stop`` (the
    run ends) or ``wait`` (it goes on; a person may start the failed process again)."""

    process: str
    need: str
    action: str
    failed: dict[str, str] = field(default_factory=dict)
    last_lines: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class NeedRegained(Event):
    """``process`` has what it needs again (a failed process it needs was started again)."""

    process: str
    need: str


@dataclass(frozen=True, kw_only=True)
class Stalled(Event):
    """``process`` made no progress for ``seconds`` (its last step: ``step``); ``causes``
    are what its supervisor can see that explains it, most likely first."""

    process: str
    seconds: float
    step: int | None
    causes: tuple[str, ...]
