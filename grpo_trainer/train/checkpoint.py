"""Writing and reading checkpoints: atomic, complete, prunable (layout in ``resume.py``).

Every directory is written under a temporary name in the same folder and renamed into place
once ``trainer_state.json`` (the completion mark) is in it, so a kill mid-save leaves at
worst a ``.tmp-*`` folder that nothing reads.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from grpo_trainer.train.resume import (
    SHARDED_DIR,
    STATE_FILE,
    CheckpointKind,
    checkpoint_name,
    list_checkpoints,
)

OPTIMIZER_FILE = "optimizer.pt"
"""Optimizer, scheduler and RNG states (torch.save)."""


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


def _write_atomically(target: Path, write: Any) -> Path:
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


def _save_full(
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
        _save_full(model, tokenizer, tmp)
        (tmp / STATE_FILE).write_text(json.dumps({"kind": "merged", "base": None}))

    return _write_atomically(target, write)


def rng_state() -> dict[str, Any]:
    """Every RNG the step touches, to continue a run bit for bit."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        # One state per GPU the writer saw. A rank of a multi-GPU trainer sees every GPU,
        # a 1-rank resume of its checkpoint only its own: restore the GPUs present.
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)


def save_checkpoint(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    checkpoint_dir: str | Path,
    step: int,
    optimizer: torch.optim.Optimizer | None,
    scheduler: dict[str, Any],
    config: dict[str, Any],
    base: str | None,
    sharded_state: Path | None = None,
) -> list[Path]:
    """Write the step's checkpoint(s); returns the directories written.

    Full mode: ``step_N/`` with weights and trainer state. LoRA mode: ``adapter_step_N/``
    with the adapter and trainer state, then ``step_N/`` merged weights (kind ``merged``)
    so that a switch to a full mode has a base (adapter first: a kill between the two
    still resumes the LoRA run exactly).

    The resumable state is ``optimizer.pt`` (``optimizer``: one process), or the staged
    ``sharded_state`` folder that a multi-rank trainer wrote (``dcp.py``), moved in.
    """
    root = Path(checkpoint_dir)
    lora = is_peft(model)
    kind: CheckpointKind = "adapter" if lora else "full"
    meta = {"step": step, "kind": kind, "base": base if lora else None, "config": config}

    def write_main(tmp: Path) -> None:
        if lora:
            model.save_pretrained(tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
        else:
            _save_full(model, tokenizer, tmp)
        if sharded_state is not None:
            sharded_state.rename(tmp / SHARDED_DIR)
        elif optimizer is not None:
            state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler}
            torch.save({**state, "rng": rng_state()}, tmp / OPTIMIZER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(meta, indent=1))

    written = [_write_atomically(root / checkpoint_name(step, adapter=lora), write_main)]
    if lora:
        merged_meta = {"step": step, "kind": "merged", "base": None, "config": config}

        def write_merged(tmp: Path) -> None:
            _save_full(model, tokenizer, tmp)
            (tmp / STATE_FILE).write_text(json.dumps(merged_meta, indent=1))

        written.append(_write_atomically(root / checkpoint_name(step, adapter=False), write_merged))
    return written


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """Optimizer, scheduler and RNG states saved with a checkpoint."""
    return torch.load(Path(checkpoint) / OPTIMIZER_FILE, weights_only=False)


def prune_checkpoints(checkpoint_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest steps; never a full checkpoint that a kept adapter
    uses as its base. Returns what was removed."""
    checkpoints = list_checkpoints(checkpoint_dir)
    steps = sorted({c.step for c in checkpoints})
    kept_steps = set(steps[-keep:])
    protected = {
        Path(c.base).resolve()
        for c in checkpoints
        if c.kind == "adapter" and c.step in kept_steps and c.base
    }
    removed = []
    for c in checkpoints:
        if c.step not in kept_steps and c.path.resolve() not in protected:
            shutil.rmtree(c.path)
            removed.append(c.path)
    return removed
