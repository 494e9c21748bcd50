"""The trainer against the real rollout API: leased batches acked, API restart survived,
bounded wait with a clear error when the API is not there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from free_ports import free_port
from train_helpers import REPO, make_groups, tiny_model, trainer_env

from grpo_trainer.train.api_client import ApiClient, Registration

STEPS = 4


class Api:
    """``python -m grpo_trainer.api`` in its own process group, on a fixed port and db."""

    def __init__(self, db: Path, port: int) -> None:
        self.db, self.port = db, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Api:
        command = [
            sys.executable,
            "-m",
            "grpo_trainer.api",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--db",
            str(self.db),
        ]
        self.proc = subprocess.Popen(
            command,
            env=trainer_env(),
            cwd=REPO,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._healthy, 60, "API health")
        return self

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, "API exited at start"
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def procs() -> Iterator[list]:
    """Processes and APIs a test starts; all are killed (their process groups) at teardown."""
    started: list = []
    yield started
    for item in started:
        if isinstance(item, Api):
            item.kill()
        elif item.poll() is None:
            os.killpg(item.pid, signal.SIGKILL)
            item.wait(10)


def test_trainer_leases_acks_and_survives_api_restart(tmp_path: Path, procs) -> None:
    model = tiny_model(tmp_path / "model")
    groups = make_groups(model, count=2 * STEPS, group_size=2, seed=9, policy_version=0)
    api = Api(tmp_path / "rollouts.db", free_port()).start()
    procs.append(api)
    metrics = tmp_path / "metrics.jsonl"
    command = [
        sys.executable,
        "-m",
        "grpo_trainer.train",
        "--model-name",
        str(model),
        "--atropos-url",
        api.url,
        "--save-path",
        str(tmp_path / "ckpt"),
        "--training-steps",
        str(STEPS),
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        "--lr",
        "1e-3",
        "--sync-every",
        "0",
        "--metrics-file",
        str(metrics),
        "--lease-seconds",
        "30",
    ]
    trainer = subprocess.Popen(
        command,
        env=trainer_env(),
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    procs.append(trainer)
    info = lambda: httpx.get(f"{api.url}/info", timeout=5).json()  # noqa: E731
    wait_until(lambda: info()["batch_size"] == 4, 60, "trainer registration")
    env = {"max_token_length": 64, "desired_name": "probe", "group_size": 2}
    env_ids: list[int] = []

    def env_registered() -> bool:  # the API answers "wait" until the trainer polled /batch
        answer = httpx.post(f"{api.url}/register-env", json=env, timeout=5).json()
        env_ids.extend([answer["env_id"]] if "env_id" in answer else [])
        return bool(env_ids)

    wait_until(env_registered, 30, "an environment registered")

    def served() -> int | None:
        answer = httpx.get(f"{api.url}/status-env", params={"env_id": env_ids[0]}, timeout=5)
        return answer.json()["served_version"]

    wait_until(lambda: served() == 0, 30, "the start weights reported as served")
    assert httpx.post(f"{api.url}/scored_data_list", json=groups[:4], timeout=10).status_code == 200

    def steps_done() -> list[int]:
        if not metrics.exists():
            return []
        return [json.loads(line)["step"] for line in metrics.read_text().splitlines()]

    wait_until(lambda: steps_done() == [1, 2], 120, "two steps on API batches")
    wait_until(lambda: httpx.get(f"{api.url}/status").json()["current_step"] == 2, 30, "acks")

    api.kill()  # the API dies while the trainer waits for its third batch
    api.start()  # and comes back on the same port with its durable queue
    status = httpx.get(f"{api.url}/status", timeout=5).json()
    assert status["current_step"] == 2
    assert httpx.post(f"{api.url}/scored_data_list", json=groups[4:], timeout=10).status_code == 200
    out, _ = trainer.communicate(timeout=180)
    assert trainer.returncode == 0, out
    assert "grpo-trainer ready" in out
    assert steps_done() == [1, 2, 3, 4]
    final = httpx.get(f"{api.url}/status", timeout=5).json()
    assert (final["current_step"], final["queue_size"]) == (STEPS, 0)
    lags = [json.loads(line)["data"]["off_policy_lag"] for line in metrics.read_text().splitlines()]
    assert lags == [0, 1, 2, 3]
    assert served() == 0  # the restarted API's re-registration reset it; the trainer re-sent it


def test_unreachable_api_is_a_clear_error_after_a_bounded_wait(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "model")
    port = free_port()  # nothing listens here
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_trainer.train",
            "--model-name",
            str(model),
            "--atropos-url",
            f"http://127.0.0.1:{port}",
            "--save-path",
            str(tmp_path / "ckpt"),
            "--sync-every",
            "0",
            "--api-timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=trainer_env(),
        cwd=REPO,
    )
    assert proc.returncode == 1
    assert f"rollout API at http://127.0.0.1:{port} did not answer within 2 s" in proc.stderr
    assert "grpo-trainer ready" not in proc.stdout


def test_a_starving_trainer_says_why(tmp_path: Path, procs) -> None:
    """No batch for a while (environments dropping every all-equal group, as in the
    two-GPU stall): the trainer logs how much the API holds and where to look."""
    api = Api(tmp_path / "api.db", free_port()).start()
    procs.append(api)
    said: list[tuple[str, str]] = []
    client = ApiClient(api.url, log=lambda level, message: said.append((level, message)),
                       starving_after=0.3)  # fmt: skip
    registration = Registration(
        batch_size=8, max_token_len=64, checkpoint_dir=str(tmp_path), save_checkpoint_interval=0,
        num_steps=4,
    )  # fmt: skip
    try:
        client.register(registration, 0)
        assert client.next_batch(lambda: len(said) >= 2) is None
    finally:
        client.close()
    assert [level for level, _ in said] == ["warning", "warning"]
    assert "the API holds 0 queued sequences of the 8 a step needs" in said[0][1]
    assert "groups_dropped_equal_scores" in said[0][1]
    first, second = (float(message.split()[3]) for _, message in said)
    assert second >= 2 * first  # then at doubling intervals, not every poll
