"""Run an inference server as a child process: start, wait for ``/health``, stop.

The child gets its own session (process group), so ``stop`` ends it and anything it
spawned, and nothing else. Used by tests, benchmarks and anything that needs a server
without the supervisor. Torch-free.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from grpo_trainer.serve.command_lines import InferenceLaunch


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; carries its log tail."""


class ServerProcess:
    """One inference server child, addressed by ``base_url``."""

    def __init__(self, launch: InferenceLaunch, base_url: str, log_path: Path) -> None:
        self.launch = launch
        self.base_url = base_url.rstrip("/")
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180.0) -> float:
        """Spawn the server and poll ``/health`` until 200; returns seconds to ready."""
        begin = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.launch.argv,
                env={**os.environ, **self.launch.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = begin + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"server exited with {self.process.returncode}: {self.log_tail()}"
                )
            try:
                status = httpx.get(f"{self.base_url}/health", timeout=2.0).status_code
                if status == 200:
                    return time.monotonic() - begin
                last = f"HTTP {status}"
            except httpx.HTTPError as error:
                last = f"{type(error).__name__}: {error}"
            time.sleep(0.1)
        self.stop()
        raise ServerStartError(
            f"server not healthy within {timeout:.0f} s (last /health: {last}): {self.log_tail()}"
        )

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM our process group, SIGKILL it after ``timeout``; returns the exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.process = None
        return process.returncode

    def log_tail(self, size: int = 3000) -> str:
        """The end of the server's log."""
        if not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-size:].decode(errors="replace")
