"""Where a run continues from: the resume rule, torch-free (the checkpoint layout is
``grpo_trainer/weight_dirs/layout.py``).

Both the trainer (``--resume auto``) and the profile role layer (which model the inference
server must load after a restart or a mode switch) use ``resolve_resume``, so they always
agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_trainer.weight_dirs.layout import Checkpoint, list_checkpoints, read_checkpoint

RESUMED = "resumed"
"""``code`` of the event a trainer that continues from a checkpoint sends (``data``: the
``step`` and the ``checkpoint``)."""


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
