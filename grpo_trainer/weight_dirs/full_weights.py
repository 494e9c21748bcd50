"""Loadable full weights in a folder: LoRA merged in, written atomically, marked complete.

What both the trainer's checkpoints (``train/checkpoint.py``) and the weights a sync hands
to the inference server (``sync/artifacts.py``) are made of. Every folder is written under
a temporary name beside its target and renamed into place once complete, so a kill
mid-save leaves at worst a ``.tmp-*`` folder that nothing reads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from grpo_trainer.weight_dirs.layout import STATE_FILE


def is_peft(model: nn.Module) -> bool:
    """True for a peft-wrapped model (LoRA)."""
    return hasattr(model, "peft_config")


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full weights with the LoRA deltas added, without touching the live model.

    Merging in place and unmerging would perturb the base weights in low precision (and so
    break exact resume); this computes ``W + delta`` into new tensors instead.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight.detach().clone()
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    weight += module.get_delta_weight(adapter).detach().to(weight.dtype)
            merged[f"{name}.weight"] = weight
    state = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        clean = key.replace(".base_layer.", ".")
        state[clean] = merged.get(clean, value)
    return state


def write_atomically(target: Path, write: Any) -> Path:
    """Run ``write(tmp_dir)``, then rename ``tmp_dir`` to ``target`` (replacing it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write(tmp)
    old = target.parent / f".old-{target.name}-{os.getpid()}"
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    if old.exists():
        shutil.rmtree(old)
    return target


def write_full(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase | None, directory: Path
) -> None:
    if is_peft(model):
        base = model.get_base_model()
        base.save_pretrained(directory, state_dict=merged_state_dict(model))
    else:
        model.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def save_weights(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase | None, directory: str | Path
) -> Path:
    """Write loadable full weights (LoRA merged) + tokenizer to ``directory``, atomically.

    What the ``none`` weight-sync strategy hands to a restarted inference server.
    """
    target = Path(directory)

    def write(tmp: Path) -> None:
        write_full(model, tokenizer, tmp)
        (tmp / STATE_FILE).write_text(json.dumps({"kind": "merged", "base": None}))

    return write_atomically(target, write)
