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


@pytest.fixture(scope="session")
def recorded_rollouts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with ``recorded_rollouts.py``'s records (rollouts and timeline)."""
    from recorded_rollouts import write_recorded_rollouts

    path = tmp_path_factory.mktemp("recorded-run")
    write_recorded_rollouts(path)
    return path
