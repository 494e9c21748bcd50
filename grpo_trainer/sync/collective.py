"""Rank 0 acts, every rank learns the outcome: the one pattern of a multi-rank weight sync.

Rank 0 alone talks to inference (HTTP, NCCL to vLLM, the supervisor); the other ranks wait
in a broadcast of its outcome, so a failure (or the supervisor's refusal while stopping)
raises on every rank at the same point and the training loop's retries and stops happen
on every rank at the same step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from grpo_trainer.ranks.group import Dist
from grpo_trainer.sync.client import SyncError
from grpo_trainer.sync.restart import SupervisorStopping

T = TypeVar("T")


def on_main(world: Dist, action: Callable[[], T]) -> T:
    """Run ``action`` on rank 0 and give every rank its value, or raise its failure."""
    outcome: tuple[str, Any] = ("ok", None)
    error: BaseException | None = None
    if world.is_main:
        try:
            outcome = ("ok", action())
        except SupervisorStopping as exc:
            outcome, error = ("stopping", str(exc)), exc
        except Exception as exc:
            outcome, error = ("error", f"{type(exc).__name__}: {exc}"), exc
    status, value = world.broadcast(outcome)
    if error is not None:
        raise error
    if status == "stopping":
        raise SupervisorStopping(value)
    if status == "error":
        raise SyncError(f"rank 0's weight sync failed: {value}")
    return value
