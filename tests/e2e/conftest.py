"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_stack import HeadlessCli


@pytest.fixture
def cli() -> Iterator[list[HeadlessCli]]:
    """Runs started by a test; any still alive at teardown get an ordered shutdown."""
    runs: list[HeadlessCli] = []
    yield runs
    for run in runs:
        run.stop()
