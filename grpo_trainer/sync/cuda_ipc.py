"""Trainer side of CUDA IPC with a server on the same GPU.

Zero-copy sharing (``shared_vllm``): the server (vLLM's worker extension, or the built-in
server on CUDA) answers ``/collective_rpc`` with handles of its parameters; the trainer
rebuilds them, maps its HF-named parameters onto them (``vllm_names.hf_views`` splits fused
tensors), copies its current weights in while generation is paused, and swaps its storage
for the views. The other way (``colocate`` on vLLM): ``tensor_handles`` packs handles of the
trainer's own tensors for the server to open and load (``serve.cuda_ipc.open_tensors``).
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import reduce_tensor

from grpo_trainer.serve.cuda_ipc import STORAGE_DEVICE_ARG
from grpo_trainer.sync.client import InferenceClient, SyncError
from grpo_trainer.sync.vllm_names import hf_views


def rpc(client: InferenceClient, method: str) -> Any:
    """Call one of our export methods on the server's single worker."""
    answer = client.post("/collective_rpc", json={"method": method}).json()
    results = answer.get("results", answer)
    if len(results) != 1:
        raise SyncError(f"zero-copy sharing needs one worker (TP=1), got {len(results)}")
    return results[0]


def tensor_handles(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Base64 pickled ``(name, CUDA IPC handle)`` pairs of ``named`` (contiguous tensors).

    The caller keeps the tensors alive, and their writes finished, until the receiver has
    read them.
    """
    pairs = []
    for name, tensor in named:
        if not tensor.is_cuda or not tensor.is_contiguous():
            raise SyncError(f"{name}: a CUDA IPC handle needs a contiguous CUDA tensor")
        pairs.append((name, reduce_tensor(tensor.detach())))
    return base64.b64encode(pickle.dumps(pairs)).decode()


def same_gpu(client: InferenceClient, model: nn.Module) -> bool:
    """True when the server's weights are on the GPU that holds ``model``."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return False
    return rpc(client, "grpo_device_uuid") == str(torch.cuda.get_device_properties(device).uuid)


def map_server_weights(client: InferenceClient, model: nn.Module) -> dict[str, torch.Tensor]:
    """HF name -> the server's live tensor (a view), checked against ``model``."""
    device = next(model.parameters()).device
    server_params = {}
    for entry in rpc(client, "grpo_export_weights"):
        rebuild, rebuild_args = pickle.loads(base64.b64decode(entry["handle"]))
        rebuild_args = list(rebuild_args)
        rebuild_args[STORAGE_DEVICE_ARG] = device.index or 0
        server_params[entry["name"]] = rebuild(*rebuild_args)
    views = hf_views(server_params, model.config)
    for name, param in model.named_parameters():
        view = views.get(name)
        if view is None:
            raise SyncError(f"the server holds no tensor for {name}")
        if view.shape != param.shape or view.dtype != param.dtype:
            raise SyncError(
                f"{name}: server has {tuple(view.shape)} {view.dtype}, the trainer "
                f"{tuple(param.shape)} {param.dtype} (load the trainer in the server's dtype)"
            )
    return views


def share_parameters(model: nn.Module, views: dict[str, torch.Tensor]) -> None:
    """Copy ``model``'s weights into the server's tensors and make them its storage.

    Call with generation paused.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            views[name].copy_(param.data)
            param.data = views[name]
    torch.cuda.synchronize(next(model.parameters()).device)
