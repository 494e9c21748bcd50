"""Session-wide: every process a test starts is tied to the test run (see process_guard),
and the tiny-model cache (``GRPO_TUI_CACHE``) is a folder of this session, not the user's
home: the first test that builds the tiny model fills it, the later ones copy from it."""

import os
import shutil
import tempfile

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
