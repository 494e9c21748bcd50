"""Helpers to run the real rollout API process and to speak to it like Atropos clients."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from free_ports import free_port as free_port

START_DEADLINE = 30.0


class ApiServer:
    """One ``python -m grpo_trainer.api`` process in its own process group."""

    def __init__(self, db: Path | str, log: Path, args: list[str]) -> None:
        self.db = db
        self.log = log
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "grpo_trainer.api",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--db",
            str(self.db),
            *self.args,
        ]

    def start(self) -> ApiServer:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"API exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)  # poll interval while the port is not open yet
        raise RuntimeError(f"API not healthy within {START_DEADLINE}s: {self.log.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal our own process group and reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **kwargs)


TRAINER = {
    "wandb_group": "grp",
    "wandb_project": "proj",
    "batch_size": 8,
    "max_token_len": 32,
    "checkpoint_dir": "/tmp/ckpt",
    "save_checkpoint_interval": 5,
    "starting_step": 0,
    "num_steps": 100,
}


def env_registration(name: str = "toy", group_size: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "max_token_length": 32,
        "desired_name": name,
        "weight": 1.0,
        "group_size": group_size,
        **extra,
    }


def group(marker: int, size: int = 4, env_id: int | None = 0, **extra: Any) -> dict[str, Any]:
    """A valid group whose first token is ``marker`` (to recognise it when served)."""
    tokens = [[marker, 5, 6, 7] for _ in range(size)]
    return {
        "tokens": tokens,
        "masks": [[-100, 5, 6, 7] for _ in range(size)],
        "scores": [float(i % 2) for i in range(size)],
        "inference_logprobs": [[1.0, -0.1, -0.2, -0.3] for _ in range(size)],
        "env_id": env_id,
        **extra,
    }


def start_run(client: httpx.Client, batch_size: int = 8, **envs: int) -> dict[str, int]:
    """Register a trainer, take the first (empty) batch, register ``name=group_size`` envs."""
    assert client.post("/register", json={**TRAINER, "batch_size": batch_size}).status_code == 200
    assert client.get("/batch").json() == {"batch": None}
    ids = {}
    for name, size in (envs or {"toy": 4}).items():
        answer = client.post("/register-env", json=env_registration(name, size)).json()
        assert answer["status"] == "success", answer
        ids[name] = answer["env_id"]
    return ids


def markers(batch: list[dict[str, Any]]) -> list[int]:
    return [g["tokens"][0][0] for g in batch]
