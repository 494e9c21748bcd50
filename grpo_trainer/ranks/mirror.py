"""Full Hugging Face weights from FSDP2 shards, on rank 0: the trainer's CPU mirror.

A multi-rank trainer still writes what single-process runs write (``step_N/`` weights for
``grpo-tui view`` and a restarted inference server, LoRA adapters, ``served/`` syncs). The
existing writers take a plain model, so rank 0 keeps a CPU copy of the unsharded model
(in the run's dtype), and ``gather`` refreshes it from the shards: one collective
(``get_model_state_dict(full_state_dict=True, cpu_offload=True)``), parameter by
parameter into CPU memory, never a whole extra model on a GPU. Costs one model of CPU
memory on rank 0.
"""

from __future__ import annotations

import copy

from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from grpo_trainer.models import DTYPES
from grpo_trainer.ranks.group import Dist


class Consolidator:
    """Rank 0's plain CPU copy of the sharded model, refreshed on demand."""

    def __init__(self, unsharded: nn.Module, world: Dist, dtype: str) -> None:
        self.world = world
        self.mirror: nn.Module | None = None
        if world.is_main:
            self.mirror = copy.deepcopy(unsharded).to(device="cpu", dtype=DTYPES[dtype])
            self.mirror.requires_grad_(False)

    def gather(self, sharded: nn.Module) -> nn.Module | None:
        """The current weights as a plain model on rank 0; None on the other ranks.

        Collective: every rank must call it at the same point.
        """
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(sharded, options=options)
        if self.mirror is None:
            return None
        self.mirror.load_state_dict(state)
        return self.mirror
