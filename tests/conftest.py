"""Session-wide: every process a test starts is tied to the test run (see process_guard),
and the tiny-model cache (``GRPO_TUI_CACHE``) is a folder of this session, not the user's
home: the first test that builds the tiny model fills it, the later ones copy from it."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from process_guard import pytest_configure as guard_configure
from process_guard import pytest_unconfigure as guard_unconfigure

_cache: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    guard_configure(config)
    if "GRPO_TUI_CACHE" not in os.environ:
        _cache.append(tempfile.mkdtemp(prefix="grpo-tui-test-cache-"))
        os.environ["GRPO_TUI_CACHE"] = _cache[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    guard_unconfigure(config)
    while _cache:
        shutil.rmtree(_cache.pop(), ignore_errors=True)


HEAVY_DIRS = ("bench", "e2e", "sweep")
"""Test folders whose tests run a whole stack (tens of seconds each), as ``e2e`` tests do."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whole-stack tests first in each half of the order, alternately. Under ``-n 2 --dist
    worksteal`` (``.ci/run``) each worker starts on one half and an idle worker steals the
    tail of the other's queue: the long tests are then shared from the start, not left to
    one worker at the end. Deterministic, so every worker collects the same order."""

    def heavy(item: pytest.Item) -> bool:
        folder = item.path.relative_to(item.config.rootpath).parts[1:2]
        return item.get_closest_marker("e2e") is not None or folder in [(d,) for d in HEAVY_DIRS]

    long, short = [i for i in items if heavy(i)], [i for i in items if not heavy(i)]
    first = long[0::2]
    cut = max(0, len(items) // 2 - len(first))
    items[:] = first + short[:cut] + long[1::2] + short[cut:]


@pytest.fixture(scope="session")
def recorded_rollouts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with ``recorded_rollouts.py``'s records (rollouts and timeline)."""
    from recorded_rollouts import write_recorded_rollouts

    path = tmp_path_factory.mktemp("recorded-run")
    write_recorded_rollouts(path)
    return path
