"""CUDA IPC between a server and a trainer on the same GPU, server side.

``export_weights``: handles of the model's parameters, for zero-copy sharing with the
trainer (``shared_vllm``). Used by the vLLM worker extension (``grpo_trainer.sync.vllm_worker``)
and by the built-in server on CUDA (``/collective_rpc``), so one trainer-side path
(``sync/cuda_ipc.py``) serves both. ``open_tensors``: the other way, the trainer's tensors
opened in the server (``colocate`` on vLLM loads them into its weights). Each handle is
``torch.multiprocessing.reductions.reduce_tensor`` output, pickled and base64-encoded to
travel in JSON; the exporting process keeps the tensors alive.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import reduce_tensor

from grpo_trainer.serve.weights import served_parameters

RPC_METHODS = ("grpo_device_uuid", "grpo_export_weights")
STORAGE_DEVICE_ARG = 6
"""Position of the device index in ``rebuild_cuda_tensor``'s arguments."""


def device_uuid(model: nn.Module) -> str:
    """UUID of the GPU holding ``model``'s parameters."""
    device = next(model.parameters()).device
    return str(torch.cuda.get_device_properties(device).uuid)


def export_weights(model: nn.Module) -> list[dict[str, Any]]:
    """Checkpoint name, shape, dtype and a base64 pickled CUDA IPC handle of every base
    parameter (``served_parameters``: the same with LoRA slots or without)."""
    exported = []
    for name, param in served_parameters(model):
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


def open_tensors(payload: str, device_index: int) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of ``sync.cuda_ipc.tensor_handles`` output, mapped here.

    The tensors are the sender's memory, opened on this process's ``device_index`` (the
    same physical GPU under another index when the two see different device lists).
    """
    opened = []
    for name, (rebuild, rebuild_args) in pickle.loads(base64.b64decode(payload)):
        rebuild_args = list(rebuild_args)
        rebuild_args[STORAGE_DEVICE_ARG] = device_index
        opened.append((name, rebuild(*rebuild_args)))
    return opened
