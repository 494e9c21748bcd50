"""The one interface every weight-sync strategy implements.

The training loop calls, per optimizer step::

    strategy.before_train_step()       # e.g. put inference to sleep (colocate)
    forward / backward
    strategy.before_optimizer_step()   # e.g. pause generation (shared weights)
    optimizer.step()
    strategy.after_optimizer_step()    # e.g. resume generation
    if step % sync_every == 0:
        result = strategy.sync(model, step)

``attach`` runs once after the model is loaded and before the first step (shared mode
swaps parameters for shared views; LoRA modes load the initial adapter).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from torch import nn

MODES = ("none", "shared_vllm", "lora_only", "lora_restart", "colocate")


@dataclass(frozen=True)
class SyncContext:
    """What a strategy needs to know about the run it serves."""

    inference_url: str
    served_model_name: str
    checkpoint_dir: Path
    backend: str  # "builtin" | "vllm" | "sglang"
    delta: bool = False
    """shared_vllm over NCCL: send only the changed elements (``sync/delta.py``)."""
    none_reload: str = "in_place"
    """Mode ``none``: ``in_place`` (the running server loads each sync) or ``restart``."""


@dataclass(frozen=True)
class SyncResult:
    """Outcome of one sync: how long it took and which policy version inference now serves."""

    sync_time: float
    policy_version: int
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per phase of the sync where a strategy measures them (reported as
    ``sync/<phase>_time``)."""
    incarnation: int | None = None
    """The inference incarnation a sync that restarted inference started (the supervisor's
    word; None when the sync did not restart it)."""


class WeightSync(ABC):
    """Pushes the trainer's current policy to the inference server."""

    mode: ClassVar[str]
    sleeps: ClassVar[bool] = False
    """True when inference sleeps through the training step (``colocate``)."""
    attaches_at_server: ClassVar[bool] = True
    """True when ``attach`` talks to the inference server (the trainer waits for it first:
    the two may start side by side); False where a sync alone reaches it."""
    attach_serves: ClassVar[bool] = False
    """True when ``attach`` leaves the server serving the model it was given (a LoRA
    strategy loads the trainer's adapter): after an inference restart no sync follows it
    (``lora_restart``'s sync would restart inference once more)."""

    @property
    def shares_weights(self) -> bool:
        """True when the trainer's parameters are views of the server's memory."""
        return False

    def __init__(self, context: SyncContext) -> None:
        self.context = context
        self.served_model: str | None = None
        """The ``model`` environments ask inference for the trainer's weights, once known
        (set by ``attach`` and by syncs that change it); reported with the served version."""

    def attach(self, model: nn.Module) -> nn.Module:
        """Prepare ``model`` for this mode before training starts, or again after inference
        restarted (a new server to share weights with, open a transfer group to, load the
        adapter into); returns the model to train."""
        return model

    def before_train_step(self) -> None:
        """Called before the step's first forward pass."""

    def before_optimizer_step(self) -> None:
        """Called right before ``optimizer.step()``."""

    def after_optimizer_step(self) -> None:
        """Called right after ``optimizer.step()``."""

    @abstractmethod
    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Make the inference server serve ``model`` as of ``step``; raise on failure."""

    def close(self) -> None:
        """Release resources (sockets, shared memory handles)."""
