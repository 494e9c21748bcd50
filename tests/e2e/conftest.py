"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from e2e_stack import HeadlessCli
from grpo_stack_run import Stack


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
    for stack in started:
        if not stack.task.done():
            await stack.supervisor.shutdown("test teardown")
        await asyncio.gather(stack.task, return_exceptions=True)
