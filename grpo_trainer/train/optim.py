"""Optimizer and learning-rate schedule: linear warm-up, then constant or cosine."""

from __future__ import annotations

import importlib.util
import math

import torch
from torch import nn


class OptimizerUnavailable(RuntimeError):
    """The chosen optimizer needs a package that is not installed."""


def build_optimizer(
    model: nn.Module, name: str, lr: float, weight_decay: float, impl: str = "auto"
) -> torch.optim.Optimizer:
    """``adamw`` (torch), ``adafactor`` (torch >= 2.5) or ``adamw_8bit`` (bitsandbytes).

    ``impl`` picks AdamW's kernel: ``fused`` (one kernel over every parameter, as TRL's
    default ``adamw_torch_fused``), ``foreach`` (torch's multi-tensor path, its CUDA
    default), or ``auto``: fused where the parameters are on CUDA, torch's default
    elsewhere. The kernels agree to float rounding (``benchmarks/trainer_step.py``).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    if name == "adamw":
        fused = impl == "fused" or (impl == "auto" and params[0].device.type == "cuda")
        kernel = {"fused": True} if fused else {"foreach": True} if impl == "foreach" else {}
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **kernel)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw_8bit":
        if importlib.util.find_spec("bitsandbytes") is None:
            raise OptimizerUnavailable(
                "optimizer adamw_8bit needs bitsandbytes: pip install bitsandbytes "
                "(or use --optimizer adamw)"
            )
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}: adamw, adafactor or adamw_8bit")


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str, floor: float
) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based).

    Linear warm-up from 1/(warmup+1) to 1 over ``warmup_steps``; then 1 (``constant``) or a
    half cosine from 1 down to ``floor`` at ``total_steps`` (``cosine``).
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
