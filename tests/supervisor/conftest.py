"""Fixtures for supervisor tests: real child scripts under a real supervisor, always cleaned up."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from free_ports import free_port as free_port

from grpo_tui.supervisor.events import Event, State, StateChanged
from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.supervisor import RunOutcome, Supervisor

CHILDREN = Path(__file__).with_name("children")
SHUTDOWN_WAIT = 60.0
"""Seconds a test's supervisor may take to shut down (every stop is bounded by its grace
and the SIGKILL after it; a minute is a hang, not a slow child)."""


def child(script: str, *args: object) -> list[str]:
    """Command line running one of the test child scripts with this interpreter."""
    return [sys.executable, str(CHILDREN / script), *map(str, args)]


def alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie counts as gone)."""
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            continue
    return left


def spec(name: str, command: list[str], **fields: Any) -> ProcessSpec:
    return ProcessSpec(name=name, command=command, **fields)


class Harness:
    """A supervisor running in the background plus every event it published."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor
        self.events: list[Event] = []
        self._arrived = asyncio.Event()
        self._subscription = supervisor.subscribe()
        self._collector = asyncio.create_task(self._collect())
        self.run_task: asyncio.Task[RunOutcome] = asyncio.create_task(supervisor.run())

    async def _collect(self) -> None:
        async for event in self._subscription:
            self.events.append(event)
            self._arrived.set()

    async def until(self, predicate: Callable[[Event], bool], timeout: float = 20.0) -> Event:
        """The first event satisfying ``predicate``, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if predicate(event):
                    return event
            seen = len(self.events)
            left = deadline - time.monotonic()
            if left <= 0 or (self.run_task.done() and not self._arrived.is_set()):
                raise AssertionError(f"no matching event within {timeout} s: {self.events[-5:]}")
            self._arrived.clear()
            try:
                async with asyncio.timeout(min(left, 0.5)):
                    await self._arrived.wait()
            except TimeoutError:
                continue

    async def state(self, process: str, state: State, timeout: float = 20.0) -> StateChanged:
        event = await self.until(
            lambda e: isinstance(e, StateChanged) and e.process == process and e.new == state,
            timeout,
        )
        assert isinstance(event, StateChanged)
        return event

    def changes(self, process: str) -> list[StateChanged]:
        return [e for e in self.events if isinstance(e, StateChanged) and e.process == process]

    async def close(self) -> None:
        """Ordered shutdown, bounded: one that hangs fails the test with each process's
        state, not the whole run (``SHUTDOWN_WAIT``)."""
        try:
            async with asyncio.timeout(SHUTDOWN_WAIT):
                if not self.run_task.done():
                    await self.sup.shutdown("test finished")
                await self.run_task
        except TimeoutError:
            states = {name: status.state.value for name, status in self.sup.status().items()}
            raise AssertionError(f"shutdown took over {SHUTDOWN_WAIT} s: {states}") from None
        finally:
            self._subscription.close()
        async with asyncio.timeout(SHUTDOWN_WAIT):
            await self._collector


@pytest.fixture
async def supervise(tmp_path: Path) -> AsyncIterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(specs: list[ProcessSpec], **kwargs: Any) -> Harness:
        harness = Harness(Supervisor(specs, tmp_path / f"run{len(made)}", **kwargs))
        made.append(harness)
        return harness

    yield make
    hung = []
    for harness in made:
        try:
            await harness.close()
        except AssertionError as exc:
            hung.append(str(exc))
    assert not hung, hung
