"""A served model's parameters under their checkpoint names, and full weights reloaded in place.

A server with LoRA slots wraps each adapted layer: the layer's own weight moves one level
down (``q_proj.weight`` becomes ``q_proj.base_layer.weight``, in peft as in vLLM) and the
adapter's tensors sit beside it (``lora_A``, ``lora_B`` in peft). Everything that names the
base weights (zero-copy export, layouts, a reload from disk) uses the names a checkpoint
has, so a server with LoRA slots and one without look the same to the trainer
(vllm-project/vllm#39934: vLLM's own loaders fail on the wrapped names).

``reload_from_disk`` is mode ``none``'s in-place load on the built-in server (the route
shape of vLLM's ``/collective_rpc reload_weights``): every parameter is copied in place, so
shared-memory views (a trainer's, CUDA graphs') stay valid. Callers stop generation first.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

WRAPPED = ".base_layer."
ADAPTER_PART = ".lora_"


def served_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(checkpoint name, parameter)`` of the base weights, adapters' tensors left out."""
    return [
        (name.replace(WRAPPED, "."), param)
        for name, param in model.named_parameters()
        if ADAPTER_PART not in name
    ]


def checkpoint_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files in ``directory`` (a ``save_pretrained``
    folder), by name; ``FileNotFoundError`` when there are none."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {directory}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensors[key] = handle.get_tensor(key)
    return tensors


def reload_from_disk(model: nn.Module, directory: Path) -> int:
    """Copy the full weights in ``directory`` into ``model``'s parameters, in place.

    Every base parameter must be there with its shape (``ValueError`` naming the first
    missing or mismatched ones, before anything is copied); tensors the model does not have
    are refused too. Returns how many parameters were loaded.
    """
    tensors = checkpoint_tensors(directory)
    params = dict(served_parameters(model))
    missing = sorted(set(params) - set(tensors))
    extra = sorted(set(tensors) - set(params))
    wrong = sorted(n for n in set(params) & set(tensors) if tensors[n].shape != params[n].shape)
    if missing or extra or wrong:
        parts = [
            f"{label}: {', '.join(names[:3])}"
            for label, names in (("missing", missing), ("unknown", extra), ("other shape", wrong))
            if names
        ]
        raise ValueError(f"{directory} does not fit the served model ({'; '.join(parts)})")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(tensors[name])
    return len(params)
