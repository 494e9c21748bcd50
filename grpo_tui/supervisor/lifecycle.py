"""One process's life: a state machine driven by one task.

A life has one state (``events.State``) and changes it only through
:meth:`ProcessLife.transition`, checked against the table in ``transitions.py``. Its task
waits for the dependencies (event-driven: every state change wakes the waiters, no
polling), spawns the child (or adopts its standby), opens its start gate, runs its probes,
waits for it to end and applies the restart policy. An operation changes the state only to
ask: a start (an ended state -> PENDING, a new task) or a stop (-> STOPPING); the task acts
on a stop at its next step (it looks at the state after each of its waits), stops the
probes, then the child, and ends in STOPPED. So one place decides what a process does, and
nothing else is state: the restart counters are counters, kept here.

What the task needs from the supervisor around it (publishing, spawning with the run's
environment, probing, the time, run-end accounting) comes in :class:`Hooks`, so that a test
drives a life with a fake spawn and a fake clock (``tests/supervisor/fakes.py``).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grpo_tui.supervisor import probes
from grpo_tui.supervisor.clock import WALL, Clock
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
from grpo_tui.supervisor.process import Child, SpawnError, describe_exit
from grpo_tui.supervisor.spec import Condition, ProcessSpec
from grpo_tui.supervisor.standby import Spawn, Standby
from grpo_tui.supervisor.steps import job_trouble
from grpo_tui.supervisor.transitions import ALIVE, EDGES, ENDED, check

PROBED = frozenset({State.RUNNING, State.READY})
"""States whose probe results tell the process's health (not one being stopped)."""


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
    """``ok`` or ``failing`` by its last liveness or progress probe while it runs; None
    when nothing tells (no probe result yet, or it is not running: stopping, stopped)."""
    exit_code: int | None
    last_reason: str
    incarnation: int
    """How many times it became ready in this run: the number of the ready one."""


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
    changed: Callable[[ProcessLife], None]
    """Called after every state change (run-end accounting)."""
    peer: Callable[[str], ProcessLife]
    refresh: Callable[[str], ProcessSpec] | None
    """The newest spec of a process before a crash restart (None: keep the last)."""
    preflight: Callable[[ProcessSpec], str | None] = port_held
    """Why a spec cannot start at all, which no retry mends (None: it may)."""
    clock: Clock = WALL


@dataclass(frozen=True)
class Ended:
    """How an incarnation ended, for the restart policy."""

    code: int | None
    """Its exit code; None when it could not be spawned."""
    reason: str
    lasted: float
    unhealthy: bool = False
    """A probe failed and it was stopped for it: a failure whatever its exit code."""
    lost: str | None = None
    """Why its Slurm job can run it no more (a node lost): not worth a restart."""


async def until(predicate: Callable[[], bool], *lives: ProcessLife) -> None:
    """Wait until ``predicate()`` holds, re-checking on each state change of ``lives``."""
    while not predicate():
        waiters = [asyncio.ensure_future(life.changed.wait()) for life in lives]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


