"""The supervisor's record of one process: its one state and the checked way it changes.

A :class:`ProcessRecord` holds what the rest of the supervisor reads of a process (its
spec, state, current child, counters, health, its ``status()``) and the one way its state
changes, :meth:`ProcessRecord.transition`, checked against the table in
``transitions.py``. What changes it: the life task and the operations of
``lifecycle.ProcessLife`` (a record with the task that runs it), and the incarnation's run
of ``incarnation.py``.

What a life needs from the supervisor around it (publishing, spawning with the run's
environment, probing, the time, run-end accounting) comes in :class:`Hooks`, so that a test
drives a life with a fake spawn and a fake clock (``tests/supervisor/fakes.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from grpo_tui.supervisor import probes
from grpo_tui.supervisor.clock import WALL, Clock
from grpo_tui.supervisor.events import Event, Notice, ProbeResult, State, StateChanged
from grpo_tui.supervisor.health import SELF, Health
from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.ports import find_port_holder
from grpo_tui.supervisor.process import Child
from grpo_tui.supervisor.spec import Condition, ProcessSpec
from grpo_tui.supervisor.standby import Spawn, Standby
from grpo_tui.supervisor.transitions import ALIVE, STOPPING, check

PROBED = frozenset({State.RUNNING, State.READY})
"""States whose probe results tell the process's health (not one being stopped)."""
REPORTING = frozenset({State.STARTING, State.RUNNING, State.READY})
"""States whose own health reports count (it runs, and is not being stopped)."""


@dataclass(frozen=True)
class ProcessStatus:
    """A snapshot of one process, for tables and status replies."""

    name: str
    role: str
    state: State
    pid: int | None
    started_at: float | None
    restarts: int
    port: int | None
    health: str | None
    """``ok`` or ``failing`` by the last result of each of its checks while it runs (its
    liveness and progress probes, its own report: ``health.py``); None when nothing tells
    (no result yet, or it is not running: stopping, stopped)."""
    exit_code: int | None
    last_reason: str
    incarnation: int
    """How many times it became ready in this run: the number of the ready one."""
    external: str | None = None
    """The URL of a process that is not ours (``spec.External``): no pid, never signalled."""
    down_since: float | None = None
    """When it last stopped being ready (None while ready, and before it first was)."""
    failing: Mapping[str, str] = field(default_factory=dict)
    """``check -> what it saw`` for each failing check: ``liveness``, ``progress`` (a
    probe), ``self`` (its own report)."""


def port_held(spec: ProcessSpec) -> str | None:
    """Why ``spec`` cannot start at all: its port is held (by whom), or None."""
    if spec.port is None:
        return None
    holder = find_port_holder(spec.port)
    return holder.describe() if holder is not None else None


@dataclass(frozen=True)
class Hooks:
    """What a life needs from the supervisor: shared by every process of one run."""

    publish: Callable[[Event], None]
    closing: Callable[[], bool]
    """True once the run's shutdown has begun: nothing starts or restarts any more."""
    spawn: Spawn
    """``ChildProcess.spawn`` with the run's environment and the watchdog's announcements
    (the third argument: a tag other than the spec's name, for a standby)."""
    prober: probes.Prober
    flush_logs: Callable[[], None]
    changed: Callable[[ProcessRecord], None]
    """Called after every state change (run-end accounting)."""
    peer: Callable[[str], ProcessRecord]
    refresh: Callable[[str], ProcessSpec] | None
    """The newest spec of a process before a crash restart (None: keep the last)."""
    preflight: Callable[[ProcessSpec], str | None] = port_held
    """Why a spec cannot start at all, which no retry mends (None: it may)."""
    clock: Clock = WALL


async def until(predicate: Callable[[], bool], *records: ProcessRecord) -> None:
    """Wait until ``predicate()`` holds, re-checking on each state change of ``records``."""
    while not predicate():
        waiters = [asyncio.ensure_future(record.changed.wait()) for record in records]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


