"""Real processes for environment tests: the rollout API, the built-in inference server,
environment runners, and a test-side trainer that speaks the API's trainer protocol."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from free_ports import free_port as free_port

START_DEADLINE = 90.0
POLL = 0.05


def wait_until(condition: Callable[[], Any], deadline_s: float, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(POLL)
    raise AssertionError(f"timed out after {deadline_s:.0f}s waiting for {what}")


class Proc:
    """One child in its own process group, output to a log file; stopped by group."""

    def __init__(
        self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=None if self.env is None else {**os.environ, **self.env},
            )
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_http(self, url: str, deadline_s: float = START_DEADLINE) -> Proc:
        def healthy() -> bool:
            if not self.alive:
                raise AssertionError(f"{self.name} exited: {self.text()[-3000:]}")
            try:
                return httpx.get(url, timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, deadline_s, f"{self.name} at {url}")
        return self

    def wait_line(self, pattern: str, deadline_s: float = START_DEADLINE) -> re.Match[str]:
        regex = re.compile(pattern)

        def found() -> re.Match[str] | None:
            match = regex.search(self.text())
            if match is None and not self.alive:
                raise AssertionError(f"{self.name} exited: {self.text()[-3000:]}")
            return match

        return wait_until(found, deadline_s, f"{pattern!r} in {self.name}'s output")

    def send_signal(self, sig: int) -> None:
        if self.alive:
            assert self.popen is not None
            os.killpg(self.popen.pid, sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.popen is not None
        return self.popen.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        """Signal our own process group, then SIGKILL it if it outlives ``timeout``."""
        if not self.alive:
            return
        assert self.popen is not None
        os.killpg(self.popen.pid, sig)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)


def api_argv(port: int, db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grpo_trainer.api", "--host", "127.0.0.1", "--port",
            str(port), "--db", str(db), *extra]  # fmt: skip


def serve_argv(model: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grpo_trainer.serve", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", "policy", "--dtype", "float32",
            *extra]  # fmt: skip


def env_argv(module: str, api_url: str, inference_url: str, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", module, "--api-url", api_url, "--inference-url",
            inference_url, "--tokenizer", str(model), "--model-name", "policy",
            *extra]  # fmt: skip


class Trainer:
    """The trainer side of the API protocol, played by the test: register, take batches."""

    def __init__(self, api_url: str, batch_size: int, max_token_len: int = 64) -> None:
        self.client = httpx.Client(base_url=api_url, timeout=10.0)
        self.batch_size = batch_size
        self.max_token_len = max_token_len

    def register(self) -> None:
        body = {"batch_size": self.batch_size, "max_token_len": self.max_token_len,
                "num_steps": 1000}  # fmt: skip
        assert self.client.post("/register", json=body).status_code == 200
        assert self.client.get("/batch").status_code == 200  # marks the trainer started

    def status(self) -> dict[str, Any]:
        return self.client.get("/status").json()

    def take(self) -> list[dict[str, Any]]:
        """One batch's groups, or [] when none is ready."""
        return self.client.get("/batch").json()["batch"] or []

    def close(self) -> None:
        self.client.close()


ENV_METRICS = re.compile(r"metrics step=\S+ (.*)")


def last_env_metrics(log_text: str) -> dict[str, float]:
    """The last ``metrics`` line an environment logged, as a dict."""
    lines = [m.group(1) for m in ENV_METRICS.finditer(log_text) if "env/groups_sent" in m.group(1)]
    assert lines, "the environment logged no metrics line"
    return {k: float(v) for k, v in (pair.split("=") for pair in lines[-1].split())}
