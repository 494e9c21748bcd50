"""The supervisor: start in dependency order, probe, restart with backoff, stop in reverse.

The facade over the supervisor's rooms: each process's life (``lifecycle.py``), run-end
accounting (``outcome.py``), the journal of events, metrics and output (``journal.py``),
what an open run holds (``resources.py``: the watchdog's ``lifeline.py``, the control
socket, the children's environment), telemetry (``telemetry.py``) and control-socket
requests (``requests.py``). Its public operations take per-process locks and let each
process's life task act. It knows nothing of what the processes are for: a stack run over
it (``grpo_tui.stack``) adds its own requests and compound operations through this API.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_tui.supervisor import graph
from grpo_tui.supervisor.bus import Subscription
from grpo_tui.supervisor.control import ControlEndpoint
from grpo_tui.supervisor.events import Event, State
from grpo_tui.supervisor.external import ExternalChild
from grpo_tui.supervisor.journal import Journal
from grpo_tui.supervisor.lifecycle import ProcessLife, planned
from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.needs import NeedWatch, OnNeededFailure
from grpo_tui.supervisor.outcome import RunEnd, RunOutcome
from grpo_tui.supervisor.probes import HttpProber
from grpo_tui.supervisor.process import Child
from grpo_tui.supervisor.record import Hooks, ProcessRecord, ProcessStatus
from grpo_tui.supervisor.requests import RequestHandler, RequestHandlers, process_operations
from grpo_tui.supervisor.resources import RunResources
from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.telemetry import sample_forever
from grpo_tui.supervisor.transitions import ENDED

__all__ = ["ProcessFailed", "ProcessStatus", "RunOutcome", "ShuttingDown", "Supervisor"]

Respec = Callable[[str, Mapping[str, Any]], ProcessSpec]
"""Rebuilds a process's spec from args (a restart's, or ``{}`` before a crash restart)."""


class ProcessFailed(RuntimeError):
    """A process failed for good while an operation waited for it to become ready."""


class ShuttingDown(RuntimeError):
    """An operation would start a process after the run's shutdown has begun."""


class Held:
    """Stop and start processes whose operation locks the caller holds
    (``Supervisor.holding``)."""

    def __init__(
        self,
        lives: Mapping[str, ProcessLife],
        start: Callable[[ProcessLife], Awaitable[None]],
    ) -> None:
        self._lives = lives
        self._start = start

    async def stop(self, name: str) -> None:
        """Stop ``name`` to start it again: a standby it has waits for that start."""
        await self._held(name).stop(keep_standby=True)

    async def start(self, name: str) -> None:
        """Start ``name`` unless its life task runs; raises ``ShuttingDown`` once closing."""
        await self._start(self._held(name))

    def _held(self, name: str) -> ProcessLife:
        if name not in self._lives:
            raise KeyError(f"{name!r} is not among the held processes {sorted(self._lives)}")
        return self._lives[name]


