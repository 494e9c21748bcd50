"""No orphans, ever: SIGKILL the supervisor and everything it started is gone within 5 s."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import CHILDREN, alive


@pytest.fixture
def recorded_pids() -> Iterator[list[int]]:
    """Pids this test started (directly or through its supervisor); killed if still alive."""
    pids: list[int] = []
    yield pids
    for pid in alive(pids):
        os.kill(pid, signal.SIGKILL)


def wait_for_file(path: Path, host: psutil.Popen, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert host.poll() is None, "the supervisor host exited early"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def test_sigkilled_supervisor_leaves_no_descendant(tmp_path, recorded_pids) -> None:
    pidfile = tmp_path / "family.pids"
    host = psutil.Popen(
        [sys.executable, str(CHILDREN / "host.py"), str(tmp_path / "run"), str(pidfile)],
        stdout=-3,
        stderr=-3,
    )
    recorded_pids.append(host.pid)
    family = [int(line) for line in wait_for_file(pidfile, host).split()]
    recorded_pids.extend(family)
    assert len(alive(family)) == 4
    assert os.getpgid(family[3]) != family[0], "one grandchild left the process group"
    host.send_signal(signal.SIGKILL)
    host.wait()
    killed_at = time.monotonic()
    while alive(family) and time.monotonic() - killed_at < 5.0:
        time.sleep(0.05)
    assert alive(family) == [], "descendants outlived the supervisor by 5 s"


def test_sigkilled_supervisor_leaves_no_standby(tmp_path, recorded_pids) -> None:
    """A standby waits at its gate beside the running incarnation; both go with the
    supervisor (the watchdog knows the standby's group and the run's tag)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    host = psutil.Popen(
        [sys.executable, str(CHILDREN / "host_standby.py"), str(tmp_path / "run"), str(pids)],
        stdout=-3,
        stderr=-3,
    )
    recorded_pids.append(host.pid)
    deadline = time.monotonic() + 30
    while len(list(pids.iterdir())) < 2:  # the incarnation, then its standby, loaded
        assert host.poll() is None, "the supervisor host exited early"
        assert time.monotonic() < deadline, f"only {list(pids.iterdir())} loaded"
        time.sleep(0.05)
    family = [int(path.name) for path in pids.iterdir()]
    recorded_pids.extend(family)
    assert len(alive(family)) == 2
    host.send_signal(signal.SIGKILL)
    host.wait()
    killed_at = time.monotonic()
    while alive(family) and time.monotonic() - killed_at < 5.0:
        time.sleep(0.05)
    assert alive(family) == [], "the incarnation or its standby outlived the supervisor"
