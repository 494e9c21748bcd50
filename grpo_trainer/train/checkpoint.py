"""Writing and reading the trainer's checkpoints: atomic, complete, prunable.

Their layout is ``grpo_trainer/weight_dirs/layout.py``; every directory is written the way
``grpo_trainer/weight_dirs/full_weights.py`` writes one (renamed into place once
``trainer_state.json``, the completion mark, is in it).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from grpo_trainer.weight_dirs.full_weights import is_peft, write_atomically, write_full
from grpo_trainer.weight_dirs.layout import (
    SHARDED_DIR,
    STATE_FILE,
    CheckpointKind,
    checkpoint_name,
    list_checkpoints,
)

OPTIMIZER_FILE = "optimizer.pt"
"""Optimizer, scheduler and RNG states (torch.save)."""


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
            write_full(model, tokenizer, tmp)
        if sharded_state is not None:
            sharded_state.rename(tmp / SHARDED_DIR)
        elif optimizer is not None:
            state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler}
            torch.save({**state, "rng": rng_state()}, tmp / OPTIMIZER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(meta, indent=1))

    written = [write_atomically(root / checkpoint_name(step, adapter=lora), write_main)]
    if lora:
        merged_meta = {"step": step, "kind": "merged", "base": None, "config": config}

        def write_merged(tmp: Path) -> None:
            write_full(model, tokenizer, tmp)
            (tmp / STATE_FILE).write_text(json.dumps(merged_meta, indent=1))

        written.append(write_atomically(root / checkpoint_name(step, adapter=False), write_merged))
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
