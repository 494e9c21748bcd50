"""One process's life: wait for its dependencies, spawn, probe, wait, apply the restart policy.

Each process has one life task. It waits for its dependencies (event-driven: every state
change wakes the waiters, no polling), spawns the child, runs its probes, waits for it to end
and applies the restart policy. Operations set the wish (``stop_requested``, ``wake``) and
let the task act on it, so that one place decides what a process does. What the task needs
from the supervisor around it (publishing, spawning with the run's environment, the HTTP
client of the probes, run-end accounting) comes in :class:`Hooks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from grpo_tui.supervisor import probes
from grpo_tui.supervisor.events import (
    Event,
    Notice,
    ProbeResult,
    ProcessPlanned,
    Restarting,
    State,
    StateChanged,
)
from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.ports import find_port_holder
from grpo_tui.supervisor.process import ChildProcess, SpawnError, describe_exit
from grpo_tui.supervisor.spec import Condition, ProcessSpec
from grpo_tui.supervisor.standby import Spawn, Standby
from grpo_tui.supervisor.steps import job_trouble

ALIVE = {State.STARTING, State.RUNNING, State.READY, State.UNHEALTHY}


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
    exit_code: int | None
    last_reason: str
    incarnation: int
    """How many times it became ready in this run: the number of the ready one."""


@dataclass(frozen=True)
class Hooks:
    """What a life needs from the supervisor: shared by every process of one run."""

    publish: Callable[[Event], None]
    closing: Callable[[], bool]
    """True once the run's shutdown has begun: nothing starts or restarts any more."""
    spawn: Spawn
    """``ChildProcess.spawn`` with the run's environment and the watchdog's announcements
    (the third argument: a tag other than the spec's name, for a standby)."""
    client: Callable[[], asyncio.Future[httpx.AsyncClient]]
    flush_logs: Callable[[], None]
    changed: Callable[[ProcessLife], None]
    """Called after every state change (run-end accounting)."""
    peer: Callable[[str], ProcessLife]
    refresh: Callable[[str], ProcessSpec] | None
    """The newest spec of a process before a crash restart (None: keep the last)."""


