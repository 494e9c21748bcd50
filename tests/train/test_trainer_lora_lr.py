"""--lora-lr: the LoRA modes train at their own lr when set; full modes keep --lr."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from train_helpers import make_groups, tiny_model, write_groups

from grpo_trainer.train.config import ConfigError, TrainerConfig
from grpo_trainer.train.session import run_session


def test_lora_lr_applies_only_in_lora_modes() -> None:
    for mode, want in (("none", 1e-3), ("shared_vllm", 1e-3), ("lora_only", 2e-2),
                       ("lora_restart", 2e-2)):  # fmt: skip
        config = TrainerConfig(model_name="m", lr=1e-3, lora_lr=2e-2, weight_bridge_mode=mode)
        assert config.base_lr == want, mode
    assert TrainerConfig(model_name="m", lr=1e-3, weight_bridge_mode="lora_only").base_lr == 1e-3


def test_bad_lora_lr_names_the_flag() -> None:
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_argv(["--model-name", "m", "--lora-lr", "0"])
    assert info.value.problems == ["--lora-lr: Input should be greater than 0 (got '0')"]
    config = TrainerConfig(model_name="m", lora_lr=3e-2)
    assert TrainerConfig.from_argv(config.to_argv()) == config


def test_optimizer_steps_at_lora_lr_in_lora_mode(tmp_path: Path) -> None:
    """The lr metric of real optimizer steps: lora_lr with an adapter, lr without."""
    model = tiny_model(tmp_path / "model")
    data = write_groups(tmp_path / "g.jsonl", make_groups(model, count=2, group_size=2, seed=4))
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    seen: dict[str, list[float]] = {}
    for mode in ("none", "lora_only"):
        metrics = tmp_path / f"{mode}.jsonl"
        config = TrainerConfig(
            model_name=str(model),
            save_path=str(tmp_path / mode),
            batches_file=str(data),
            sync_every=0,
            batch_size=2,
            seq_len=64,
            lr=1e-3,
            lora_lr=2e-2,
            training_steps=2,
            weight_bridge_mode=mode,
            metrics_file=str(metrics),
        )
        assert run_session(config) == 0
        seen[mode] = [json.loads(line)["data"]["lr"] for line in metrics.open()]
        # an in-process run gives the process its signals back (CI's workers once ignored
        # the SIGTERM that ends them: a trainer's handler was left installed)
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
    assert seen == {"none": [1e-3, 1e-3], "lora_only": [2e-2, 2e-2]}
