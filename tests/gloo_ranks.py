"""Join a CPU (gloo) process group from a worker that ``torch.multiprocessing.spawn`` started."""

from __future__ import annotations

import os

import torch

from grpo_trainer.ranks.group import Dist, init_distributed


def join(rank: int, port: int, world_size: int = 2) -> Dist:
    """Rank ``rank`` of ``world_size`` on 127.0.0.1:``port``, one thread per rank."""
    os.environ.update(
        {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)}
        | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    torch.set_num_threads(1)
    return init_distributed("cpu")