class Supervisor:
    """Runs a set of process specs as one supervised stack (see the module docstring)."""

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        run_dir: Path,
        *,
        exit_with: str | None = None,
        respec: Respec | None = None,
        control: ControlEndpoint | None = None,
        on_needed_failure: OnNeededFailure = "stop",
    ) -> None:
        self._order = graph.start_order(specs)
        if exit_with is not None and exit_with not in self._order:
            raise graph.PlanError(f"exit_with names no process: {exit_with!r}")
        self.run_dir = Path(run_dir)
        self.run_id = uuid.uuid4().hex
        self.exit_with = exit_with
        self.respec = respec
        self._listed = [spec.name for spec in specs]
        by_name = {spec.name: spec for spec in specs}
        sinks = {n: OutputSink(self.run_dir / "logs" / f"{n}.log") for n in self._order}
        self._journal = Journal(sinks)
        self._resources = RunResources(self.run_dir, self.run_id, control)
        self._end = RunEnd(exit_with)
        self.metrics = self._journal.metrics
        hooks = Hooks(
            publish=self._journal.publish,
            closing=lambda: self._end.closing,
            spawn=self._spawn,
            prober=HttpProber(self._resources.client),
            flush_logs=self._journal.flush_logs,
            changed=self._changed,
            peer=self._life,
            refresh=(lambda name: self.rebuilt_spec(name, {})) if respec is not None else None,
        )
        self._lives = {n: ProcessLife(by_name[n], sinks[n], hooks) for n in self._order}
        self._needs = NeedWatch(
            self._lives, on_needed_failure, self._journal.publish, self._end.cannot_go_on
        )
        self._requests = RequestHandlers()
        for action, handler in process_operations(self).items():
            self._requests.add(action, handler)
        self._finished = asyncio.Event()
        self._opened = False
        self._running = False
        self._tasks: list[asyncio.Task[None]] = []

    # ----------------------------------------------------------------- public API

    async def run(self) -> RunOutcome:
        """Start everything, supervise until the run ends, shut down in order."""
        await self._open()
        self._running = True
        for life in self._lives.values():
            self._journal.publish(planned(life.spec))
        try:
            if self._end.closing:
                self._end.done.set()  # shutdown() came before run(): start nothing
            else:
                for life in self._lives.values():
                    life.launch()
                self._end.all_done(self._lives.values())
            await self._end.done.wait()
        finally:
            self._end.closing = True
            await self._stop_all()
            outcome = self._end.final()
            self.notice(f"run ended: {outcome.reason}")
            await self._close()
            self._finished.set()
        return outcome

    async def shutdown(self, reason: str = "requested") -> None:
        """Ordered shutdown (reverse dependency order); returns once everything stopped.

        From here on nothing starts again: ``start`` and ``restart`` raise ``ShuttingDown``.
        """
        self._end.shutdown(reason)
        if not self._opened or self._finished.is_set():
            return
        self.notice(f"shutting down: {reason}")
        if self._running:
            self._end.done.set()
            await self._finished.wait()
        else:
            await self._stop_all()
            await self._close()
            self._finished.set()

    async def start(self, name: str) -> None:
        """Start a stopped, completed or failed process (it waits for its dependencies).

        Raises ``ShuttingDown`` once the run's shutdown has begun.
        """
        life = self._life(name)
        self.refuse_if_closing(name)
        async with life.lock:
            await self._start(life)

    async def stop(self, name: str) -> None:
        """Stop a process (shutdown signal, timeout, SIGKILL, confirm); it stays stopped."""
        life = self._life(name)
        async with life.lock:
            await life.stop()

    async def restart(
        self,
        name: str,
        *,
        with_dependents: bool = False,
        args: Mapping[str, Any] | None = None,
    ) -> None:
        """Stop, (re-spec from ``args``), start; returns once the process is ready again.

        Ready with what ``args`` asked for: when the new incarnation dies before it is
        ready, its crash restart runs the refreshed spec (e.g. a server on the newest
        checkpoint, not on the weights of the sync that asked), so the restart raises
        ``ProcessFailed`` and the caller, which knows what it wanted served, asks again.
        With ``with_dependents`` its dependents are stopped first and started again after
        (each waiting for its own dependencies as at first start). Raises ``ShuttingDown``
        if the run's shutdown has begun, also when it begins while the old process stops.
        Concurrent operations on one process run one after the other (per-process locks,
        held from stop to start, not while waiting for readiness). Dependents are stopped
        first holding only their own locks: one stopping gracefully may ask to restart
        ``name`` (e.g. a last request before it exits) and must not wait for this restart,
        which waits for it. Under all the locks they are stopped again (a no-op unless an
        operation started one in between).
        """
        life = self._life(name)
        self.refuse_if_closing(name)
        new_spec = self.rebuilt_spec(name, args) if args else None
        followers = graph.dependents(self._specs(), name) if with_dependents else []
        for follower in reversed(followers):
            await self.stop(follower)
        async with self.holding(name, *followers) as held:
            for follower in reversed(followers):
                await held.stop(follower)
            await held.stop(name)
            if new_spec is not None:
                life.replace_spec(new_spec)
            await held.start(name)
            for follower in followers:
                await held.start(follower)
        await self.wait_ready(name)
        if new_spec is not None and life.spec != new_spec:
            raise ProcessFailed(
                f"{name} exited before it became ready; its crash restart runs its "
                "refreshed spec, not the one this restart asked for"
            )

    async def wait_ready(self, name: str) -> None:
        """Return when ``name`` is ready; raise ProcessFailed if it fails for good or is
        stopped first."""
        life = self._life(name)
        await life.until(lambda: life.ready or life.state in (State.FAILED, State.STOPPED))
        if life.state == State.STOPPED:
            raise ProcessFailed(f"{name} was stopped before it became ready")
        if not life.ready:
            raise ProcessFailed(f"{name} failed: {life.last_reason}")

    async def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` to the process group; the restart policy sees whatever follows."""
        child = self._life(name).child
        if child is None or child.returncode is not None:
            raise ProcessLookupError(f"{name} is not running")
        await child.send_signal(sig)

    async def kill(self, name: str) -> None:
        """SIGKILL the process and its descendants at once; it stays stopped.

        The SIGKILL does not wait for an operation in progress (a kill is how a person cuts
        a slow stop short); the confirming stop after it does.
        """
        await self._life(name).kill_now()
        await self.stop(name)

    def subscribe(self, *, max_pending: int = 10_000) -> Subscription:
        return self._journal.subscribe(max_pending)

    def status(self) -> dict[str, ProcessStatus]:
        return {name: life.status() for name, life in self._lives.items()}

    def recent_lines(self, name: str) -> list[str]:
        """The ring buffer of a process's last output lines (decoded)."""
        return list(self._life(name).sink.ring)

    # --------------------------------------------- API for a stack run over this one

    @property
    def names(self) -> tuple[str, ...]:
        """The processes, in start order."""
        return tuple(self._order)

    def by_role(self, role: str) -> str:
        """The one process whose spec has ``role``; KeyError when there is not exactly one."""
        names = [name for name, life in self._lives.items() if life.spec.role == role]
        if len(names) != 1:
            raise KeyError(f"expected one process with role {role!r}, found {names}")
        return names[0]

    def spec(self, name: str) -> ProcessSpec:
        """The spec ``name`` runs with (from its next start on, once replaced)."""
        return self._life(name).spec

    def rebuilt_spec(self, name: str, args: Mapping[str, Any]) -> ProcessSpec:
        """The spec ``respec`` builds for ``name`` from ``args`` (it may raise ValueError)."""
        if self.respec is None:
            raise RuntimeError("this supervisor has no respec: cannot rebuild a spec from args")
        spec = self.respec(name, args)
        if spec.name != name:
            raise ValueError(f"respec({name!r}) returned a spec named {spec.name!r}")
        return spec

    def replace_spec(self, spec: ProcessSpec) -> None:
        """Run ``spec.name`` with ``spec`` from its next start on."""
        self._life(spec.name).replace_spec(spec)

    @contextlib.asynccontextmanager
    async def holding(self, *names: str) -> AsyncIterator[Held]:
        """Hold the operation locks of ``names`` (taken in start order: no deadlock) for a
        compound operation; stop and start them through what it yields."""
        async with contextlib.AsyncExitStack() as stack:
            for name in sorted(set(names), key=self._order.index):
                await stack.enter_async_context(self._life(name).lock)
            yield Held({name: self._life(name) for name in names}, self._start)

    @property
    def closing(self) -> bool:
        """The run's shutdown has begun (asked for, or the run ended): nothing starts again."""
        return self._end.closing

    def refuse_if_closing(self, name: str) -> None:
        """Raise ``ShuttingDown`` (naming ``name``) once the run's shutdown has begun."""
        if self.closing:
            raise ShuttingDown(f"supervisor is shutting down: not starting {name}")

    def handle(self, action: str, handler: RequestHandler) -> None:
        """Answer control-socket requests for ``action`` with ``handler``."""
        self._requests.add(action, handler)

    def notice(self, message: str, level: str = "info") -> None:
        """Publish a notice (subscribers and ``events.jsonl``)."""
        self._journal.notice(message, level)

    def publish(self, event: Event) -> None:
        """Publish an event a stack over this one built (subscribers and ``events.jsonl``)."""
        self._journal.publish(event)

    # ------------------------------------------------------------- infrastructure

    async def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self._journal.open(self.run_dir)
        await self._resources.open(
            self._journal, self._requests.dispatch, self._identify, self._health_reported
        )
        self._tasks.append(asyncio.create_task(self._journal.batch_logs(), name="log-batcher"))
        sampling = sample_forever(self._lives, self._resources.client(), self._journal)
        self._tasks.append(asyncio.create_task(sampling, name="samplers"))

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._resources.close()
        self._journal.close()

    def _identify(self, pid: int) -> str | None:
        """Which process a control-socket peer belongs to (itself or a descendant)."""
        for name, life in self._lives.items():
            child = life.child
            if child is None or child.returncode is not None:
                continue
            if pid == child.pid or pid in child.known:
                return name
            if any(p.pid == pid for p in child.refresh_tree()):
                return name
        return None

    def _health_reported(self, name: str, ok: bool, reason: str) -> None:
        """A control-socket peer's word on its own health (``health.py``)."""
        life = self._lives.get(name)
        if life is not None:
            life.report_health(ok, reason)
        else:  # a process that has just exited, or none of ours: nothing to mark
            self.notice(f"control socket: a health report from {name}, no process", "debug")

    # ------------------------------------------------------------------ life cycle

    def _life(self, name: str) -> ProcessLife:
        if name not in self._lives:
            raise KeyError(f"no process named {name!r}")
        return self._lives[name]

    def _changed(self, life: ProcessRecord) -> None:
        """After every state change: run-end accounting, then what the others need."""
        self._end.changed(life, self._lives.values())
        if not self._end.closing:
            self._needs.changed()

    async def _spawn(self, spec: ProcessSpec, sink: OutputSink, tag: str | None = None) -> Child:
        """A life's spawn: one of our processes, or an attachment to an external one
        (``external.py``: its attach command is ours, the process is not)."""
        if spec.external is None:
            return await self._resources.spawn(spec, sink, tag)
        closing = lambda: self._end.closing  # noqa: E731 (read at the stop, not now)
        return await ExternalChild.attach(spec, sink, self._resources.spawn, closing)

    def _specs(self) -> list[ProcessSpec]:
        """The current specs, in the order they were given."""
        return [self._lives[name].spec for name in self._listed]

    async def _start(self, life: ProcessLife) -> None:
        """``start`` with the process's lock held."""
        self.refuse_if_closing(life.name)
        await self._open()
        if life.state in ENDED and life.task is not None and life.active:
            await asyncio.shield(life.task)  # an ended life only stops its standby: bounded
        if not life.active:
            life.launch()

    async def _stop_all(self) -> None:
        """Stop every process once all of its dependents have stopped (reverse order)."""
        stopping: dict[str, asyncio.Task[None]] = {}
        specs = self._specs()

        async def stop_after_dependents(name: str) -> None:
            direct = [s.name for s in specs if name in s.depends_on]
            await asyncio.gather(*(stopping[d] for d in direct))
            await self.stop(name)

        for name in reversed(self._order):
            stopping[name] = asyncio.create_task(stop_after_dependents(name))
        await asyncio.gather(*stopping.values())
