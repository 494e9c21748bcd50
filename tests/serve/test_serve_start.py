"""What each start of the built-in server sets up: its seed stream and its CPU threads.

A restarted server does not replay its earlier samples; a request's own seed still does.
Two real starts of the built-in server with the same ``--seed`` on the same weights (what
a restart in mode ``none`` with unchanged weights looks like): a seedless request must
sample differently, a request carrying ``seed`` exactly the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from serve_helpers import free_port

from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.start_gate import GATE_ENV

PROMPT = "abc"
SAMPLES = 8
TOKENS = 12


def sample(url: str, **extra: object) -> list[list[int]]:
    body = {
        "model": "policy",
        "prompt": PROMPT,
        "n": SAMPLES,
        "max_tokens": TOKENS,
        "temperature": 1.0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return [choice["token_ids"] for choice in response.json()["choices"]]


def test_each_start_samples_anew_unless_the_request_has_a_seed(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Both starts run side by side (ports differ; the port does not touch sampling).

    Each is then stopped on request (SIGTERM), which must read as a clean exit 0.
    """
    exit_codes: list[int | None] = []

    def first_requests(start: int) -> tuple[list[list[int]], list[list[int]]]:
        settings = InferenceSettings(port=free_port(), seed=7, max_model_len=64)
        launch = inference_command(settings, mode="none", model=str(tiny_model_dir))
        server = ServerProcess(launch, settings.base_url, tmp_path / f"start-{start}.log")
        try:
            server.start()
            return sample(server.base_url), sample(server.base_url, seed=11)
        finally:
            exit_codes.append(server.stop())

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(first_requests, range(2)))
    (seedless_a, seeded_a), (seedless_b, seeded_b) = runs
    # 8 x 12 tokens drawn from a 44-token vocabulary: equal only if the RNG stream repeats.
    assert seedless_a != seedless_b, "a restart replayed the previous start's samples"
    assert seeded_a == seeded_b, "a request's own seed must reproduce across starts"
    assert len(seedless_a) == SAMPLES and all(len(s) == TOKENS for s in seedless_a)
    assert exit_codes == [0, 0], "a requested stop must end the server with exit 0"


def test_a_cpu_server_runs_one_torch_thread_by_default(server: ServerProcess) -> None:
    """The role layer's command (``inference_command``, device cpu, threads unset)."""
    assert "--cpu-threads" in server.launch.argv
    assert "torch CPU threads: 1" in server.log_path.read_text()


def test_a_gated_server_becomes_the_command_handed_through_its_gate(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A standby: started for one port and name, it serves the ones handed at its gate."""
    spare = inference_command(
        InferenceSettings(port=free_port(), served_model_name="old"), mode="none", model="nope"
    )
    new = InferenceSettings(port=free_port(), served_model_name="new", max_model_len=64)
    become = inference_command(new, mode="none", model=str(tiny_model_dir))
    assert spare.argv[:3] == become.argv[:3] == [sys.executable, "-m", "grpo_trainer.serve"]
    with (tmp_path / "standby.log").open("wb") as log:
        proc = subprocess.Popen(
            spare.argv, env={**os.environ, GATE_ENV: "stdin"}, stdin=subprocess.PIPE,
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        assert proc.stdin is not None
        proc.stdin.write(f"start {json.dumps(become.argv)}\n".encode())
        proc.stdin.close()
        with httpx.Client(timeout=2) as client:
            for _ in range(600):
                assert proc.poll() is None, (tmp_path / "standby.log").read_text()
                try:
                    models = client.get(f"{new.base_url}/v1/models").json()
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
        assert [m["id"] for m in models["data"]] == ["new"]
    finally:
        proc.terminate()
        proc.wait(30)
