"""Fakes for driving process lives through ``Hooks``: no child process, no wall clock.

As Supervisor's ``tests/test_process.py`` drives its state machine with dummy processes, a
:class:`Machine` runs real ``ProcessLife`` objects over a fake spawn (:class:`FakeChild`
incarnations the test ends, signals and gates), a fake prober (probe results the test
sets) and a fake clock (time moves only when the test says).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from grpo_tui.supervisor.events import Event, Notice, ProbeResult, Restarting, State, StateChanged
from grpo_tui.supervisor.lifecycle import ProcessLife
from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.record import Hooks, until
from grpo_tui.supervisor.spec import Probe, ProcessSpec, ProgressProbe

HANG = 10.0
"""Real seconds a helper waits before it calls the machine stuck: a guard, never a bound
the behaviour is measured by (nothing here waits on real time otherwise)."""


class FakeClock:
    """Time that moves only on :meth:`advance`, which wakes the sleepers that are due."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.t = now
        self.slept: list[float] = []
        """Every sleep of a positive length asked, in order."""
        self._sleepers: list[tuple[float, float, asyncio.Future[None]]] = []
        self._changed = asyncio.Event()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        due = asyncio.get_running_loop().create_future()
        entry = (self.t + seconds, seconds, due)
        self._sleepers.append(entry)
        self.slept.append(seconds)
        self._changed.set()
        try:
            await due
        finally:
            self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``; the sleepers due by then wake."""
        self.t += seconds
        for deadline, _, due in self._sleepers:
            if deadline <= self.t and not due.done():
                due.set_result(None)

    @property
    def sleeping(self) -> list[float]:
        """The lengths of the sleeps pending now."""
        return [seconds for _, seconds, due in self._sleepers if not due.done()]

    async def asleep(self, seconds: float, count: int = 1) -> None:
        """Wait until ``count`` sleeps of ``seconds`` are pending."""
        try:
            async with asyncio.timeout(HANG):
                while self.sleeping.count(seconds) < count:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"no {count} sleeps of {seconds} s: {self.sleeping}") from None

    async def tick(self, seconds: float, sleepers: int = 1) -> None:
        """Once ``sleepers`` sleeps of ``seconds`` are pending, let that time pass."""
        await self.asleep(seconds, sleepers)
        self.advance(seconds)


class FakeChild:
    """One incarnation: it runs until the test ends it (:meth:`exit`) or a stop does."""

    def __init__(self, spec: ProcessSpec, sink: OutputSink, tag: str, pid: int, t: float) -> None:
        self.spec = spec
        self.sink = sink
        self.tag = tag
        self.started_at = t
        self.known: dict[int, psutil.Process] = {}
        self.returncode: int | None = None
        self.signals: list[int] = []
        """Every signal a stop or kill sent it, in order."""
        self.gates: list[list[str] | None] = []
        """What each opening of its start gate handed it (None: its own command)."""
        self.ignores_term = False
        """A stop's shutdown signal does not end it: the stop's SIGKILL does."""
        self.slow_stop: asyncio.Event | None = None
        """When set, a stop waits for this event before the child exits."""
        self._pid = pid
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def pid(self) -> int:
        return self._pid

    def exit(self, code: int) -> None:
        """The child exits with ``code`` (a negative one: killed by that signal)."""
        if not self._exit.done():
            self.returncode = code
            self._exit.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def stop(self, sig: int, timeout: float) -> list[psutil.Process | str]:
        self.signals.append(sig)
        if self.slow_stop is not None:
            await self.slow_stop.wait()
        if self.ignores_term and sig != signal.SIGKILL:
            self.signals.append(signal.SIGKILL)
            sig = signal.SIGKILL
        self.exit(-sig)
        return []

    async def kill(self) -> list[psutil.Process | str]:
        self.signals.append(signal.SIGKILL)
        self.exit(-signal.SIGKILL)
        return []

    async def open_gate(self, command: list[str] | None = None) -> None:
        self.gates.append(command)

    def refresh_tree(self) -> list[psutil.Process]:
        return []


class FakeSpawn:
    """``Hooks.spawn``: hands out :class:`FakeChild` incarnations, or the errors queued."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.children: list[FakeChild] = []
        self.errors: list[Exception] = []
        """Raised by the next spawns of a process's own incarnations, one each."""
        self.fail: dict[str, Exception] = {}
        """``tag -> error`` raised by the spawn of that standby (``<name>~standby<N>``)."""
        self.hold: asyncio.Event | None = None
        """When set, a spawn waits for this event (a spawn in flight)."""
        self.started = asyncio.Event()
        """Set once a spawn has begun (and is held)."""

    async def __call__(self, spec: ProcessSpec, sink: OutputSink, tag: str | None) -> FakeChild:
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        if tag is not None and tag in self.fail:
            raise self.fail.pop(tag)
        if tag is None and self.errors:
            raise self.errors.pop(0)
        child = FakeChild(spec, sink, tag or spec.name, 1000 + len(self.children), self.clock.t)
        self.children.append(child)
        return child

    def of(self, tag: str) -> list[FakeChild]:
        """The incarnations spawned with ``tag`` (a process's name, or a standby's tag)."""
        return [child for child in self.children if child.tag == tag]


