"""Where a run continues from, and what an inference server starting in it loads: the
rules, torch-free (the checkpoint layout is ``grpo_trainer/weight_dirs/layout.py``).

The trainer (``--resume``, and the base its adapter sits on) and the profile role layer
(which model and adapter an inference server loads at every start: the run's, a restart by
key or by crash, a mode switch) decide through the same two functions, ``resume_point``
and ``served_at_start``, so the server always starts on the weights under the trainer's
adapter (docs/inference.md, "What inference serves").
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


@dataclass(frozen=True)
class ServedWeights:
    """What an inference server loads when it starts in a run (``served_at_start``)."""

    model: str | None
    """The full weights (None: the profile's model)."""
    adapter: str | None
    """The newest adapter on ``model``, preloaded (LoRA modes); the trainer's attach loads
    its current one."""


LORA_MODES = ("lora_only", "lora_restart")


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
    lora_mode = mode in LORA_MODES
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
    return point_for(checkpoint, mode in LORA_MODES)


def resume_point(checkpoint_dir: str | Path, mode: str, resume: str | None) -> ResumePoint | None:
    """Where the trainer of a run in ``mode`` starts from (``--resume``): None starts fresh;
    ``auto`` the rule of ``resolve_resume``; a path that checkpoint, until this run saved its
    own: a restarted trainer then continues from those, not from the start point again."""
    if resume is None:
        return None
    own = resolve_resume(checkpoint_dir, mode)
    if resume == "auto" or own is not None:
        return own
    return resume_from_path(resume, mode)


def served_at_start(point: ResumePoint | None, mode: str) -> ServedWeights:
    """What an inference server starting in ``mode`` loads, the trainer being at ``point``
    (``resume_point``; its own run's newest checkpoint once it has one).

    LoRA modes: the full weights the trainer's adapter sits on (the base an adapter
    checkpoint recorded, the full checkpoint a fresh adapter goes on, the profile's model
    for a fresh run) and the newest adapter on them. The trainer's base is this same
    ``model`` (``train/policy.py``), so the server serves the adapter on the weights it was
    trained on. After an in-place switch into a LoRA mode the full weights at the switch
    are the newest checkpoint (``train/switch.py`` writes them first), so this finds them.
    Full modes: the newest full weights; the trainer's attach pushes its own over them.
    """
    if point is None:
        return ServedWeights(model=None, adapter=None)
    adapter = point.adapter_path if mode in LORA_MODES else None
    return ServedWeights(model=point.model_path, adapter=adapter)