class ProcessLife:
    """The supervisor's record of one process and the task that runs it."""

    def __init__(self, spec: ProcessSpec, sink: OutputSink, hooks: Hooks) -> None:
        self.spec = spec
        self.sink = sink
        self.hooks = hooks
        self.state = State.PENDING
        self.child: Child | None = None
        self.task: asyncio.Task[None] | None = None
        self.restarts = 0
        """Restarts by the restart policy in this run (never reset)."""
        self._attempts = 0
        """Restarts since the last start asked for or the last run of ``reset_after`` s:
        what ``max_restarts`` caps."""
        self.started_at: float | None = None
        self.ready_at = 0.0  # when it last became ready (its counters start before)
        self.incarnation = 0  # how many times it became ready
        self.exit_code: int | None = None
        self.last_reason = ""
        self.health: str | None = None
        self.changed = asyncio.Event()
        self._reprobe = asyncio.Event()
        """Set when a replaced spec changes the health probes of a running process."""
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
        """Its life task has not ended (waiting, running, in backoff, or tidying up)."""
        return self.task is not None and not self.task.done()

    @property
    def stopping(self) -> bool:
        """A stop was asked and the life has not ended yet."""
        return self.state is State.STOPPING

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
        that has ended stays as it is. Its standby is stopped too unless ``keep_standby``
        (a restart, which adopts it)."""
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
        ends in STOPPED (``Supervisor.kill`` waits for that with a stop)."""
        if self.state not in ENDED and not self.stopping:
            self.transition(State.STOPPING, reason="kill requested")
        child = self.child
        if child is not None and child.returncode is None:
            self._report_survivors(await child.kill())
        await self.standby.discard(signal.SIGKILL)

    def replace_spec(self, spec: ProcessSpec) -> None:
        """Use ``spec`` from the next start on (a changed one is published as planned); its
        liveness and progress probes at once, where the process runs (a mode switched in
        place may turn one off)."""
        if spec != self.spec:
            self.hooks.publish(planned(spec))
        if (spec.liveness, spec.progress) != (self.spec.liveness, self.spec.progress):
            self._reprobe.set()
        self.spec = spec

    async def until(self, predicate: Callable[[], bool], *others: ProcessLife) -> None:
        """Wait until ``predicate()`` holds, re-checking on each state change of this
        process (and of ``others``)."""
        await until(predicate, self, *others)

    # ------------------------------------------------------------------- the task

    async def _life(self) -> None:
        try:
            await self._live()
        except Exception as exc:  # a bug here: said, and the process is not left running
            self._notice(f"its life ended on an internal error: {exc!r}", "error")
            if self.child is not None and self.child.returncode is None:
                self._report_survivors(await self.child.kill())
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
            ended = await self._incarnation()
            if ended is None:  # a stop asked, or failed for good
                return
            delay = self._apply_policy(ended)
            if delay is None or not await self._back_off(delay):
                return
            if not self.hooks.closing():
                self._refresh_spec()

    def _apply_policy(self, ended: Ended) -> float | None:
        """The restart policy on an incarnation's end: the backoff before the next one
        (BACKOFF, with a ``Restarting`` event), or None where the life ends (COMPLETED or
        FAILED)."""
        policy = self.spec.restart
        if ended.lost is not None:
            reason = f"{ended.reason}; {ended.lost}: not restarted"
            self.transition(State.FAILED, reason=reason, exit_code=ended.code)
            return None
        if ended.lasted >= policy.reset_after:
            self._attempts = 0
        if ended.code == 0 and not ended.unhealthy and policy.policy != "always":
            self.transition(State.COMPLETED, reason=ended.reason, exit_code=0)
            return None
        if policy.policy == "no":
            self.transition(State.FAILED, reason=ended.reason, exit_code=ended.code)
            return None
        if self._attempts >= policy.max_restarts:
            reason = f"{ended.reason}; gave up after {self._attempts} restarts"
            self.transition(State.FAILED, reason=reason, exit_code=ended.code)
            return None
        delay = policy.delay(self._attempts)
        self._attempts += 1
        self.restarts += 1
        self.hooks.publish(
            Restarting(process=self.name, attempt=self._attempts, delay=delay, reason=ended.reason)
        )
        self.transition(State.BACKOFF, reason=f"{ended.reason}; restart in {delay:g} s")
        return delay

    async def _back_off(self, delay: float) -> bool:
        """Wait ``delay`` seconds; False when a stop was asked meanwhile."""
        sleeping = asyncio.ensure_future(self.hooks.clock.sleep(delay))
        try:
            await self._first(sleeping)
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
            self._notice(f"respec failed, restarting with the last spec: {exc}", "warning")
            return
        self.replace_spec(spec)

    async def _first(self, *waits: asyncio.Future[object]) -> None:
        """Wait until one of ``waits`` is done or a stop is asked."""
        stop = asyncio.ensure_future(self.until(lambda: self.stopping))
        try:
            await asyncio.wait({*waits, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()

    async def _dependencies_met(self) -> bool:
        """Wait for every dependency's condition; False when a stop came first or one
        failed for good (then FAILED)."""
        failed = await self._failed_dependency()
        if self.stopping:
            return False
        if failed:
            self.transition(State.FAILED, reason=failed)
        return not failed

    async def _failed_dependency(self) -> str:
        """Wait for every dependency's condition (or a stop asked); the reason one failed
        for good, else ''."""
        for dep_name, dependency in self.spec.depends_on.items():
            dep = self.hooks.peer(dep_name)
            cond = dependency.condition

            def settled(dep: ProcessLife = dep, cond: Condition = cond) -> bool:
                return condition_met(dep, cond) or dep.state is State.FAILED or self.stopping

            await until(settled, dep, self)
            if self.stopping:
                return ""
            if not condition_met(dep, cond):
                return f"dependency {dep_name} failed: {dep.last_reason}"
        return ""

    async def _incarnation(self) -> Ended | None:
        """One incarnation: preflight, spawn (or adopt the standby), start gate, probes,
        wait. How it ended, for the restart policy; None where the life ends here (a stop
        asked: STOPPING; or failed for good: FAILED)."""
        spec = self.spec
        if (held := self.hooks.preflight(spec)) is not None:
            self.transition(State.FAILED, reason=f"{held}: not retried")  # it will not leave
            return None
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
                if self.stopping:
                    return None
                if exc.permanent:
                    self.transition(State.FAILED, reason=f"{exc.reason}: not retried")
                    return None
                return Ended(None, exc.reason, 0.0)
            exited, command = asyncio.ensure_future(child.wait()), None
        self.child = child
        self.started_at = self.hooks.clock.now()
        self.health = None
        if self.stopping:
            await self._end(child, exited)
            return None
        gated = spec.prestart
        first = State.STARTING if gated or spec.readiness is not None else State.RUNNING
        self.transition(first, pid=child.pid, reason="standby" if adopted else "spawned")
        if gated:
            deps = asyncio.ensure_future(self._failed_dependency())
            try:
                await self._first(exited, deps)
            finally:
                deps.cancel()
            if self.stopping:
                await self._end(child, exited)
                return None
            if exited.done():
                return await self._exited(child, exited)
            if failed := deps.result():
                await self._end(child, exited)
                if not self.stopping:
                    self.transition(State.FAILED, reason=failed)
                return None
            await child.open_gate(command)
            if spec.readiness is None and not self.stopping:
                self.transition(State.RUNNING, reason="start gate opened")
        if adopted:  # a restart: the next may come soon, so its standby imports meanwhile
            self._keep_standby()
        return await self._supervise(child, exited, matcher)

    async def _supervise(
        self, child: Child, exited: asyncio.Future[int], matcher: probes.LogMatcher | None
    ) -> Ended | None:
        """Run the probes until the child exits, a probe fails or a stop is asked: the
        readiness probe while STARTING (READY once it passes), then liveness and progress
        side by side. The probes stop as a stop begins, before the child is stopped: a
        process stopped cleanly never shows a failing probe."""
        if self.state is State.STARTING:
            watch = asyncio.ensure_future(self._wait_ready(matcher))
        else:
            self._keep_standby()  # (a first start's waits until here: no competing imports)
            watch = asyncio.ensure_future(self._watch_health())
        self._reprobe.clear()
        reprobe = asyncio.ensure_future(self._reprobe.wait())
        try:
            while True:
                await self._first(exited, watch, reprobe)
                if self.stopping or exited.done():
                    break
                if reprobe.done():  # a replaced spec's health probes, from now on
                    self._reprobe.clear()
                    reprobe = asyncio.ensure_future(self._reprobe.wait())
                    if self.state in PROBED:
                        watch.cancel()
                        watch = asyncio.ensure_future(self._watch_health())
                    continue
                if self.state is State.STARTING:
                    watch.result()
                    self.health = "ok"
                    self.transition(State.READY, reason="readiness probe passed")
                    self._keep_standby()
                    watch = asyncio.ensure_future(self._watch_health())
                    continue
                reason = watch.result()
                self.transition(State.UNHEALTHY, reason=reason)
                code = await self._end(child, exited)
                if self.stopping:
                    return None
                return Ended(code, reason, self._lasted(), unhealthy=True)
        finally:
            watch.cancel()
            reprobe.cancel()
        if self.stopping:
            await self._end(child, exited)
            return None
        return await self._exited(child, exited)

    async def _exited(self, child: Child, exited: asyncio.Future[int]) -> Ended | None:
        """The child exited on its own: how, for the restart policy (None: a stop was
        asked meanwhile)."""
        code = await self._end(child, exited)
        lost = None
        if self.spec.slurm_step is not None:
            # A step ended unasked (even with 0: Slurm's SIGTERM to a lost node's job lets
            # the process stop cleanly): if the job lost a node, nothing can come back.
            lost = await asyncio.to_thread(job_trouble)
            if self.stopping:
                return None
        return Ended(code, describe_exit(code), self._lasted(), lost=lost)

    async def _end(self, child: Child, exited: asyncio.Future[int]) -> int:
        """Stop the child unless it has exited (shutdown signal, timeout, SIGKILL,
        confirm); its exit code, recorded, and its output flushed."""
        if child.returncode is None:
            spec = self.spec
            self._report_survivors(await child.stop(spec.shutdown.signum, spec.shutdown.timeout))
        code = await exited
        self.sink.on_line = None
        self.exit_code = code
        self.hooks.flush_logs()
        return code

    def _lasted(self) -> float:
        now = self.hooks.clock.now()
        return now - (self.started_at if self.started_at is not None else now)

    def _keep_standby(self) -> None:
        """Have a standby spawned for the next start (if the spec keeps one; once)."""
        if self.spec.standby and not self.stopping and not self.hooks.closing():
            self.standby.keep(self.spec)

    async def _wait_ready(self, matcher: probes.LogMatcher | None) -> None:
        """Until the readiness probe passed."""
        spec, name = self.spec, self.name
        assert spec.readiness is not None

        def report(ok: bool, message: str) -> None:
            if self.state is State.STARTING:
                self.hooks.publish(
                    ProbeResult(process=name, probe="readiness", ok=ok, message=message)
                )

        await probes.wait_ready(
            spec.readiness, self.hooks.prober, report, matcher, self.hooks.clock
        )

    async def _watch_health(self) -> str:
        """Liveness and progress probes side by side, until one fails: what it saw."""
        spec, prober, clock = self.spec, self.hooks.prober, self.hooks.clock

        async def failed(kind: str, watch: asyncio.Future[str]) -> str:
            return f"{kind} probe failed: {await watch}"

        watches = []
        if spec.liveness is not None:
            liveness = probes.watch_liveness(spec.liveness, prober, self._health("liveness"), clock)
            watches.append(asyncio.ensure_future(failed("liveness", liveness)))
        if (progress := spec.progress) is not None:
            token = spec.env.get(progress.bearer_env) if progress.bearer_env else None
            work = probes.watch_progress(progress, prober, self._health("progress"), clock, token)
            watches.append(asyncio.ensure_future(failed("progress", work)))
        if not watches:
            await asyncio.Event().wait()
        try:
            done, _ = await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watch in watches:
                watch.cancel()
        return done.pop().result()

    def _health(self, probe: str) -> probes.Report:
        """Where a health probe's results go: its health and an event, while it runs
        (a result that comes as a stop begins says nothing of its health)."""

        def report(ok: bool, message: str) -> None:
            if self.state in PROBED:
                self.health = "ok" if ok else "failing"
                self.hooks.publish(
                    ProbeResult(process=self.name, probe=probe, ok=ok, message=message)
                )

        return report

    # --------------------------------------------------------------------- events

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
            self.health = None
        if self.ready and not was_ready:
            self.ready_at = self.hooks.clock.now()
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

    def _report_survivors(self, survivors: Sequence[object]) -> None:
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
