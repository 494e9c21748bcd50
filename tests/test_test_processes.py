"""A test run that is killed (a CI timeout's SIGTERM, or SIGKILL) leaves nothing behind.

A real pytest runs a test that starts, in its own session (as the server fixtures do, so no
process-group signal reaches it), either the real rollout API or a real headless
``grpo-tui run`` supervising a long-lived child, and then hangs; the outer test kills that
pytest and waits for every one of those processes to be gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from free_ports import free_port

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CHILD = TESTS / "cli" / "headless_child.py"

HANGING_TEST = """
import os, subprocess, sys, threading, time
from pathlib import Path

import httpx
import psutil


def start_api():
    port = int(os.environ["GUARD_PORT"])
    server = subprocess.Popen(
        [sys.executable, "-m", "grpo_trainer.api", "--port", str(port), "--db", ":memory:"],
        start_new_session=True,
    )
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.1)


def start_run():
    run = subprocess.Popen(
        [sys.executable, "-m", "grpo_tui", "run", os.environ["GUARD_PROFILE"]],
        start_new_session=True, stdout=subprocess.DEVNULL,
    )
    while not any("headless_child" in " ".join(p.cmdline()) for p in
                  psutil.Process(run.pid).children(recursive=True)):
        time.sleep(0.1)
    return run


def test_starts_and_hangs(tmp_path):
    started = start_api() if os.environ["GUARD_WHAT"] == "api" else start_run()
    Path(os.environ["GUARD_PID_FILE"]).write_text(str(started.pid))
    threading.Event().wait()
"""


@pytest.mark.parametrize("what", ["api", "run"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_nothing_outlives_a_killed_test_run(tmp_path: Path, sig: signal.Signals, what: str) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGING_TEST)
    profile = tmp_path / "profile.toml"
    worker = json.dumps([sys.executable, str(CHILD), "worker", "--life", "600"])
    profile.write_text(
        f'[run]\nname = "guard"\noutput_dir = "{tmp_path / "runs"}"\nexit_with = "worker"\n'
        f"[process.worker]\ncommand = {worker}\n"
    )
    pid_file = tmp_path / "started.pid"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "GUARD_WHAT": what,
        "GUARD_PORT": str(free_port()),
        "GUARD_PROFILE": str(profile),
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
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert inner.poll() is None, "the inner test run ended before its processes were up"
            assert time.monotonic() < deadline, "the inner test's processes never came up"
            time.sleep(0.1)
        started = psutil.Process(int(pid_file.read_text()))
        family = [started, *started.children(recursive=True)]
        assert len(family) >= (1 if what == "api" else 3)  # run: supervisor, watchdog, worker
        os.kill(inner.pid, sig)
        inner.wait(30)
        _, alive = psutil.wait_procs(family, timeout=40)
        left = [f"{p.pid} {' '.join(p.cmdline())}" for p in alive if p.is_running()]
        assert not left, f"outlived the killed test run: {left}"
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
