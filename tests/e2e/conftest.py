"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from e2e_stack import HeadlessCli
from grpo_stack_run import Stack

SHUTDOWN_WAIT = 120.0
"""Seconds a stack may take to shut down at teardown (the trainer's last step and
checkpoint included); longer is a hang, reported with each process's state."""


@pytest.fixture
def cli() -> Iterator[list[HeadlessCli]]:
    """Runs started by a test; any still alive at teardown get an ordered shutdown."""
    runs: list[HeadlessCli] = []
    yield runs
    for run in runs:
        run.stop()


@pytest.fixture
async def stacks() -> AsyncIterator[list[Stack]]:
    """Stacks started by a test; any still running at teardown are shut down in order."""
    started: list[Stack] = []
    yield started
    hung = []
    for stack in started:
        try:
            async with asyncio.timeout(SHUTDOWN_WAIT):
                if not stack.task.done():
                    await stack.supervisor.shutdown("test teardown")
                await asyncio.gather(stack.task, return_exceptions=True)
        except TimeoutError:
            status = stack.supervisor.status().items()
            hung.append({name: process.state.value for name, process in status})
    assert not hung, f"a stack's shutdown took over {SHUTDOWN_WAIT} s: {hung}"
