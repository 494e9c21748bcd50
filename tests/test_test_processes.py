"""A test run that is killed (a CI timeout's SIGTERM, or SIGKILL) leaves no server behind.

A real pytest runs a test that starts the real rollout API in its own session (as the
server fixtures do, so no process-group signal reaches it) and then hangs; the outer test
kills that pytest and waits for the API to be gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

HANGING_TEST = """
import os, subprocess, sys, threading, time
from pathlib import Path

import httpx


def test_starts_a_server_and_hangs(tmp_path):
    port = int(os.environ["GUARD_PORT"])
    server = subprocess.Popen(
        [sys.executable, "-m", "grpo_trainer.api", "--port", str(port), "--db", ":memory:"],
        start_new_session=True,
    )
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    Path(os.environ["GUARD_PID_FILE"]).write_text(str(server.pid))
    threading.Event().wait()
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_servers_die_with_a_killed_test_run(tmp_path: Path, sig: signal.Signals) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGING_TEST)
    pid_file = tmp_path / "server.pid"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "GUARD_PORT": str(free_port()),
        "GUARD_PID_FILE": str(pid_file),
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "process_guard",
        "-p",
        "no:cacheprovider",
    ]
    inner = subprocess.Popen(
        [*command, "--timeout", "0", str(tmp_path / "test_hangs.py")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert inner.poll() is None, "the inner test run ended before its server was up"
            assert time.monotonic() < deadline, "the inner test's server never came up"
            time.sleep(0.1)
        server = psutil.Process(int(pid_file.read_text()))
        assert server.is_running()
        os.kill(inner.pid, sig)
        inner.wait(30)
        _, alive = psutil.wait_procs([server], timeout=30)
        assert not alive, f"the API server (pid {server.pid}) outlived the killed test run"
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