class ProcessLife:
    """The supervisor's record of one process and the task that runs it."""

    def __init__(self, spec: ProcessSpec, sink: OutputSink, hooks: Hooks) -> None:
        self.spec = spec
        self.sink = sink
        self.hooks = hooks
        self.state = State.PENDING
        self.child: ChildProcess | None = None
        self.task: asyncio.Task[None] | None = None
        self.restarts = 0
        self.attempt = 0
        self.started_at: float | None = None
        self.ready_at = 0.0  # when it last became ready (its counters start before)
        self.incarnation = 0  # how many times it became ready
        self.exit_code: int | None = None
        self.last_reason = ""
        self.health: str | None = None
        self.gave_up = False
        self.lost: str | None = None  # why its Slurm job can run it no more
        self.stop_requested = False
        self.wake = asyncio.Event()
        self.changed = asyncio.Event()
        self.lock = asyncio.Lock()  # one start/stop/restart at a time
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
    def active(self) -> bool:
        """Its life task has not ended (waiting, running or in backoff)."""
        return self.task is not None and not self.task.done()

    @property
    def ending(self) -> bool:
        """Its life is over (failed for good or completed) and its task only tidies up
        (stops its standby): a start must wait for that, not take it for a live one."""
        return self.active and (self.gave_up or self.state == State.COMPLETED)

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
        )

    # ------------------------------------------------------------------ operations

    def launch(self) -> None:
        """Start the life task afresh (PENDING, then waiting for the dependencies)."""
        self.stop_requested = False
        self.gave_up = False
        self.lost = None
        self.wake = asyncio.Event()
        if self.state != State.PENDING:
            self.set_state(State.PENDING, reason="start requested")
        self.task = asyncio.create_task(self._life(), name=f"life:{self.name}")

    async def stop(self, *, keep_standby: bool = False) -> None:
        """Shutdown signal, timeout, SIGKILL, confirm; with the operation lock held. Its
        standby is stopped too unless ``keep_standby`` (a restart, which adopts it)."""
        self.stop_requested = True
        self.wake.set()
        child = self.child
        if child is not None and child.returncode is None and self.state in ALIVE:
            self.set_state(State.STOPPING, reason="stop requested")
            survivors = await child.stop(self.spec.shutdown.signum, self.spec.shutdown.timeout)
            self.report_survivors(survivors)
        if self.task is not None:
            await asyncio.shield(self.task)
        if self.state not in (State.COMPLETED, State.FAILED, State.STOPPED):
            self.set_state(State.STOPPED, reason="stopped on request")
        if not keep_standby:
            await self.standby.discard()

    async def kill_now(self) -> None:
        """SIGKILL the process and its descendants without waiting for the lock."""
        self.stop_requested = True
        self.wake.set()
        if self.child is not None and self.child.returncode is None:
            self.set_state(State.STOPPING, reason="kill requested")
            self.report_survivors(await self.child.kill())
        await self.standby.discard(signal.SIGKILL)

    def replace_spec(self, spec: ProcessSpec) -> None:
        """Use ``spec`` from the next start on (a changed one is published as planned)."""
        if spec != self.spec:
            self.hooks.publish(planned(spec))
        self.spec = spec

    async def until(self, predicate: Callable[[], bool], also: asyncio.Event | None = None) -> None:
        """Wait until ``predicate()`` holds, re-checking on each state change of this
        process (and when ``also`` is set)."""
        while not predicate():
            waiters = {asyncio.ensure_future(self.changed.wait())}
            if also is not None:
                waiters.add(asyncio.ensure_future(also.wait()))
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    # ------------------------------------------------------------------- the task

    async def _life(self) -> None:
        try:
            await self._live()
        finally:
            if self.gave_up or self.state == State.COMPLETED:
                await self.standby.discard()  # nothing will start it any more

    async def _live(self) -> None:
        if not self.spec.prestart and not await self._dependencies_met():
            return
        while not self.stop_requested and not self.hooks.closing():
            code, reason, lasted = await self._run_once()
            if self.stop_requested or self.gave_up:
                return
            if self.lost is not None:
                self._give_up(f"{reason}; {self.lost}: not restarted", code)
                return
            policy = self.spec.restart
            if lasted >= policy.reset_after:
                self.attempt = 0
            if code == 0 and policy.policy != "always":
                self.set_state(State.COMPLETED, reason=reason, exit_code=0)
                return
            if policy.policy == "no" or (code == 0 and policy.policy == "on_failure"):
                self._give_up(reason, code)
                return
            if self.attempt >= policy.max_restarts:
                self._give_up(f"{reason}; gave up after {self.attempt} restarts", code)
                return
            delay = policy.delay(self.attempt)
            self.attempt += 1
            self.restarts += 1
            self.hooks.publish(
                Restarting(process=self.name, attempt=self.attempt, delay=delay, reason=reason)
            )
            self.set_state(State.BACKOFF, reason=f"{reason}; restart in {delay:g} s")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.wake.wait()
            if not self.stop_requested and not self.hooks.closing():
                self._refresh_spec()

    def _refresh_spec(self) -> None:
        """Before a crash restart: the newest spec (e.g. a server on the latest adapter);
        if building it raises, say so and keep the last spec."""
        if self.hooks.refresh is None:
            return
        try:
            spec = self.hooks.refresh(self.name)
        except Exception as exc:  # the callback is the plan's code; a restart must go on
            self._notice(f"respec failed, restarting with the last spec: {exc}", "warning")
            return
        self.replace_spec(spec)

    def _give_up(self, reason: str, code: int | None) -> None:
        self.gave_up = True
        self.set_state(State.FAILED, reason=reason, exit_code=code)

    async def _dependencies_met(self) -> bool:
        """Wait for every dependency's condition; False (and FAILED) if one fails for good."""
        failed = await self._failed_dependency()
        if failed:
            self._give_up(failed, None)
        return not failed and not self.stop_requested

    async def _failed_dependency(self) -> str:
        """Wait for every dependency's condition (or a stop request); the reason one failed
        for good, else ''."""
        for dep_name, dependency in self.spec.depends_on.items():
            dep = self.hooks.peer(dep_name)
            cond = dependency.condition

            def settled(dep: ProcessLife = dep, cond: Condition = cond) -> bool:
                return condition_met(dep, cond) or dep.gave_up or self.stop_requested

            await dep.until(settled, also=self.wake)
            if self.stop_requested:
                return ""
            if not condition_met(dep, cond):
                return f"dependency {dep_name} failed: {dep.last_reason}"
        return ""

    async def _run_once(self) -> tuple[int | None, str, float]:
        """One incarnation: preflight, spawn, probe, wait. (exit code, reason, seconds run)."""
        spec = self.spec
        if spec.port is not None and (holder := find_port_holder(spec.port)) is not None:
            self._give_up(f"{holder.describe()}: not retried", None)  # it will not leave
            return None, holder.describe(), 0.0
        matcher = None
        if spec.readiness is not None and spec.readiness.kind == "log_line":
            matcher = probes.LogMatcher(spec.readiness.pattern)
        self.sink.on_line = matcher
        self.sink.file.open()
        adopted = await self.standby.adopt(spec, self.sink)
        if adopted is not None:
            child, exited, command = adopted
        else:
            try:
                child = await self.hooks.spawn(spec, self.sink, None)
            except SpawnError as exc:
                if exc.permanent:
                    self._give_up(f"{exc.reason}: not retried", None)
                else:
                    self.set_state(State.FAILED, reason=exc.reason)
                return None, exc.reason, 0.0
            exited, command = asyncio.create_task(child.wait()), None
        self.child = child
        self.started_at = child.started_at
        if self.stop_requested:
            await child.stop(spec.shutdown.signum, spec.shutdown.timeout)
        self.health = None
        first = State.STARTING if spec.readiness is not None else State.RUNNING
        self.set_state(first, pid=child.pid, reason="standby" if adopted else "spawned")
        if spec.prestart and not await self._gate_opened(child, exited, command):
            code = await exited
            self.sink.on_line = None
            self.exit_code = code
            self.hooks.flush_logs()
            asked = self.gave_up or self.stop_requested  # else it exited on its own
            reason = self.last_reason if asked else describe_exit(code)
            return code, reason, time.time() - child.started_at
        if adopted:  # a restart: the next may come soon, so its standby imports meanwhile
            self._keep_standby()
        watcher = asyncio.create_task(self._watch_probes(matcher))
        await asyncio.wait({exited, watcher}, return_when=asyncio.FIRST_COMPLETED)
        reason = ""
        if watcher.done() and not exited.done():
            reason = f"liveness probe failed: {watcher.result()}"
            self.set_state(State.UNHEALTHY, reason=reason)
            if not self.stop_requested:
                self.set_state(State.STOPPING, reason="restarting: liveness failed")
                survivors = await child.stop(spec.shutdown.signum, spec.shutdown.timeout)
                self.report_survivors(survivors)
        watcher.cancel()
        code = await exited
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        self.sink.on_line = None
        self.exit_code = code
        if spec.slurm_step is not None and not self.stop_requested:
            # A step ended unasked (even with 0: Slurm's SIGTERM to a lost node's job lets
            # the process stop cleanly): if the job lost a node, nothing can come back.
            self.lost = await asyncio.to_thread(job_trouble)
        self.hooks.flush_logs()
        return code, reason or describe_exit(code), time.time() - child.started_at

    async def _gate_opened(
        self, child: ChildProcess, exited: asyncio.Task[int], command: list[str] | None
    ) -> bool:
        """A ``prestart`` child runs its imports while its dependencies come up; open its
        start gate once they are met (handing an adopted standby its ``command``). False
        when it exited first, a stop was requested (the stop ends it) or a dependency
        failed (it is stopped here, the process FAILED)."""
        deps = asyncio.create_task(self._failed_dependency())
        await asyncio.wait({exited, deps}, return_when=asyncio.FIRST_COMPLETED)
        if not deps.done():
            deps.cancel()
            return False
        failed = deps.result()
        if self.stop_requested:
            return False
        if not failed:
            await child.open_gate(command)
            return True
        if not exited.done():
            survivors = await child.stop(self.spec.shutdown.signum, self.spec.shutdown.timeout)
            self.report_survivors(survivors)
        self._give_up(failed, None)
        return False

    def _keep_standby(self) -> None:
        """Have a standby spawned for the next start (if the spec keeps one; once)."""
        if self.spec.standby and not self.stop_requested and not self.hooks.closing():
            self.standby.keep(self.spec)

    async def _watch_probes(self, matcher: probes.LogMatcher | None) -> str:
        """Readiness (-> READY), then liveness; returns the liveness failure message."""
        client = self.hooks.client()
        spec, name = self.spec, self.name
        if spec.readiness is not None:

            def ready_report(ok: bool, message: str) -> None:
                self.hooks.publish(
                    ProbeResult(process=name, probe="readiness", ok=ok, message=message)
                )

            await probes.wait_ready(spec.readiness, client, ready_report, matcher)
            self.health = "ok"
            self.set_state(State.READY, reason="readiness probe passed")
        self._keep_standby()  # (a first start's waits until here: no competing imports)
        if spec.liveness is None:
            await asyncio.Event().wait()
        assert spec.liveness is not None

        def live_report(ok: bool, message: str) -> None:
            self.health = "ok" if ok else "failing"
            self.hooks.publish(ProbeResult(process=name, probe="liveness", ok=ok, message=message))

        return await probes.watch_liveness(spec.liveness, client, live_report)

    # --------------------------------------------------------------------- events

    def set_state(
        self,
        new: State,
        *,
        reason: str = "",
        pid: int | None = None,
        exit_code: int | None = None,
    ) -> None:
        old, was_ready = self.state, self.ready
        self.state = new
        if self.ready and not was_ready:
            self.ready_at = time.time()
            self.incarnation += 1
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
            self._notice(f"could not kill pids {pids}", "error")

    def _notice(self, message: str, level: str = "info") -> None:
        self.hooks.publish(Notice(level=level, message=f"{self.name}: {message}"))


def condition_met(dep: ProcessLife, cond: Condition) -> bool:
    """Whether ``dep`` satisfies a dependent's ``cond``."""
    match cond:
        case Condition.STARTED:
            return dep.state in ALIVE or dep.state == State.COMPLETED
        case Condition.HEALTHY:
            return dep.ready or dep.state == State.COMPLETED
        case Condition.COMPLETED:
            return dep.state == State.COMPLETED
    return False


def planned(spec: ProcessSpec) -> ProcessPlanned:
    """The event that says what a process will run (``events.jsonl`` starts with these)."""
    return ProcessPlanned(
        process=spec.name, role=spec.role, port=spec.port, command=tuple(spec.command)
    )
