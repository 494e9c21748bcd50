"""Ties every process the tests start to the test run, the way the supervisor ties its own.

Loaded by ``tests/conftest.py`` (and with ``-p process_guard``): at start the session tags
its own environment with a fresh ``GRPO_TUI_RUN_ID`` (so every server, trainer or
environment a test spawns inherits it, ``setsid`` daemons included) and starts the
supervisor's watchdog (:mod:`grpo_tui.supervisor.watchdog`) on a lifeline pipe that only
pytest holds. When pytest ends, however it ends (a CI timeout's SIGTERM, SIGKILL, a normal
exit), the kernel closes the pipe and the watchdog ends every tagged process still alive.
Processes a supervisor under test starts carry its run's tag and its own watchdog.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from grpo_tui.supervisor.tree import RUN_ID_VAR

_guard: dict[str, object] = {}


def pytest_configure(config: pytest.Config) -> None:
    if _guard:
        return
    run_id = f"pytest-{uuid.uuid4().hex[:12]}"
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != RUN_ID_VAR}
    command = [sys.executable, "-m", "grpo_tui.supervisor.watchdog", "--fd", str(read_end)]
    watchdog = subprocess.Popen(
        [*command, "--run-id", run_id],
        pass_fds=(read_end,),
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    os.close(read_end)
    os.environ[RUN_ID_VAR] = run_id
    _guard.update(run_id=run_id, lifeline=write_end, watchdog=watchdog)


def pytest_unconfigure(config: pytest.Config) -> None:
    """End of the session: the watchdog ends whatever a test left running."""
    lifeline = _guard.pop("lifeline", None)
    watchdog = _guard.pop("watchdog", None)
    if isinstance(lifeline, int):
        os.close(lifeline)
    if isinstance(watchdog, subprocess.Popen):
        try:
            watchdog.wait(30)
        except subprocess.TimeoutExpired:
            watchdog.kill()
