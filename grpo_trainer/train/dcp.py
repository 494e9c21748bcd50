"""Checkpoints of a multi-rank trainer: torch Distributed Checkpoint (DCP) + HF weights.

A ``step_N/`` (or ``adapter_step_N/``) written by N ranks holds what a single-process one
holds (Hugging Face weights or the adapter, tokenizer, ``trainer_state.json`` written
last) plus ``dcp/``: the sharded model and optimizer state (``get_state_dict``, fully
qualified names, DCP's own format) and ``rng_rank{r}.pt`` per rank. DCP reshards on load,
so the checkpoint resumes on any number of ranks, one included (no process group).

Atomic like every checkpoint: all ranks write ``dcp/`` into a staging folder, rank 0 then
writes the weights into the usual temporary directory, moves the staging folder into it
and renames it into place (``checkpoint.save_checkpoint``): a kill at any point leaves
no half checkpoint.

A single-process checkpoint (``optimizer.pt``) resumed on N ranks continues from its
weights with fresh optimizer state (said in the log): torch's optimizer format there is
keyed by parameter position, not name, and cannot be resharded.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from transformers import PreTrainedTokenizerBase

from grpo_trainer.ranks.group import Dist
from grpo_trainer.ranks.mirror import Consolidator
from grpo_trainer.train.checkpoint import rng_state, save_checkpoint, set_rng_state
from grpo_trainer.weight_dirs.layout import SHARDED_DIR


def has_sharded_state(checkpoint: str | Path) -> bool:
    """True for a checkpoint written by a multi-rank trainer."""
    return (Path(checkpoint) / SHARDED_DIR).is_dir()


def _rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def save_sharded_checkpoint(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    checkpoint_dir: str | Path,
    step: int,
    optimizer: torch.optim.Optimizer,
    scheduler: dict[str, Any],
    config: dict[str, Any],
    base: str | None,
    world: Dist,
    consolidator: Consolidator,
) -> None:
    """Write the step's checkpoint from every rank (collective; see the module doc)."""
    root = Path(checkpoint_dir)
    staging = root / f".tmp-dcp-step_{step}"
    if world.is_main:
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
    world.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=staging)
    torch.save(rng_state(), staging / _rng_file(world.rank))
    world.barrier()
    mirror = consolidator.gather(model)
    if mirror is not None:
        save_checkpoint(
            mirror,
            tokenizer,
            checkpoint_dir=root,
            step=step,
            optimizer=None,
            scheduler=scheduler,
            config=config,
            base=base,
            sharded_state=staging,
        )
    world.barrier()


def load_sharded_state(
    checkpoint: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, world: Dist
) -> None:
    """Restore model, optimizer and this rank's RNG from ``checkpoint/dcp`` (any world size)."""
    folder = Path(checkpoint) / SHARDED_DIR
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=folder, no_dist=not world.enabled)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    rng = folder / _rng_file(world.rank)
    if rng.is_file():
        set_rng_state(torch.load(rng, weights_only=False))
