"""One rank of a 2-rank gloo run that trains a small FSDP2 model, then leaves the group
with ``shutdown_distributed``: what the trainer does at its end, without the model
loading around it. ``test_trainer_distributed_exit.py`` runs it under torchrun."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from grpo_trainer.ranks.group import Dist, init_distributed, shutdown_distributed


def train(world: Dist) -> None:
    """A few sharded steps; the model goes out of scope on return, as the trainer's does."""
    mesh = init_device_mesh("cpu", (world.world_size,))
    model = nn.Sequential(*(nn.Linear(64, 64) for _ in range(4)))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        model(torch.randn(8, 64)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    world = init_distributed("cpu")
    train(world)
    shutdown_distributed(world)
    print(f"rank {world.rank} left", flush=True)
