"""What a checkpoint directory holds, torch-free (the trainer, its syncs and the plan read it).

Layout under the checkpoint directory::

    step_N/           full weights (+ tokenizer); trainer state when trained in full mode,
                      or the merged weights that a LoRA run writes next to each adapter
    adapter_step_N/   a LoRA adapter (adapter_config.json records its base) + trainer state

Trainer state: ``optimizer.pt`` (one process) or ``dcp/`` (a multi-rank trainer: torch
Distributed Checkpoint, resumable on any number of ranks; see ``train/dcp.py``).

A checkpoint counts only once ``trainer_state.json`` exists in it: it is written last and
the directory is renamed into place, so a kill mid-save never leaves a broken "latest".
Which checkpoint a run continues from is ``train/resume.py``'s rule.
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


def checkpoint_name(step: int, *, adapter: bool) -> str:
    """``step_N`` or ``adapter_step_N``."""
    return f"{ADAPTER_PREFIX if adapter else FULL_PREFIX}{step}"
