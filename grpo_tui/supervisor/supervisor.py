"""The supervisor: start in dependency order, probe, restart with backoff, stop in reverse.

Each process has one life-cycle task. It waits for its dependencies (event-driven: every
state change wakes the waiters, no polling), spawns the child, runs its probes, waits for
it to end and applies the restart policy. Public operations (``stop``, ``restart`` ...)
set the wish and let the task act on it, so that one place decides what a process does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from grpo_tui.supervisor import graph, probes
from grpo_tui.supervisor.bus import EventBus, Subscription
from grpo_tui.supervisor.control import ControlEndpoint, ControlServer, socket_path
from grpo_tui.supervisor.events import (
    Event,
    LogBatch,
    MetricsRecord,
    Notice,
    ProbeResult,
    ProcessPlanned,
    Restarting,
    State,
    StateChanged,
)
from grpo_tui.supervisor.journal import JsonlWriter
from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.metrics import MetricsStore
from grpo_tui.supervisor.ports import find_port_holder
from grpo_tui.supervisor.process import GATE_ENV, ChildProcess, SpawnError, describe_exit
from grpo_tui.supervisor.samplers import Samplers, Scrape
from grpo_tui.supervisor.spec import Condition, ProcessSpec
from grpo_tui.supervisor.steps import job_trouble
from grpo_tui.supervisor.tree import PROCESS_VAR, RUN_ID_VAR

BATCH_INTERVAL = 0.05
CONTROL_TOKEN_VAR = "GRPO_TUI_CONTROL_TOKEN"
SAMPLE_INTERVAL = 2.0
ALIVE = {State.STARTING, State.RUNNING, State.READY, State.UNHEALTHY}

Respec = Callable[[str, Mapping[str, Any]], ProcessSpec]
Editor = Callable[[Mapping[str, Any]], tuple[dict[str, Any], dict[str, ProcessSpec]]]
"""The role layer's live-edit callback: (values parsed, rebuilt specs of the processes
they reach); raises ``ValueError`` with the reason for a refused edit."""


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


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int
    reason: str


def _http_client() -> httpx.AsyncClient:
    """The client for https probes and metrics scrapes; built in a thread (loading CA
    certificates takes a few hundred ms) so that nothing waits for it at start."""
    return httpx.AsyncClient(trust_env=False)


class ProcessFailed(RuntimeError):
    """A process failed for good while an operation waited for it to become ready."""


class ShuttingDown(RuntimeError):
    """An operation would start a process after the run's shutdown has begun."""


class _Entry:
    """The supervisor's mutable record of one process."""

    def __init__(self, spec: ProcessSpec, sink: OutputSink) -> None:
        self.spec = spec
        self.sink = sink
        self.state = State.PENDING
        self.child: ChildProcess | None = None
        self.task: asyncio.Task[None] | None = None
        self.restarts = 0
        self.attempt = 0
        self.started_at: float | None = None
        self.ready_at = 0.0  # when it last became ready (its counters start before)
        self.exit_code: int | None = None
        self.last_reason = ""
        self.health: str | None = None
        self.gave_up = False
        self.lost: str | None = None  # why its Slurm job can run it no more
        self.stop_requested = False
        self.wake = asyncio.Event()
        self.changed = asyncio.Event()
        self.lock = asyncio.Lock()  # one start/stop/restart at a time

    @property
    def ready(self) -> bool:
        if self.state == State.READY:
            return True
        return self.state == State.RUNNING and self.spec.readiness is None


