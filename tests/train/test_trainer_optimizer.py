"""AdamW's kernels (``optimizer_impl``): fused and foreach train a real model alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import tiny_model

from grpo_trainer.models import load_model
from grpo_trainer.train.config import ConfigError, TrainerConfig
from grpo_trainer.train.optim import build_optimizer


def test_fused_and_foreach_adamw_agree_to_rounding_over_real_steps(tmp_path: Path) -> None:
    """torch's fused AdamW (CPU since torch 2.4; the GPU check is benchmarks/trainer_step.py
    --optimizers) against foreach on the same gradients of a tiny model, 5 steps."""
    path = tiny_model(tmp_path / "model")
    models = [load_model(path, dtype="float32") for _ in range(2)]
    optimizers = [
        build_optimizer(model, "adamw", 1e-3, 0.01, impl)
        for model, impl in zip(models, ("fused", "foreach"), strict=True)
    ]
    assert optimizers[0].defaults["fused"] and optimizers[1].defaults["foreach"]
    ids = torch.randint(5, 44, (2, 9), generator=torch.Generator().manual_seed(0))
    for _ in range(5):
        for model, optimizer in zip(models, optimizers, strict=True):
            optimizer.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
    start = load_model(path, dtype="float32")
    for a, b, s in zip(*(m.parameters() for m in (*models, start)), strict=True):
        moved = float((a - s).abs().max())
        assert moved > 1e-3  # 5 steps of lr 1e-3 moved every tensor
        # Adam divides by sqrt(v): where a gradient is rounding noise (k_proj's bias, which
        # softmax ignores) the kernels' last-bit differences grow to ~3e-4 of the move.
        assert float((a - b).abs().max()) <= 1e-3 * moved


def test_auto_is_torchs_default_off_cuda(tmp_path: Path) -> None:
    model = load_model(tiny_model(tmp_path / "model"), dtype="float32")
    defaults = build_optimizer(model, "adamw", 1e-3, 0.0, "auto").defaults
    assert not defaults["fused"] and not defaults["foreach"]


def test_a_kernel_choice_is_for_adamw_only() -> None:
    with pytest.raises(ConfigError, match="optimizer_impl 'fused' applies to adamw only"):
        TrainerConfig.from_argv(
            ["--model-name", "m", "--optimizer", "adafactor", "--optimizer-impl", "fused"]
        )
    config = TrainerConfig.from_argv(["--model-name", "m", "--optimizer-impl", "foreach"])
    assert config.to_argv()[-2:] == ["--optimizer-impl", "foreach"]


def test_delta_transfer_is_for_shared_vllm_on_vllm_only() -> None:
    base = ["--model-name", "m", "--weight-transfer-delta"]
    with pytest.raises(ConfigError, match="weight_transfer_delta applies to shared_vllm on vLLM"):
        TrainerConfig.from_argv([*base, "--weight-bridge-mode", "none"])
    config = TrainerConfig.from_argv(
        [*base, "--weight-bridge-mode", "shared_vllm", "--inference-backend", "vllm"]
    )
    assert config.weight_transfer_delta and "--weight-transfer-delta" in config.to_argv()
