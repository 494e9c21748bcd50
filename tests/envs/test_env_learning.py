"""The toy task is learned through the real pipeline: rollout API, built-in inference server
(weights shared in place with the trainer, ``shared_vllm``), GRPO trainer and the toy
environment as four processes. A shortened run must show a clear reward rise.

Settings from ``benchmarks/toy_learnability.py`` (the quickstart's): group 8, 16 prompts per
step, lr 1e-3 after 10 warm-up steps, KL beta 0.04;
the queue is held to one batch ahead (``--max-batches-offpolicy 1``) so the off-policy
lag stays near one step, as in the in-process check."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from env_procs import api_argv, env_argv, free_port, serve_argv

from grpo_trainer.models import build_tiny_model

STEPS = 70
GROUP = 8
PROMPTS_PER_STEP = 16


def reward_curve(metrics_file: Path) -> list[tuple[int, float]]:
    """(step, reward/mean) of every trainer record."""
    curve = []
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        data = record.get("data", record)
        if "reward/mean" in data:
            curve.append((int(record.get("step", 0)), float(data["reward/mean"])))
    return curve


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_toy_reward_rises_through_the_real_pipeline(spawn, tmp_path) -> None:
    model = build_tiny_model(tmp_path / "model", seed=0)
    api_port, serve_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    inference = f"http://127.0.0.1:{serve_port}"
    spawn(
        "api", api_argv(api_port, tmp_path / "rollouts.db", "--max-batches-offpolicy", "1")
    ).wait_http(f"{api}/health")
    spawn(
        "serve", serve_argv(model, serve_port, "--shared-weights", str(tmp_path / "shared"))
    ).wait_http(f"{inference}/health")
    metrics_file = tmp_path / "metrics.jsonl"
    trainer = spawn(
        "trainer",
        [sys.executable, "-m", "grpo_trainer.train", "--model-name", str(model),
         "--atropos-url", api, "--inference-url", inference, "--served-model-name", "policy",
         "--weight-bridge-mode", "shared_vllm", "--save-path", str(tmp_path / "checkpoints"),
         "--training-steps", str(STEPS), "--batch-size", str(GROUP * PROMPTS_PER_STEP),
         "--group-size", str(GROUP), "--lr", "1e-3", "--warmup-steps", "10", "--beta", "0.04",
         "--checkpoint-interval", "0",
         "--device", "cpu", "--metrics-file", str(metrics_file)],
    )  # fmt: skip
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs.toy", api, inference, model, "--group-size", str(GROUP),
                 "--max-concurrency", "8", "--eval-every", "35", "--eval-k", "4"),
    )  # fmt: skip
    env.wait_line("grpo-env registered")
    started = time.monotonic()
    assert trainer.wait(timeout=540) == 0, trainer.text()[-3000:]
    minutes = (time.monotonic() - started) / 60

    curve = reward_curve(metrics_file)
    assert len(curve) == STEPS
    first = sum(r for _, r in curve[:5]) / 5
    last = sum(r for _, r in curve[-5:]) / 5
    print(f"toy reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}, {minutes:.1f} min")
    assert first < 0.2
    assert last >= 0.6
    # The environment evaluates the final policy on all ten prompts once the last step lands.
    final_eval = env.wait_line(rf"step={STEPS} eval/mean@4=(\S+) eval/pass@4=(\S+)", 120)
    initial_eval = env.wait_line(r"step=0 eval/mean@4=(\S+)", 1)
    assert float(final_eval.group(1)) > float(initial_eval.group(1))
    assert float(final_eval.group(1)) >= 0.5