class Supervisor:
    """Runs a set of process specs as one supervised stack (see the module docstring)."""

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        run_dir: Path,
        *,
        exit_with: str | None = None,
        respec: Respec | None = None,
        editor: Editor | None = None,
        control: ControlEndpoint | None = None,
    ) -> None:
        self._order = graph.start_order(specs)
        self._control_tcp = control
        if exit_with is not None and exit_with not in self._order:
            raise graph.PlanError(f"exit_with names no process: {exit_with!r}")
        self.run_dir = Path(run_dir)
        self.run_id = uuid.uuid4().hex
        self.exit_with = exit_with
        self.respec = respec
        self.editor = editor
        self.metrics = MetricsStore()
        self._bus = EventBus()
        self._specs = {spec.name: spec for spec in specs}
        self._entries = {
            name: _Entry(self._specs[name], OutputSink(self.run_dir / "logs" / f"{name}.log"))
            for name in self._order
        }
        self._outcome: RunOutcome | None = None
        self._done = asyncio.Event()
        self._finished = asyncio.Event()
        self._opened = False
        self._running = False
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._log_dirty = asyncio.Event()
        self._lifeline: int | None = None
        self._watchdog: asyncio.subprocess.Process | None = None
        self._control: ControlServer | None = None
        self._client: asyncio.Future[httpx.AsyncClient] | None = None
        self._events_file: JsonlWriter | None = None
        self._metrics_file: JsonlWriter | None = None

    # ----------------------------------------------------------------- public API

    async def run(self) -> RunOutcome:
        """Start everything, supervise until the run ends, shut down in order."""
        await self._open()
        self._running = True
        for name in self._order:
            self._publish_plan(self._entries[name].spec)
        try:
            if self._closing:
                self._done.set()  # shutdown() came before run(): start nothing
            else:
                for name in self._order:
                    self._launch(self._entries[name])
                self._check_all_done()
            await self._done.wait()
        finally:
            self._closing = True
            await self._stop_all()
            outcome = self._outcome or RunOutcome(1, "interrupted")
            self._notice(f"run ended: {outcome.reason}")
            await self._close()
            self._finished.set()
        return outcome

    async def shutdown(self, reason: str = "requested") -> None:
        """Ordered shutdown (reverse dependency order); returns once everything stopped.

        From here on nothing starts again: ``start`` and ``restart`` raise ``ShuttingDown``.
        """
        self._closing = True
        if self._outcome is None:
            code = 0 if self.exit_with is None else 1
            self._outcome = RunOutcome(code, f"shutdown: {reason}")
        if not self._opened or self._finished.is_set():
            return
        self._notice(f"shutting down: {reason}")
        if self._running:
            self._done.set()
            await self._finished.wait()
        else:
            await self._stop_all()
            await self._close()
            self._finished.set()

    async def start(self, name: str) -> None:
        """Start a stopped, completed or failed process (it waits for its dependencies).

        Raises ``ShuttingDown`` once the run's shutdown has begun.
        """
        entry = self._entry(name)
        self._refuse_if_closing(name)
        async with entry.lock:
            await self._start(entry)

    async def stop(self, name: str) -> None:
        """Stop a process (shutdown signal, timeout, SIGKILL, confirm); it stays stopped."""
        entry = self._entry(name)
        async with entry.lock:
            await self._stop(entry)

    async def restart(
        self,
        name: str,
        *,
        with_dependents: bool = False,
        args: Mapping[str, Any] | None = None,
    ) -> None:
        """Stop, (re-spec from ``args``), start; returns once the process is ready again.

        With ``with_dependents`` its dependents are stopped first and started again after
        (each waiting for its own dependencies as at first start). Raises ``ShuttingDown``
        if the run's shutdown has begun, also when it begins while the old process stops.
        Concurrent operations on one process run one after the other (per-process locks,
        held from stop to start, not while waiting for readiness). Dependents are stopped
        first holding only their own locks: one stopping gracefully may ask to restart
        ``name`` (the trainer's last weight sync) and must not wait for this restart, which
        waits for it. Under all the locks they are stopped again (a no-op unless an
        operation started one in between).
        """
        entry = self._entry(name)
        self._refuse_if_closing(name)
        new_spec = self._respec(name, args) if args else None
        followers = graph.dependents(list(self._specs.values()), name) if with_dependents else []
        for follower in reversed(followers):
            await self.stop(follower)
        async with self._locked(name, *followers):
            for follower in reversed(followers):
                await self._stop(self._entries[follower])
            await self._stop(entry)
            if new_spec is not None:
                self._replace_spec(entry, new_spec)
            entry.attempt = 0
            await self._start(entry)
            for follower in followers:
                await self._start(self._entries[follower])
        await self.wait_ready(name)

    async def wait_ready(self, name: str) -> None:
        """Return when ``name`` is ready; raise ProcessFailed if it fails for good or is
        stopped first."""
        entry = self._entry(name)
        await self._wait_for(
            entry, lambda: entry.ready or entry.gave_up or entry.state == State.STOPPED
        )
        if entry.state == State.STOPPED:
            raise ProcessFailed(f"{name} was stopped before it became ready")
        if not entry.ready:
            raise ProcessFailed(f"{name} failed: {entry.last_reason}")

    async def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` to the process group; the restart policy sees whatever follows."""
        child = self._entry(name).child
        if child is None or child.returncode is not None:
            raise ProcessLookupError(f"{name} is not running")
        await child.send_signal(sig)

    async def kill(self, name: str) -> None:
        """SIGKILL the process and its descendants at once; it stays stopped.

        The SIGKILL does not wait for an operation in progress (a kill is how a person cuts
        a slow stop short); the confirming stop after it does.
        """
        entry = self._entry(name)
        entry.stop_requested = True
        entry.wake.set()
        if entry.child is not None and entry.child.returncode is None:
            self._set_state(entry, State.STOPPING, reason="kill requested")
            self._report_survivors(entry, await entry.child.kill())
        await self.stop(name)

    async def switch_mode(self, mode: str) -> None:
        """Trainer checkpoints and exits, inference restarts in ``mode``, trainer resumes.

        Environments and the API keep running, so the rollout queue is kept. The trainer is
        stopped holding only its own lock, as dependents are in ``restart``. The trainer's
        new spec is built first, so that a mode the run cannot use (``respec`` raises) is
        refused before anything stops; inference's is built once the trainer has saved,
        to serve its newest checkpoint.
        """
        trainer = self._by_role("trainer")
        inference = self._by_role("inference")
        self._refuse_if_closing(inference)
        trainer_spec = self._respec(trainer, {"mode": mode})
        note = self._notice
        note(f"switching to mode {mode}: stopping {trainer} (it checkpoints first)")
        await self.stop(trainer)
        async with self._locked(inference, trainer):
            await self._stop(self._entries[trainer])
            note(f"stopping {inference}")
            await self._stop(self._entries[inference])
            self._replace_spec(self._entries[inference], self._respec(inference, {"mode": mode}))
            self._replace_spec(self._entries[trainer], trainer_spec)
            note(f"starting {inference} in mode {mode}")
            await self._start(self._entries[inference])
        await self.wait_ready(inference)
        note(f"starting {trainer} (resuming from its checkpoint)")
        await self.start(trainer)
        await self.wait_ready(trainer)
        note(f"mode {mode} active")

    def notice(self, message: str, level: str = "info") -> None:
        """Publish a notice (shown by every face, kept in ``events.jsonl``)."""
        self._notice(message, level)

    def subscribe(self, *, max_pending: int = 10_000) -> Subscription:
        return self._bus.subscribe(max_pending)

    def status(self) -> dict[str, ProcessStatus]:
        return {name: self._status(self._entries[name]) for name in self._order}

    def recent_lines(self, name: str) -> list[str]:
        """The ring buffer of a process's last output lines (decoded)."""
        return list(self._entry(name).sink.ring)

    # ------------------------------------------------------------- infrastructure

    async def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self._events_file = JsonlWriter(self.run_dir / "events.jsonl")
        self._metrics_file = JsonlWriter(self.run_dir / "metrics.jsonl")
        for entry in self._entries.values():
            entry.sink.on_lines = self._log_dirty.set
        self._client = asyncio.ensure_future(asyncio.to_thread(_http_client))
        await self._start_watchdog()
        self._control = ControlServer(
            socket_path(self.run_dir, self.run_id),
            on_metrics=self._on_metrics,
            on_event=self._publish,
            on_request=self._on_request,
            identify=self._identify,
            tcp=self._control_tcp,
        )
        await self._control.start()
        self._tasks.append(asyncio.create_task(self._batch_logs(), name="log-batcher"))
        self._tasks.append(asyncio.create_task(self._sample(), name="samplers"))

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._flush_logs()
        for entry in self._entries.values():
            entry.sink.close()
        if self._control is not None:
            await self._control.close()
        if self._client is not None:
            await (await self._client).aclose()
        await self._stop_watchdog()
        for writer in (self._events_file, self._metrics_file):
            if writer is not None:
                writer.close()

    async def _start_watchdog(self) -> None:
        read_end, write_end = os.pipe()
        errors = (self.run_dir / "logs" / "watchdog.log").open("ab")
        try:
            self._watchdog = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "grpo_tui.supervisor.watchdog",
                "--fd",
                str(read_end),
                "--run-id",
                self.run_id,
                pass_fds=(read_end,),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,
                # not tagged by whatever runs us (a test run, an outer supervisor): a sweep
                # of that tag must leave it alive to end our children once we are gone
                env={k: v for k, v in os.environ.items() if k != RUN_ID_VAR},
            )
        finally:
            os.close(read_end)
            errors.close()
        os.set_blocking(write_end, False)
        self._lifeline = write_end

    async def _stop_watchdog(self) -> None:
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self._watchdog is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._watchdog.wait(), 10)

    def _announce(self, line: str) -> None:
        """Tell the watchdog about a group or pid; never blocks (a full pipe drops the line)."""
        if self._lifeline is None:
            return
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self._lifeline, line.encode() + b"\n")

    def _child_env(self, spec: ProcessSpec) -> dict[str, str]:
        """A child's environment; a Slurm step (maybe on another node) gets the control
        socket's TCP side and its token when there is one."""
        assert self._control is not None
        control = {"GRPO_TUI_SOCKET": str(self._control.path)}
        if spec.slurm_step is not None and self._control_tcp is not None:
            control = {
                "GRPO_TUI_SOCKET": self._control_tcp.url,
                CONTROL_TOKEN_VAR: self._control_tcp.token,
            }
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **spec.env,
            **control,
            PROCESS_VAR: spec.name,
            **({GATE_ENV: "stdin"} if spec.prestart else {}),
            "GRPO_TUI_RUN_DIR": str(self.run_dir.resolve()),
            RUN_ID_VAR: self.run_id,
        }

    # ------------------------------------------------------------------ life cycle

    @contextlib.asynccontextmanager
    async def _locked(self, *names: str) -> AsyncIterator[None]:
        """Hold the operation locks of ``names``, taken in start order (no deadlock)."""
        async with contextlib.AsyncExitStack() as stack:
            for name in sorted(set(names), key=self._order.index):
                await stack.enter_async_context(self._entries[name].lock)
            yield

    async def _start(self, entry: _Entry) -> None:
        """``start`` with the entry's lock held."""
        self._refuse_if_closing(entry.spec.name)
        await self._open()
        if entry.task is not None and not entry.task.done():
            return
        self._launch(entry)

    async def _stop(self, entry: _Entry) -> None:
        """``stop`` with the entry's lock held."""
        entry.stop_requested = True
        entry.wake.set()
        child = entry.child
        if child is not None and child.returncode is None and entry.state in ALIVE:
            self._set_state(entry, State.STOPPING, reason="stop requested")
            survivors = await child.stop(entry.spec.shutdown.signum, entry.spec.shutdown.timeout)
            self._report_survivors(entry, survivors)
        if entry.task is not None:
            await asyncio.shield(entry.task)
        if entry.state not in (State.COMPLETED, State.FAILED, State.STOPPED):
            self._set_state(entry, State.STOPPED, reason="stopped on request")

    def _launch(self, entry: _Entry) -> None:
        entry.stop_requested = False
        entry.gave_up = False
        entry.lost = None
        entry.wake = asyncio.Event()
        if entry.state != State.PENDING:
            self._set_state(entry, State.PENDING, reason="start requested")
        entry.task = asyncio.create_task(self._life(entry), name=f"life:{entry.spec.name}")

    async def _life(self, entry: _Entry) -> None:
        if not entry.spec.prestart and not await self._dependencies_met(entry):
            return
        while not entry.stop_requested and not self._closing:
            code, reason, lasted = await self._run_once(entry)
            if entry.stop_requested or entry.gave_up:
                return
            if entry.lost is not None:
                self._give_up(entry, f"{reason}; {entry.lost}: not restarted", code)
                return
            policy = entry.spec.restart
            if lasted >= policy.reset_after:
                entry.attempt = 0
            if code == 0 and policy.policy != "always":
                self._set_state(entry, State.COMPLETED, reason=reason, exit_code=0)
                return
            if policy.policy == "no" or (code == 0 and policy.policy == "on_failure"):
                self._give_up(entry, reason, code)
                return
            if entry.attempt >= policy.max_restarts:
                self._give_up(entry, f"{reason}; gave up after {entry.attempt} restarts", code)
                return
            delay = policy.delay(entry.attempt)
            entry.attempt += 1
            entry.restarts += 1
            self._publish(
                Restarting(
                    process=entry.spec.name, attempt=entry.attempt, delay=delay, reason=reason
                )
            )
            self._set_state(entry, State.BACKOFF, reason=f"{reason}; restart in {delay:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.wake.wait(), delay)
            if not entry.stop_requested and not self._closing:
                self._refresh_spec(entry)

    def _refresh_spec(self, entry: _Entry) -> None:
        """Before a crash restart: the newest spec from ``respec(name, {})`` (e.g. inference
        serving the latest adapter); if that raises, say so and keep the last spec."""
        if self.respec is None:
            return
        name = entry.spec.name
        try:
            spec = self._respec(name, {})
        except Exception as exc:  # the callback is the role layer's code; a restart must go on
            self._notice(
                f"{name}: respec failed, restarting with the last spec: {exc}", level="warning"
            )
            return
        self._replace_spec(entry, spec)

    def edit(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a live hyperparameter edit (see ``grpo_trainer.live_edits``).

        The editor validates and records it; the processes it reaches keep it in their
        specs for any restart, and read it themselves at their next step boundary.
        Raises ``ValueError`` with the reason when it is refused.
        """
        if self.editor is None:
            raise ValueError("this run takes no live edits")
        parsed, specs = self.editor(values)
        specs = {name: spec for name, spec in specs.items() if name in self._entries}
        for name, spec in specs.items():
            self._replace_spec(self._entries[name], spec)
        text = ", ".join(f"{key}={value}" for key, value in parsed.items())
        self._notice(f"live edit: {text} -> {', '.join(specs)} (from their next step)")
        return {"values": parsed, "processes": list(specs)}

    def _replace_spec(self, entry: _Entry, spec: ProcessSpec) -> None:
        if spec != entry.spec:
            self._publish_plan(spec)
        self._specs[spec.name] = entry.spec = spec

    def _publish_plan(self, spec: ProcessSpec) -> None:
        self._publish(
            ProcessPlanned(
                process=spec.name, role=spec.role, port=spec.port, command=tuple(spec.command)
            )
        )

    def _give_up(self, entry: _Entry, reason: str, code: int | None) -> None:
        entry.gave_up = True
        self._set_state(entry, State.FAILED, reason=reason, exit_code=code)

    async def _dependencies_met(self, entry: _Entry) -> bool:
        """Wait for every dependency's condition; False (and FAILED) if one fails for good."""
        failed = await self._failed_dependency(entry)
        if failed:
            self._give_up(entry, failed, None)
        return not failed and not entry.stop_requested

    async def _failed_dependency(self, entry: _Entry) -> str:
        """Wait for every dependency's condition (or a stop request); the reason one failed
        for good, else ''."""
        for dep_name, dependency in entry.spec.depends_on.items():
            dep = self._entries[dep_name]
            cond = dependency.condition

            def settled(dep: _Entry = dep, cond: Condition = cond) -> bool:
                return self._condition_met(dep, cond) or dep.gave_up or entry.stop_requested

            await self._wait_for(dep, settled, also=entry.wake)
            if entry.stop_requested:
                return ""
            if not self._condition_met(dep, cond):
                return f"dependency {dep_name} failed: {dep.last_reason}"
        return ""

    @staticmethod
    def _condition_met(dep: _Entry, cond: Condition) -> bool:
        match cond:
            case Condition.STARTED:
                return dep.state in ALIVE or dep.state == State.COMPLETED
            case Condition.HEALTHY:
                return dep.ready or dep.state == State.COMPLETED
            case Condition.COMPLETED:
                return dep.state == State.COMPLETED
        return False

    @staticmethod
    async def _wait_for(
        entry: _Entry, predicate: Callable[[], bool], also: asyncio.Event | None = None
    ) -> None:
        """Wait until ``predicate()`` holds, re-checking on each state change of ``entry``
        (and when ``also`` is set)."""
        while not predicate():
            waiters = {asyncio.ensure_future(entry.changed.wait())}
            if also is not None:
                waiters.add(asyncio.ensure_future(also.wait()))
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    async def _run_once(self, entry: _Entry) -> tuple[int | None, str, float]:
        """One incarnation: preflight, spawn, probe, wait. (exit code, reason, seconds run)."""
        spec = entry.spec
        if spec.port is not None and (holder := find_port_holder(spec.port)) is not None:
            self._set_state(entry, State.FAILED, reason=holder.describe())
            return None, holder.describe(), 0.0
        matcher = None
        if spec.readiness is not None and spec.readiness.kind == "log_line":
            matcher = probes.LogMatcher(spec.readiness.pattern)
        entry.sink.on_line = matcher
        entry.sink.file.open()
        try:
            child = await ChildProcess.spawn(
                spec,
                env=self._child_env(spec),
                run_id=self.run_id,
                sink=entry.sink,
                announce=self._announce,
            )
        except SpawnError as exc:
            self._set_state(entry, State.FAILED, reason=exc.reason)
            return None, exc.reason, 0.0
        entry.child = child
        entry.started_at = child.started_at
        if entry.stop_requested:
            await child.stop(spec.shutdown.signum, spec.shutdown.timeout)
        entry.health = None
        first = State.STARTING if spec.readiness is not None else State.RUNNING
        self._set_state(entry, first, pid=child.pid, reason="spawned")
        exited = asyncio.create_task(child.wait())
        if spec.prestart and not await self._gate_opened(entry, child, exited):
            code = await exited
            entry.sink.on_line = None
            entry.exit_code = code
            self._flush_logs()
            return code, entry.last_reason, time.time() - child.started_at
        watcher = asyncio.create_task(self._watch_probes(entry, matcher))
        await asyncio.wait({exited, watcher}, return_when=asyncio.FIRST_COMPLETED)
        reason = ""
        if watcher.done() and not exited.done():
            reason = f"liveness probe failed: {watcher.result()}"
            self._set_state(entry, State.UNHEALTHY, reason=reason)
            if not entry.stop_requested:
                self._set_state(entry, State.STOPPING, reason="restarting: liveness failed")
                survivors = await child.stop(spec.shutdown.signum, spec.shutdown.timeout)
                self._report_survivors(entry, survivors)
        watcher.cancel()
        code = await exited
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        entry.sink.on_line = None
        entry.exit_code = code
        if spec.slurm_step is not None and not entry.stop_requested:
            # A step ended unasked (even with 0: Slurm's SIGTERM to a lost node's job lets
            # the trainer stop cleanly): if the job lost a node, nothing can come back.
            entry.lost = await asyncio.to_thread(job_trouble)
        self._flush_logs()
        return code, reason or describe_exit(code), time.time() - child.started_at

    async def _gate_opened(
        self, entry: _Entry, child: ChildProcess, exited: asyncio.Task[int]
    ) -> bool:
        """A ``prestart`` child runs its imports while its dependencies come up; open its
        start gate once they are met. False when it exited first, a stop was requested (the
        stop ends it) or a dependency failed (it is stopped here, the entry FAILED)."""
        deps = asyncio.create_task(self._failed_dependency(entry))
        await asyncio.wait({exited, deps}, return_when=asyncio.FIRST_COMPLETED)
        if not deps.done():
            deps.cancel()
            return False
        failed = deps.result()
        if entry.stop_requested:
            return False
        if not failed:
            await child.open_gate()
            return True
        if not exited.done():
            survivors = await child.stop(entry.spec.shutdown.signum, entry.spec.shutdown.timeout)
            self._report_survivors(entry, survivors)
        self._give_up(entry, failed, None)
        return False

    async def _watch_probes(self, entry: _Entry, matcher: probes.LogMatcher | None) -> str:
        """Readiness (-> READY), then liveness; returns the liveness failure message."""
        assert self._client is not None
        client = self._client
        spec, name = entry.spec, entry.spec.name
        if spec.readiness is not None:

            def ready_report(ok: bool, message: str) -> None:
                self._publish(ProbeResult(process=name, probe="readiness", ok=ok, message=message))

            await probes.wait_ready(spec.readiness, client, ready_report, matcher)
            entry.health = "ok"
            self._set_state(entry, State.READY, reason="readiness probe passed")
        if spec.liveness is None:
            await asyncio.Event().wait()
        assert spec.liveness is not None

        def live_report(ok: bool, message: str) -> None:
            entry.health = "ok" if ok else "failing"
            self._publish(ProbeResult(process=name, probe="liveness", ok=ok, message=message))

        return await probes.watch_liveness(spec.liveness, client, live_report)

    async def _stop_all(self) -> None:
        """Stop every process once all of its dependents have stopped (reverse order)."""
        stopping: dict[str, asyncio.Task[None]] = {}
        specs = list(self._specs.values())

        async def stop_after_dependents(name: str) -> None:
            direct = [s.name for s in specs if name in s.depends_on]
            await asyncio.gather(*(stopping[d] for d in direct))
            await self.stop(name)

        for name in reversed(self._order):
            stopping[name] = asyncio.create_task(stop_after_dependents(name))
        await asyncio.gather(*stopping.values())

    # --------------------------------------------------------------------- events

    def _set_state(
        self,
        entry: _Entry,
        new: State,
        *,
        reason: str = "",
        pid: int | None = None,
        exit_code: int | None = None,
    ) -> None:
        old = entry.state
        entry.state = new
        if entry.ready and old != new:
            entry.ready_at = time.time()
        entry.last_reason = reason or entry.last_reason
        if exit_code is not None:
            entry.exit_code = exit_code
        changed, entry.changed = entry.changed, asyncio.Event()
        changed.set()
        child_pid = pid if pid is not None else (entry.child.pid if entry.child else None)
        self._publish(
            StateChanged(
                process=entry.spec.name,
                old=old,
                new=new,
                pid=child_pid,
                reason=reason,
                exit_code=exit_code if exit_code is not None else entry.exit_code,
            )
        )
        self._check_run_end(entry)

    def _check_run_end(self, entry: _Entry) -> None:
        if self._outcome is not None:
            return
        name = entry.spec.name
        if name == self.exit_with:
            if entry.state == State.COMPLETED:
                self._finish(RunOutcome(0, f"{name} completed successfully"))
            elif entry.gave_up:
                self._finish(RunOutcome(1, f"{name} failed: {entry.last_reason}"))
        elif self.exit_with is None:
            self._check_all_done()

    def _check_all_done(self) -> None:
        if self.exit_with is not None or self._outcome is not None or not self._entries:
            return
        entries = self._entries.values()
        if all(e.state == State.COMPLETED or e.gave_up for e in entries):
            failed = [e.spec.name for e in entries if e.gave_up]
            if failed:
                self._finish(RunOutcome(1, f"failed: {', '.join(failed)}"))
            else:
                self._finish(RunOutcome(0, "all processes completed"))

    def _finish(self, outcome: RunOutcome) -> None:
        self._outcome = outcome
        self._closing = True
        self._done.set()

    def _publish(self, event: Event) -> None:
        self._bus.publish(event)
        if self._events_file is not None and not isinstance(event, LogBatch | MetricsRecord):
            self._events_file.write(event.to_json())

    def _notice(self, message: str, level: str = "info") -> None:
        self._publish(Notice(level=level, message=message))

    def _report_survivors(self, entry: _Entry, survivors: Sequence[object]) -> None:
        if survivors:
            pids = ", ".join(str(getattr(p, "pid", p)) for p in survivors)
            self._notice(f"{entry.spec.name}: could not kill pids {pids}", level="error")

    async def _batch_logs(self) -> None:
        """Publish pending output lines as one LogBatch per process, at most every 50 ms."""
        last = 0.0
        while True:
            await self._log_dirty.wait()
            self._log_dirty.clear()
            wait = last + BATCH_INTERVAL - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            last = time.monotonic()
            self._flush_logs()

    def _flush_logs(self) -> None:
        for name, entry in self._entries.items():
            lines = entry.sink.take_pending()
            if lines:
                self._publish(LogBatch(process=name, lines=tuple(lines)))
            entry.sink.file.flush()

    # ------------------------------------------------------------ metrics, control

    def _on_metrics(self, record: MetricsRecord) -> None:
        self.metrics.add(record.t, record.step, record.data)
        if self._metrics_file is not None:
            self._metrics_file.write(
                {
                    "type": "metrics",
                    "process": record.process,
                    "step": record.step,
                    "t": record.t,
                    "data": record.data,
                }
            )
        self._publish(record)

    async def _on_request(
        self, process: str, action: str, target: str | None, args: dict[str, Any]
    ) -> dict[str, Any]:
        if action == "status":
            return {"processes": {name: str(s.state) for name, s in self.status().items()}}
        if action == "edit":
            return self.edit(args)
        if action == "switch_mode":
            mode = args.get("mode")
            if not isinstance(mode, str):
                raise ValueError("switch_mode needs args.mode, a mode name")
            await self.switch_mode(mode)
            return {"mode": mode}
        operations: dict[str, Callable[[str], Awaitable[None]]] = {
            "restart": lambda name: self.restart(name, args=args or None),
            "stop": self.stop,
            "start": self.start,
            "kill": self.kill,
        }
        if action not in operations:
            known = ", ".join(sorted(["edit", "status", "switch_mode", *operations]))
            raise ValueError(f"unknown action {action!r} (known: {known})")
        if target is None:
            raise ValueError(f"{action} needs a target process")
        name = target if target in self._entries else self._by_role(target)
        await operations[action](name)
        status = self._status(self._entries[name])
        return {"process": name, "state": str(status.state), "pid": status.pid}

    def _identify(self, pid: int) -> str | None:
        """Which process a control-socket peer belongs to (itself or a descendant)."""
        for name, entry in self._entries.items():
            child = entry.child
            if child is None or child.returncode is not None:
                continue
            if pid == child.pid or pid in child.known:
                return name
            if any(p.pid == pid for p in child.refresh_tree()):
                return name
        return None

    async def _sample(self) -> None:
        assert self._client is not None
        samplers = Samplers(await asyncio.shield(self._client))
        while True:
            running = {
                name: entry.child
                for name, entry in self._entries.items()
                if entry.child is not None and entry.child.returncode is None
            }
            scrape = {
                name: Scrape(
                    entry.spec.role, entry.spec.metrics_url, entry.child.pid, entry.ready_at
                )
                for name, entry in self._entries.items()
                if entry.spec.metrics_url and entry.ready and entry.child is not None
            }
            events, values = await samplers.sample(running, scrape)
            for event in events:
                self._publish(event)
            if values:
                self._on_metrics(MetricsRecord(process="supervisor", step=None, data=values))
            await asyncio.sleep(SAMPLE_INTERVAL)

    # -------------------------------------------------------------------- helpers

    def _entry(self, name: str) -> _Entry:
        if name not in self._specs:
            raise KeyError(f"no process named {name!r}")
        return self._entries[name]

    def _refuse_if_closing(self, name: str) -> None:
        if self._closing:
            raise ShuttingDown(f"supervisor is shutting down: not starting {name}")

    def _by_role(self, role: str) -> str:
        names = [n for n in self._order if self._specs[n].role == role]
        if len(names) != 1:
            raise KeyError(f"expected one process with role {role!r}, found {names}")
        return names[0]

    def _respec(self, name: str, args: Mapping[str, Any]) -> ProcessSpec:
        if self.respec is None:
            raise RuntimeError("this supervisor has no respec: cannot rebuild a spec from args")
        spec = self.respec(name, args)
        if spec.name != name:
            raise ValueError(f"respec({name!r}) returned a spec named {spec.name!r}")
        return spec

    @staticmethod
    def _status(entry: _Entry) -> ProcessStatus:
        child = entry.child
        alive = child is not None and child.returncode is None
        return ProcessStatus(
            name=entry.spec.name,
            role=entry.spec.role,
            state=entry.state,
            pid=child.pid if alive and child is not None else None,
            started_at=entry.started_at,
            restarts=entry.restarts,
            port=entry.spec.port,
            health=entry.health,
            exit_code=entry.exit_code,
            last_reason=entry.last_reason,
        )