class FakeProber:
    """``Hooks.prober``: polled probes pass unless their URL or command is in ``failing``;
    the progress probe's counters are ``count`` and its request answers ``answer``."""

    def __init__(self) -> None:
        self.failing: set[str] = set()
        self.checks: list[str] = []
        self.count: float | None = 0.0
        self.answer: tuple[bool, str] = (True, "it answered HTTP 200")
        self.asked: list[str | None] = []
        """The bearer token of each request for work."""

    @staticmethod
    def target(probe: Probe) -> str:
        return str(getattr(probe, "url", None) or getattr(probe, "command", probe.kind))

    async def check(self, probe: Probe) -> tuple[bool, str]:
        target = self.target(probe)
        self.checks.append(target)
        if target in self.failing:
            return False, f"{target} refused"
        return True, "HTTP 200"

    async def counter(self, probe: ProgressProbe) -> float | None:
        return self.count

    async def ask(self, probe: ProgressProbe, token: str | None) -> tuple[bool, str]:
        self.asked.append(token)
        return self.answer


class Machine:
    """Process lives of ``specs`` over the fakes, with every event they publish."""

    def __init__(self, run_dir: Path, *specs: ProcessSpec) -> None:
        self.clock = FakeClock()
        self.spawn = FakeSpawn(self.clock)
        self.prober = FakeProber()
        self.events: list[Event] = []
        self.closing = False
        self.held: dict[str, str] = {}
        """``name -> why it cannot start at all`` (``Hooks.preflight``: a held port)."""
        self.respec: Callable[[str], ProcessSpec] | None = None
        hooks = Hooks(
            publish=self.events.append,
            closing=lambda: self.closing,
            spawn=self.spawn,
            prober=self.prober,
            flush_logs=lambda: None,
            changed=lambda _life: None,
            peer=lambda name: self.lives[name],
            refresh=lambda name: self.respec(name) if self.respec else self.lives[name].spec,
            preflight=lambda spec: self.held.get(spec.name),
            clock=self.clock,
        )
        self.lives = {
            spec.name: ProcessLife(spec, OutputSink(run_dir / f"{spec.name}.log"), hooks)
            for spec in specs
        }

    def life(self, name: str = "p") -> ProcessLife:
        return self.lives[name]

    def child(self, name: str = "p") -> FakeChild:
        """The newest incarnation of ``name``."""
        return self.spawn.of(name)[-1]

    async def state(self, state: State, name: str = "p") -> None:
        """Wait until ``name`` is in ``state``."""
        life = self.lives[name]
        try:
            async with asyncio.timeout(HANG):
                await until(lambda: life.state is state, life)
        except TimeoutError:
            raise AssertionError(f"{name} never {state}: {self.path(name)}") from None

    async def settled(self, name: str = "p") -> None:
        """Wait until the life task of ``name`` has ended."""
        task = self.lives[name].task
        assert task is not None
        async with asyncio.timeout(HANG):
            await asyncio.shield(task)

    def edges(self, name: str = "p") -> list[tuple[State, State]]:
        return [
            (e.old, e.new) for e in self.events if isinstance(e, StateChanged) and e.process == name
        ]

    def path(self, name: str = "p") -> list[State]:
        """The states ``name`` went through, its first included."""
        edges = self.edges(name)
        return [edges[0][0], *(new for _, new in edges)] if edges else [self.lives[name].state]

    def reasons(self, name: str = "p") -> list[str]:
        return [e.reason for e in self.events if isinstance(e, StateChanged) and e.process == name]

    def restarting(self) -> list[Restarting]:
        return [e for e in self.events if isinstance(e, Restarting)]

    def probes(self, probe: str) -> list[ProbeResult]:
        return [e for e in self.events if isinstance(e, ProbeResult) and e.probe == probe]

    def notices(self, text: str = "") -> list[str]:
        return [e.message for e in self.events if isinstance(e, Notice) and text in e.message]

    async def close(self) -> None:
        """Stop every life; fail on a life that ended on an internal error."""
        async with asyncio.timeout(HANG):
            for life in reversed(list(self.lives.values())):
                await life.stop()
        errors = self.notices("internal error")
        assert not errors, errors


async def eventually(predicate: Callable[[], bool]) -> None:
    """Let the machine's tasks run until ``predicate()`` holds."""
    async with asyncio.timeout(HANG):
        while not predicate():
            await asyncio.sleep(0)


def spec(name: str = "p", **fields: Any) -> ProcessSpec:
    """A spec whose command nobody runs (the spawn is fake)."""
    return ProcessSpec(name=name, command=["fake", name], **fields)
