"""Sharding the policy over the trainer's ranks with FSDP2 (``fully_shard``).

Each decoder layer (the classes a Hugging Face model lists in ``_no_split_modules``) is
one FSDP unit, then the root takes the rest (embeddings, final norm, head; tied weights
stay together there). Parameters are stored sharded in float32; with ``--dtype bfloat16``
(or float16) ``MixedPrecisionPolicy`` computes in that dtype and reduces gradients in
float32. ``--cpu-offload`` keeps the shards, gradients and optimizer state in CPU memory
(``CPUOffloadPolicy``). ``--gradient-checkpointing`` recomputes each layer's activations in
the backward (non-reentrant, the kind that composes with FSDP2).

FSDP2 averages gradients over ranks. Each rank's loss is already its share of the whole
step's loss (the denominators count the whole step, see ``loss.aggregate``), so the loop
scales the backward by the world size (``GRADIENT_SCALE``): the average of the scaled
shares is exactly the single-process gradient (a power-of-two scale is exact in floating
point; a custom divide factor would need NCCL's PreMulSum, which gloo lacks).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from grpo_trainer.models import DTYPES
from grpo_trainer.ranks.group import Dist


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a (possibly peft-wrapped) Hugging Face model."""
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(base).__name__} names no decoder-layer class in _no_split_modules: "
            "cannot shard it per layer"
        )
    return layers


def shard_model(
    model: nn.Module,
    world: Dist,
    *,
    dtype: str,
    cpu_offload: bool = False,
    activation_checkpointing: bool = False,
) -> nn.Module:
    """Shard ``model`` (float32, on CPU) in place over ``world``; returns it.

    ``fully_shard`` moves each rank's shard to its device (or keeps it in CPU memory with
    ``cpu_offload``), so no rank ever holds the whole model on its GPU.
    """
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        if hasattr(model, "peft_config"):
            model.enable_input_require_grads()
    device_type = "cuda" if world.device.startswith("cuda") else "cpu"
    mesh = init_device_mesh(device_type, (world.world_size,))
    compute = DTYPES[dtype]
    precision = (
        MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        if compute != torch.float32
        else MixedPrecisionPolicy()
    )
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=precision, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=precision, offload_policy=offload)
    return model
