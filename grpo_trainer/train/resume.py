"""Where a run continues from: the checkpoint layout and the resume rule, torch-free.

Both the trainer (``--resume auto``) and the profile role layer (which model the inference
server must load after a restart or a mode switch) use ``resolve_resume``, so they always
agree.

Layout under the checkpoint directory::

    step_N/           full weights (+ tokenizer); trainer state when trained in full mode,
                      or the merged weights that a LoRA run writes next to each adapter
    adapter_step_N/   a LoRA adapter (adapter_config.json records its base) + trainer state

Trainer state: ``optimizer.pt`` (one process) or ``dcp/`` (a multi-rank trainer: torch
Distributed Checkpoint, resumable on any number of ranks; see ``train/dcp.py``).

A checkpoint counts only once ``trainer_state.json`` exists in it: it is written last and
the directory is renamed into place, so a kill mid-save never leaves a broken "latest".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

STATE_FILE = "trainer_state.json"
"""Written last in every checkpoint: step, kind, base model, config."""

SHARDED_DIR = "dcp"
"""Sharded model + optimizer state (torch DCP) in a checkpoint written by several ranks."""

FULL_PREFIX = "step_"
ADAPTER_PREFIX = "adapter_step_"
_NAME = re.compile(r"^(adapter_step|step)_(\d+)$")

CheckpointKind = Literal["full", "merged", "adapter"]
"""``full``: weights + optimizer of a full-mode run; ``merged``: weights only, written by a
LoRA run as a base for a later switch to a full mode; ``adapter``: LoRA adapter + optimizer."""


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint directory."""

    path: Path
    step: int
    kind: CheckpointKind
    base: str | None
    """The base model an adapter was trained on (None for full weights)."""


@dataclass(frozen=True)
class ResumePoint:
    """What to load to continue a run in a given mode.

    ``model_path`` is the full model to load (and to serve); ``adapter_path`` the adapter on
    top of it (None: fresh adapter in LoRA mode / nothing in full mode). ``exact`` is True
    when the optimizer, scheduler and RNG state can be restored too, i.e. the checkpoint was
    written in the same kind of mode; otherwise training continues from these weights with
    fresh optimizer state. In full mode with an adapter, the trainer merges it at start.
    """

    model_path: str
    adapter_path: str | None
    step: int
    exact: bool
    checkpoint: Path


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint at ``path``, or None when it is not a complete one."""
    match = _NAME.match(path.name)
    state_file = path / STATE_FILE
    if match is None or not state_file.is_file():
        return None
    try:
        state = json.loads(state_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    is_adapter = match.group(1) == "adapter_step"
    kind: CheckpointKind = "adapter" if is_adapter else state.get("kind", "full")
    return Checkpoint(path=path, step=int(match.group(2)), kind=kind, base=state.get("base"))


def list_checkpoints(checkpoint_dir: str | Path) -> list[Checkpoint]:
    """All complete checkpoints, oldest step first (full before adapter at equal step)."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = [c for c in map(read_checkpoint, root.iterdir()) if c is not None]
    return sorted(found, key=lambda c: (c.step, c.kind == "adapter"))


def latest(checkpoints: list[Checkpoint], *, adapter: bool) -> Checkpoint | None:
    """The highest-step adapter (or full-weights) checkpoint."""
    chosen = [c for c in checkpoints if (c.kind == "adapter") == adapter]
    return chosen[-1] if chosen else None


def point_for(checkpoint: Checkpoint, lora_mode: bool) -> ResumePoint:
    """How to continue from one given checkpoint in LoRA or full mode."""
    if checkpoint.kind == "adapter":
        if checkpoint.base is None:
            raise ValueError(f"{checkpoint.path} does not record its base model")
        return ResumePoint(
            model_path=checkpoint.base,
            adapter_path=str(checkpoint.path),
            step=checkpoint.step,
            exact=lora_mode,
            checkpoint=checkpoint.path,
        )
    return ResumePoint(
        model_path=str(checkpoint.path),
        adapter_path=None,
        step=checkpoint.step,
        exact=not lora_mode and checkpoint.kind == "full",
        checkpoint=checkpoint.path,
    )


def resolve_resume(checkpoint_dir: str | Path, mode: str) -> ResumePoint | None:
    """Where a run in weight-sync ``mode`` continues from, or None for a fresh start.

    LoRA modes: the latest ``adapter_step_K`` if K >= the latest full ``step_N`` (its
    recorded base stays the base), else ``step_N`` as the base with a fresh adapter.
    Full modes: the latest ``step_N`` if N >= K, else the adapter's base with the adapter
    merged by the trainer at start (inference catches up at the first sync).
    """
    lora_mode = mode in ("lora_only", "lora_restart")
    checkpoints = list_checkpoints(checkpoint_dir)
    full = latest(checkpoints, adapter=False)
    adapter = latest(checkpoints, adapter=True)
    if full is None or adapter is None:
        only = full or adapter
        return None if only is None else point_for(only, lora_mode)
    if lora_mode:
        return point_for(adapter if adapter.step >= full.step else full, lora_mode)
    return point_for(full if full.step >= adapter.step else adapter, lora_mode)


def resume_from_path(path: str | Path, mode: str) -> ResumePoint:
    """``--resume PATH``: continue from that exact checkpoint directory."""
    checkpoint = read_checkpoint(Path(path))
    if checkpoint is None:
        raise ValueError(f"{path} is not a complete step_N/ or adapter_step_N/ checkpoint")
    return point_for(checkpoint, mode in ("lora_only", "lora_restart"))


def checkpoint_name(step: int, *, adapter: bool) -> str:
    """``step_N`` or ``adapter_step_N``."""
    return f"{ADAPTER_PREFIX if adapter else FULL_PREFIX}{step}"
