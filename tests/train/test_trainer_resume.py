"""Resume is exact: N steps straight == k steps, kill -9, --resume auto, N - k steps."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import (
    REPO,
    make_groups,
    run_trainer,
    tiny_model,
    trainer_command,
    trainer_env,
    write_groups,
)

from grpo_trainer.train.checkpoint import set_rng_state
from grpo_trainer.train.resume import resolve_resume

STEPS, KEPT = 6, 3
ARGS = ("--training-steps", str(STEPS), "--batch-size", "2", "--gradient-accumulation-steps", "2")


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts; each is killed with its process group at teardown."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def metric_steps(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_kill_minus_nine_then_resume_auto_matches_straight_run(tmp_path: Path, spawned) -> None:
    model = tiny_model(tmp_path / "model")
    groups = make_groups(model, count=2 * STEPS, group_size=2, seed=11)
    straight_data = write_groups(tmp_path / "all.jsonl", groups)
    straight = run_trainer(
        trainer_command(
            model, tmp_path / "straight", straight_data, *ARGS, "--checkpoint-interval", "0"
        )
    )
    assert straight.returncode == 0, straight.stderr

    # interrupted run: data for KEPT + 1 steps only, so the trainer trains step KEPT + 1,
    # then waits for more data; it is killed there, after the step_KEPT checkpoint
    partial = write_groups(tmp_path / "partial.jsonl", groups[: 2 * (KEPT + 1)])
    save = tmp_path / "interrupted"
    metrics = tmp_path / "interrupted-metrics.jsonl"
    command = trainer_command(
        model,
        save,
        partial,
        *ARGS,
        "--checkpoint-interval",
        str(KEPT),
        "--metrics-file",
        str(metrics),
    )
    proc = subprocess.Popen(
        command,
        env=trainer_env(),
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    spawned.append(proc)
    wait_for(lambda: KEPT + 1 in metric_steps(metrics), 120, f"step {KEPT + 1}", proc)
    assert (save / f"step_{KEPT}" / "trainer_state.json").exists()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert resolve_resume(save, "none").step == KEPT

    write_groups(partial, groups[2 * (KEPT + 1) :], mode="a")
    resumed = run_trainer(
        trainer_command(
            model,
            save,
            partial,
            *ARGS,
            "--checkpoint-interval",
            str(KEPT),
            "--metrics-file",
            str(metrics),
            "--resume",
            "auto",
        )
    )
    assert resumed.returncode == 0, resumed.stderr
    assert metric_steps(metrics) == [1, 2, 3, 4, *range(KEPT + 1, STEPS + 1)]

    want = load_file(tmp_path / "straight" / f"step_{STEPS}" / "model.safetensors")
    got = load_file(save / f"step_{STEPS}" / "model.safetensors")
    assert want.keys() == got.keys()
    worst = max(float((want[k] - got[k]).abs().max()) for k in want)
    assert worst <= 1e-6, f"resumed weights differ from the straight run by {worst}"
    initial = load_file(model / "model.safetensors")
    moved = max(float((initial[k] - got[k]).abs().max()) for k in initial)
    assert moved > 1e-4, "training did not change the weights: the comparison proves nothing"


def test_rng_of_a_multi_gpu_writer_restores_on_fewer_gpus(monkeypatch) -> None:
    """A rank of a 2-GPU trainer saved one CUDA RNG state per GPU it saw; resumed where one
    GPU is visible, the state of that GPU is restored and the other is not asked for (the
    2 -> 1 reshard failed on the H200 with ``IndexError`` in ``set_rng_state_all``).
    CUDA is not on this machine: its three calls are stood in for; the real path ran there."""
    restored: list[tuple[int, torch.Tensor]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, i: restored.append((i, s)))
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    state["cuda"] = [torch.tensor([1], dtype=torch.uint8), torch.tensor([2], dtype=torch.uint8)]
    set_rng_state(state)
    assert [(i, s.tolist()) for i, s in restored] == [(0, [1])]
