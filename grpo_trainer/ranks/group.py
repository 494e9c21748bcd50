"""The trainer's process group under ``torchrun``: who this rank is and what ranks agree on.

``torchrun --nproc-per-node N -m grpo_trainer.train ...`` sets ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK``; with ``WORLD_SIZE`` > 1 the trainer joins a process group (NCCL on CUDA,
gloo on CPU) and trains on ``cuda:LOCAL_RANK``. Without it (or with ``WORLD_SIZE=1``) there
is no process group and every collective below returns the local value, so the training
loop has one code path for both.

What the ranks agree on, and why it is a collective here:

- the step's batch: rank 0 leases it from the rollout API and broadcasts it;
- the metrics: sums over ranks (tokens, loss shares) and maxima, gathered to rank 0;
- a stop: any rank's stop request (SIGTERM reaches each rank on its own) stops all of
  them at the same step boundary, so every rank finishes the step and checkpoints.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = timedelta(hours=1)
"""How long a rank waits in one collective. The other ranks wait in a broadcast while
rank 0 waits for the step's batch or for an inference restart (``none``,
``lora_restart``), which can take longer than torch's default (10 minutes for NCCL)."""


@dataclass(frozen=True)
class Dist:
    """This process' place in the trainer's process group (world size 1: no group)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def enabled(self) -> bool:
        """True when a process group exists (``WORLD_SIZE`` > 1)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: leases batches, reports, talks to the supervisor and inference."""
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; for batches, results, small state)."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self._object_device())
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order on rank 0 (other ranks get ``[]``)."""
        if not self.enabled:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out or []

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks."""
        return self._reduce(values, dist.ReduceOp.MAX)

    def any(self, flag: bool) -> bool:
        """True on every rank when it is True on any rank."""
        return bool(self.max([float(flag)])[0])

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.enabled:
            dist.barrier()

    def _reduce(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        if not self.enabled:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def _object_device(self) -> torch.device | None:
        return torch.device(self.device) if self.device.startswith("cuda") else None


def world_from_env() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's environment; (0, 1, 0) without."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local


def init_distributed(device: str) -> Dist:
    """Join torchrun's process group when ``WORLD_SIZE`` > 1; else a world of one.

    ``device`` is the configured one: ``cuda``/``cuda:N`` becomes ``cuda:LOCAL_RANK`` (the
    launcher sets ``CUDA_VISIBLE_DEVICES`` to the trainer's GPUs) with NCCL; ``cpu`` uses gloo.
    """
    rank, world, local = world_from_env()
    if world <= 1:
        return Dist(device=device)
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
        # gloo beside NCCL for collectives on CPU tensors (CPU-offloaded shards and grads)
        device, backend = f"cuda:{local}", "cpu:gloo,cuda:nccl"
    elif device == "cpu":
        backend = "gloo"
    else:
        raise ValueError(f"--device {device}: a multi-rank trainer runs on cuda or cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend, device_id=_device_id(device), timeout=COLLECTIVE_TIMEOUT
        )
    return Dist(rank=rank, world_size=world, local_rank=local, device=device)


def _device_id(device: str) -> torch.device | None:
    return torch.device(device) if device.startswith("cuda") else None


def shutdown_distributed(world: Dist) -> None:
    """Leave the process group (no-op in a world of one).

    Garbage is collected first: FSDP2's modules keep the group and its last work objects
    in reference cycles, which outlive the trainer's frame. Left to interpreter shutdown,
    gloo's destructor runs while Python is torn down and the rank aborts ("terminate called
    without an active exception", in about 1 of 3 two-rank CPU runs with torch 2.13), so a
    clean stop read as a failed one.
    """
    if world.enabled and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def rank_slice(total: int, world: Dist) -> slice:
    """This rank's contiguous share of ``total`` rows (``total`` divisible by world size)."""
    if total % world.world_size:
        raise ValueError(
            f"a step of {total} sequences does not split evenly over {world.world_size} "
            "ranks: make batch_size * gradient_accumulation_steps a multiple of the "
            "trainer's GPU count"
        )
    share = total // world.world_size
    return slice(world.rank * share, (world.rank + 1) * share)
