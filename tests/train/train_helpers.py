"""Shared pieces of the trainer tests: a tiny model, deterministic groups, trainer runs."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import torch

from grpo_trainer.models import build_tiny_model, load_model
from grpo_trainer.train.logprobs import naive_token_logprobs

IGNORE = -100
REPO = Path(__file__).resolve().parents[2]

# Tiny models on shared cores: one intra-op thread avoids OpenMP oversubscription, which
# makes a step 10x slower when the machine is busy (the subprocesses get OMP_NUM_THREADS=1).
torch.set_num_threads(1)


def tiny_model(path: Path, seed: int = 0) -> Path:
    """A tiny Qwen2 model directory (built once per path)."""
    if not (path / "config.json").exists():
        build_tiny_model(path, seed=seed)
    return path


def make_groups(
    model_path: Path,
    *,
    count: int,
    group_size: int,
    seed: int,
    prompt_len: int = 5,
    completion_len: int = 6,
    temperature: float = 1.0,
    policy_version: int | None = None,
) -> list[dict]:
    """Deterministic groups with inference logprobs computed by the model itself."""
    rng = random.Random(seed)
    model = load_model(model_path)
    groups = []
    for _ in range(count):
        prompt = [rng.randrange(5, 44) for _ in range(prompt_len)]
        tokens = [
            prompt + [rng.randrange(5, 44) for _ in range(completion_len - rng.randrange(3))]
            for _ in range(group_size)
        ]
        logprobs = []
        for seq in tokens:
            ids = torch.tensor([seq])
            with torch.no_grad():
                out = naive_token_logprobs(
                    model, ids, torch.ones_like(ids), torch.tensor([temperature])
                )
            logprobs.append([1.0] * prompt_len + out.logprobs[0, prompt_len - 1 :].tolist())
        group = {
            "tokens": tokens,
            "masks": [[IGNORE] * prompt_len + seq[prompt_len:] for seq in tokens],
            "scores": [rng.random() for _ in tokens],
            "inference_logprobs": logprobs,
            "generation_params": {"temperature": temperature},
        }
        if policy_version is not None:
            group["policy_version"] = policy_version
        groups.append(group)
    return groups


def write_groups(path: Path, groups: list[dict], mode: str = "w") -> Path:
    with path.open(mode) as handle:
        for group in groups:
            handle.write(json.dumps(group) + "\n")
    return path


def trainer_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GRPO_TUI_") or k == "GRPO_TUI_RUN_ID"  # the test run's tag
    }
    env.update({"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


def trainer_command(model: Path, save: Path, batches: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "grpo_trainer.train",
        "--model-name",
        str(model),
        "--save-path",
        str(save),
        "--batches-file",
        str(batches),
        "--sync-every",
        "0",
        "--lr",
        "1e-3",
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        *extra,
    ]


def run_trainer(
    command: list[str], timeout: float = 120, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=trainer_env(**env), cwd=REPO
    )
