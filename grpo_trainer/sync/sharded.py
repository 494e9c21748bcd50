"""Weight sync for a multi-rank (FSDP2) trainer: every rank calls it, rank 0 talks to inference.

The mode's own strategy lives on rank 0 only (it holds the HTTP client, the supervisor
link, the NCCL group to vLLM). Each call here is collective, so that the ranks gather
the sharded weights together and agree on the outcome:

- ``shared_vllm`` (vLLM on other GPUs): rank 0 pauses generation and opens a weight
  update; then every rank gathers one parameter at a time (``DTensor.full_tensor``) and
  rank 0 broadcasts it to vLLM over NCCL before the next is gathered: never a whole
  extra model on a GPU.
- ``none`` / ``lora_only`` / ``lora_restart``: the ranks gather the full state dict into
  rank 0's CPU mirror (``ranks/mirror.py``), which the mode's strategy saves and
  serves as in a single-process run (checkpoint + restart, adapter hot-swap/restart).

Rank 0's outcome (result, failure, or the supervisor's refusal while stopping) is
broadcast, so the loop's retries and stops happen on every rank at the same step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from grpo_trainer.ranks.group import Dist
from grpo_trainer.ranks.mirror import Consolidator
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.client import SyncError
from grpo_trainer.sync.collective import on_main
from grpo_trainer.sync.vllm_shared import VllmSharedSync

T = TypeVar("T")


def full_parameters(
    model: nn.Module, dtype: torch.dtype, device: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, whole tensor)`` per parameter in ``dtype`` on ``device``, gathered one at a
    time (collective: every rank iterates it to the end, in the same order)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            whole = param.full_tensor() if isinstance(param, DTensor) else param
            yield name, whole.to(device=device, dtype=dtype)


class ShardedSync(WeightSync):
    """Runs ``inner`` (rank 0's strategy for the mode) from FSDP2 shards on every rank."""

    def __init__(
        self,
        context: SyncContext,
        *,
        mode: str,
        inner: WeightSync | None,
        world: Dist,
        consolidator: Consolidator,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(context)
        if world.is_main and inner is None:
            raise ValueError("rank 0 needs the mode's strategy")
        if mode == "colocate":
            raise ValueError("colocate on several ranks is colocate_ranks.ColocateRanksSync")
        if mode == "shared_vllm" and context.backend != "vllm":
            raise SyncError(
                "shared_vllm with a multi-GPU trainer needs the vLLM backend (the built-in "
                "server shares one process' weights)"
            )
        self.mode = mode
        self.inner = inner
        self.world = world
        self.consolidator = consolidator
        self.dtype = dtype

    @property
    def _transfer(self) -> VllmSharedSync:
        if not isinstance(self.inner, VllmSharedSync):
            raise SyncError(f"{type(self.inner).__name__} cannot send weights over NCCL")
        return self.inner

    def attach(self, model: nn.Module) -> nn.Module:
        """Open the NCCL group and send the starting weights, or attach the mirror."""
        if self.mode == "shared_vllm":
            self._on_main(lambda: self._transfer.open_transfer(model))
            self.sync(model, 0)
        else:
            mirror = self.consolidator.gather(model)
            self._on_main(lambda: self._inner_attach(mirror))
        self.served_model = self.inner.served_model if self.inner is not None else None
        return model

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Push the current weights; the same result (or error) on every rank."""
        if self.mode != "shared_vllm":
            mirror = self.consolidator.gather(model)
            result = self._on_main(lambda: self._inner_sync(mirror, step))
            self.served_model = self.inner.served_model if self.inner is not None else None
            return result
        start = time.perf_counter()
        dtype = str(self.dtype).removeprefix("torch.")
        params = [(name, list(p.shape), dtype) for name, p in model.named_parameters()]
        phases: dict[str, float] = {}
        try:
            self._on_main(lambda: self._transfer.begin_transfer(params))
            tensors = full_parameters(model, self.dtype, self.world.device)
            if self.world.is_main:
                self._transfer.send(tensors)
            else:
                for _ in tensors:
                    pass
        finally:
            phases = self._on_main(lambda: self._transfer.end_transfer())
        return SyncResult(sync_time=time.perf_counter() - start, policy_version=step, phases=phases)

    def _inner_attach(self, mirror: nn.Module | None) -> None:
        if self.inner is None or mirror is None:
            raise SyncError("only rank 0 attaches the mirror")
        self.inner.attach(mirror)

    def _inner_sync(self, mirror: nn.Module | None, step: int) -> SyncResult:
        if self.inner is None or mirror is None:
            raise SyncError("only rank 0 syncs from the mirror")
        return self.inner.sync(mirror, step)

    def _on_main(self, action: Callable[[], T]) -> T:
        return on_main(self.world, action)

    def close(self) -> None:
        """Close rank 0's strategy."""
        if self.inner is not None:
            self.inner.close()
