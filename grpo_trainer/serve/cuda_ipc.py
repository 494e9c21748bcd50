"""CUDA IPC export of a model's parameters, for zero-copy sharing with a trainer on the GPU.

Used by the vLLM worker extension (``grpo_trainer.sync.vllm_worker``) and by the built-in
server on CUDA (``/collective_rpc``), so one trainer-side path (``sync/cuda_ipc.py``) serves
both. Each handle is ``torch.multiprocessing.reductions.reduce_tensor`` output, pickled and
base64-encoded to travel in JSON; the exporting process keeps the tensors alive.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import reduce_tensor

RPC_METHODS = ("grpo_device_uuid", "grpo_export_weights")


def device_uuid(model: nn.Module) -> str:
    """UUID of the GPU holding ``model``'s parameters."""
    device = next(model.parameters()).device
    return str(torch.cuda.get_device_properties(device).uuid)


def export_weights(model: nn.Module) -> list[dict[str, Any]]:
    """Name, shape, dtype and a base64 pickled CUDA IPC handle of every parameter."""
    exported = []
    for name, param in model.named_parameters():
        handle = reduce_tensor(param.data)
        exported.append(
            {
                "name": name,
                "shape": list(param.shape),
                "dtype": str(param.dtype).removeprefix("torch."),
                "handle": base64.b64encode(pickle.dumps(handle)).decode(),
            }
        )
    return exported
