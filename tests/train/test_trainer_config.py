"""Trainer flags: Atropos names round-trip; bad values exit 2 with one line per problem."""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from train_helpers import REPO, tiny_model, trainer_env

from grpo_trainer.train.config import ConfigError, TrainerConfig


def test_argv_round_trip_keeps_every_value() -> None:
    config = TrainerConfig(
        model_name="m",
        lr=3e-3,
        training_steps=7,
        batch_size=4,
        gradient_accumulation_steps=2,
        weight_bridge_mode="lora_only",
        lora_target_modules=["q_proj", "k_proj"],
        use_wandb=True,
        wandb_project="p",
        clip_eps_high=0.28,
        tis_cap=3.0,
    )
    argv = config.to_argv()
    assert argv[:2] == ["--model-name", "m"]
    assert "--gradient-accumulation-steps" in argv and "--use-wandb" in argv
    assert TrainerConfig.from_argv(argv) == config
    assert config.step_batch_size == 8
    assert config.argv()[1:3] == ["-m", "grpo_trainer.train"]


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_argv(
            ["--model-name", "m", "--lr", "-1", "--batch-size", "x", "--loss-type", "ppo"]
        )
    assert len(info.value.problems) == 3
    joined = "\n".join(info.value.problems)
    assert "--lr" in joined and "--batch-size" in joined and "--loss-type" in joined


def test_batch_must_hold_whole_groups() -> None:
    with pytest.raises(ConfigError, match="not a multiple of group_size 3"):
        TrainerConfig.from_argv(["--model-name", "m", "--batch-size", "4", "--group-size", "3"])


def test_bad_config_exits_2_before_loading_anything() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_trainer.train",
            "--model-name",
            "/nonexistent/model",
            "--lr",
            "-0.1",
            "--batch-size",
            "0",
            "--loss-type",
            "unknown",
            "--clip-eps",
            "1.5",
            "--device",
            "tpu",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=trainer_env(),
        cwd=REPO,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 5, proc.stderr
    for flag in ("--lr", "--batch-size", "--loss-type", "--clip-eps", "--device"):
        assert sum(flag + ":" in line for line in lines) == 1


def test_absent_lora_target_modules_exit_2(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "model")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_trainer.train",
            "--model-name",
            str(model),
            "--weight-bridge-mode",
            "lora_only",
            "--lora-target-modules",
            "q_proj",
            "attn_qkv",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=trainer_env(),
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "--lora-target-modules: attn_qkv not found" in proc.stderr
    assert "q_proj" not in proc.stderr.split("not found")[0].split(":")[-1]
    assert "grpo-trainer ready" not in proc.stdout


def test_missing_optional_packages_are_config_errors() -> None:
    from grpo_trainer.train.__main__ import preflight

    config = TrainerConfig(
        model_name="m", optimizer="adamw_8bit", use_wandb=True, wandb_project="p"
    )
    problems = preflight(config)
    assert any("bitsandbytes" in p for p in problems) == (find_spec("bitsandbytes") is None)
    assert any("wandb is not installed" in p for p in problems) == (find_spec("wandb") is None)


def test_cpu_threads_default_to_one_on_cpu_and_stay_torchs_on_gpu() -> None:
    assert TrainerConfig(model_name="m").torch_threads == 1
    assert TrainerConfig(model_name="m", cpu_threads=4).torch_threads == 4
    assert TrainerConfig(model_name="m", cpu_threads=0).torch_threads is None
    assert TrainerConfig(model_name="m", device="cuda").torch_threads is None
    assert TrainerConfig(model_name="m", device="cuda:1", cpu_threads=2).torch_threads == 2
    assert "--cpu-threads" not in TrainerConfig(model_name="m").to_argv()
    with pytest.raises(ConfigError, match="--cpu-threads"):
        TrainerConfig.from_argv(["--model-name", "m", "--cpu-threads", "-1"])


def test_colocate_refuses_a_sync_cadence_that_could_train_on_a_sleeping_engine() -> None:
    with pytest.raises(ConfigError, match="colocate syncs after every step"):
        TrainerConfig.from_argv(
            ["--model-name", "m", "--weight-bridge-mode", "colocate", "--sync-every", "2"]
        )
    config = TrainerConfig.from_argv(
        ["--model-name", "m", "--weight-bridge-mode", "colocate", "--max-sync-lag", "0"]
    )
    assert (config.sync_every, config.max_sync_lag) == (1, 0)


def test_only_a_restarting_sync_needs_the_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    """``none`` with ``--none-reload restart`` restarts inference through the supervisor; by
    default (every backend) it reloads in place, so the trainer runs without one."""
    from grpo_trainer.train.__main__ import preflight

    monkeypatch.delenv("GRPO_TUI_SOCKET", raising=False)
    mode = {"weight_bridge_mode": "none", "model_name": "m"}
    restarting = TrainerConfig(**mode, none_reload="restart")
    assert any("needs the grpo-tui supervisor" in p for p in preflight(restarting))
    for backend in ("builtin", "vllm", "sglang"):
        in_place = TrainerConfig(**mode, inference_backend=backend)
        assert not any("supervisor" in p for p in preflight(in_place)), backend