class ProcessRecord:
    """One process as the supervisor knows it (module docstring)."""

    def __init__(self, spec: ProcessSpec, sink: OutputSink, hooks: Hooks) -> None:
        self.spec = spec
        self.sink = sink
        self.hooks = hooks
        self.state = State.PENDING
        self.child: Child | None = None
        self.restarts = 0
        """Restarts by the restart policy in this run (never reset)."""
        self.started_at: float | None = None
        self.ready_at = 0.0  # when it last became ready (its counters start before)
        self.down_since: float | None = None  # when it last stopped being ready
        self.incarnation = 0  # how many times it became ready
        self.exit_code: int | None = None
        self.last_reason = ""
        self.checks = Health()
        """The last result of each of its checks in this incarnation."""
        self.changed = asyncio.Event()
        self.reprobe = asyncio.Event()
        """Set when a replaced spec changes the health probes of a running process."""
        log = sink.file.path.with_name(f"{spec.name}.standby.log")
        self.standby = Standby(spec.name, log, hooks.spawn, hooks.publish)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ready(self) -> bool:
        if self.state == State.READY:
            return True
        return self.state == State.RUNNING and self.spec.readiness is None

    @property
    def running(self) -> bool:
        """Its child is alive."""
        return self.child is not None and self.child.returncode is None

    @property
    def health(self) -> str | None:
        """``ok``, ``failing``, or None (``ProcessStatus.health``)."""
        return self.checks.value

    @property
    def stopping(self) -> bool:
        """A stop or a kill was asked and the life has not ended yet."""
        return self.state in STOPPING

    def status(self) -> ProcessStatus:
        child = self.child
        return ProcessStatus(
            name=self.name,
            role=self.spec.role,
            state=self.state,
            pid=child.pid if child is not None and self.running else None,
            started_at=self.started_at,
            restarts=self.restarts,
            incarnation=self.incarnation,
            port=self.spec.port,
            health=self.health,
            exit_code=self.exit_code,
            last_reason=self.last_reason,
            external=self.spec.external.url if self.spec.external is not None else None,
            down_since=self.down_since,
            failing=self.checks.failing,
        )

    async def until(self, predicate: Callable[[], bool], *others: ProcessRecord) -> None:
        """Wait until ``predicate()`` holds, re-checking on each state change of this
        process (and of ``others``)."""
        await until(predicate, self, *others)

    async def first(self, *waits: asyncio.Future[object]) -> None:
        """Wait until one of ``waits`` is done or a stop is asked."""
        stop = asyncio.ensure_future(self.until(lambda: self.stopping))
        try:
            await asyncio.wait({*waits, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()

    async def failed_dependency(self) -> str:
        """Wait for every dependency's condition (or a stop asked); the reason one failed
        for good, else ''."""
        for dep_name, dependency in self.spec.depends_on.items():
            dep = self.hooks.peer(dep_name)
            cond = dependency.condition

            def settled(dep: ProcessRecord = dep, cond: Condition = cond) -> bool:
                return condition_met(dep, cond) or dep.state is State.FAILED or self.stopping

            await until(settled, dep, self)
            if self.stopping:
                return ""
            if not condition_met(dep, cond):
                return f"dependency {dep_name} failed: {dep.last_reason}"
        return ""

    def checked(self, check: str, ok: bool, message: str) -> None:
        """The result of one of its checks: its health, and an event when it changed."""
        if self.checks.record(check, ok, message):
            self.hooks.publish(ProbeResult(process=self.name, probe=check, ok=ok, message=message))

    def report_health(self, ok: bool, reason: str) -> None:
        """Its own word on its health (the control socket's ``health`` record): a check
        like its probes, until its next report or the end of this incarnation. No state
        changes; dropped unless it runs (a report as a stop begins says nothing)."""
        if self.state in REPORTING:
            self.checked(SELF, ok, reason)

    def keep_standby(self) -> None:
        """Have a standby spawned for the next start (if the spec keeps one; once)."""
        if self.spec.standby and not self.stopping and not self.hooks.closing():
            self.standby.keep(self.spec)

    def transition(
        self,
        new: State,
        *,
        reason: str = "",
        pid: int | None = None,
        exit_code: int | None = None,
    ) -> None:
        """Change the state to ``new``: checked against the table (``TransitionError``
        names the pair), published, and every waiter on this process woken."""
        old, was_ready = self.state, self.ready
        check(self.name, old, new)
        self.state = new
        if new not in ALIVE:
            self.checks.clear()
        if self.ready and not was_ready:
            self.ready_at = self.hooks.clock.now()
            self.incarnation += 1
            self.down_since = None
        elif was_ready and not self.ready:
            self.down_since = self.hooks.clock.now()
        self.last_reason = reason or self.last_reason
        if exit_code is not None:
            self.exit_code = exit_code
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()
        child_pid = pid if pid is not None else (self.child.pid if self.child else None)
        self.hooks.publish(
            StateChanged(
                process=self.name,
                old=old,
                new=new,
                pid=child_pid,
                incarnation=self.incarnation,
                reason=reason,
                exit_code=exit_code if exit_code is not None else self.exit_code,
            )
        )
        self.hooks.changed(self)

    def report_survivors(self, survivors: Sequence[object]) -> None:
        if survivors:
            pids = ", ".join(str(getattr(p, "pid", p)) for p in survivors)
            self.notice(f"could not kill pids {pids}", "error")

    def notice(self, message: str, level: str = "info") -> None:
        self.hooks.publish(Notice(level=level, message=f"{self.name}: {message}"))


def condition_met(dep: ProcessRecord, cond: Condition) -> bool:
    """Whether ``dep`` satisfies a dependent's ``cond``."""
    match cond:
        case Condition.STARTED:
            return dep.state in ALIVE or dep.state == State.COMPLETED
        case Condition.HEALTHY:
            return dep.ready or dep.state == State.COMPLETED
        case Condition.COMPLETED:
            return dep.state == State.COMPLETED
    return False
