"""Weights written for the inference server to load: ``CHECKPOINT_DIR/served/``.

Kept apart from the trainer's resumable checkpoints (``step_N/``, ``adapter_step_N/``,
which carry optimizer state): a sync writes weights only, often, and only the newest
one or two are kept.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torch import nn
from transformers import PreTrainedTokenizerBase

from grpo_trainer.weight_dirs.full_weights import save_weights

SERVED = "served"


def served_dir(checkpoint_dir: Path) -> Path:
    """Where synced weights live under the run's checkpoint directory."""
    return checkpoint_dir / SERVED


def save_full(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase | None, checkpoint_dir: Path, step: int
) -> Path:
    """Full weights (LoRA merged) + tokenizer at ``served/step_N``, written atomically."""
    return save_weights(model, tokenizer, served_dir(checkpoint_dir) / f"step_{step}")


def save_adapter(model: nn.Module, checkpoint_dir: Path, name: str) -> Path:
    """The peft adapter of ``model`` at ``served/NAME``, written atomically.

    Weights and ``adapter_config.json`` only: peft's ``save_pretrained`` also writes a
    model card (``README.md``) from a jinja template it compiles on every call, about 75%
    of a save of the quickstart's adapter (8 of 11 ms, at every ``lora_only`` sync), and
    no server reads it. The instance's card writer is shadowed for this one call.
    """
    target = served_dir(checkpoint_dir) / name
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    model.create_or_update_model_card = _no_model_card
    try:
        model.save_pretrained(tmp)
    finally:
        del model.create_or_update_model_card
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def _no_model_card(output_dir: str) -> None:
    """Stands in for peft's ``PeftModel.create_or_update_model_card`` (see ``save_adapter``)."""


def prune_served(checkpoint_dir: Path, keep: Path, history: int = 2) -> None:
    """Remove synced artifacts but ``keep`` (served now) and the ``history`` newest others.

    vLLM may reread an adapter's files after the swap (requests still in flight, an
    adapter evicted from its GPU slot): deleting the previous one at once kills its engine.
    Links stay (SGLang's ``adapter_current``, in run directories from before the two
    adapter slots).
    """
    root = served_dir(checkpoint_dir)
    others = sorted(
        (
            path
            for path in root.iterdir()
            if path.is_dir()
            and not path.is_symlink()
            and path.resolve() != keep.resolve()
            and not path.name.startswith(".")
        ),
        key=lambda path: path.stat().st_mtime,
        reverse=True,
    )
    for path in others[history:]:
        shutil.rmtree(path)
