"""The vLLM worker extension (``--worker-extension-cls``) for ``shared_vllm`` and ``colocate``.

vLLM mixes this class into each GPU worker; ``POST /collective_rpc {"method": ...}`` calls
its methods there, where ``self.model_runner.model`` is the live model. It exports CUDA
IPC handles of the parameters so that the trainer, on the same GPU, can map them and update
them in place; for a trainer on other GPUs it lists the parameters' layout (to send them in
vLLM's own, kernel, format), reads one parameter back, and runs vLLM's own NCCL receive
under ``no_grad``. For ``colocate`` it opens the trainer's tensors by CUDA IPC and loads
them with the model's own ``load_weights`` (HF names, fused by vLLM), in place, so the
weights stay in the sleep-mode memory pool. For mode ``none`` it runs vLLM's own
``reload_weights`` from a checkpoint folder.

With LoRA slots (the server a run can switch to ``lora_only`` in place), vLLM wraps each
adapted layer and its weight moves to ``<layer>.base_layer.weight``; vLLM 0.24's model
loaders then fail (``KeyError``, vllm-project/vllm#39934). So every method here names
parameters as a checkpoint does (``serve/weights.served_parameters``), and each load runs
with the wrapped layers' base layers put back in their place (``lora_unwrapped``): the same
parameter tensors, so the adapters' wrappers and CUDA graphs see the new values. These
calls run in the engine's loop between steps: no forward pass sees the tree swapped. No
vLLM import, no patching of vLLM's files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from grpo_trainer.serve.buckets import check_parameter, open_bucket, payload_for
from grpo_trainer.serve.cuda_ipc import device_uuid, export_weights, open_tensors
from grpo_trainer.serve.weights import served_parameters
from grpo_trainer.sync.delta import Entry, receive


@contextmanager
def lora_unwrapped(model: nn.Module) -> Iterator[None]:
    """Put each LoRA-wrapped layer's base layer in its place for the duration (nothing to do
    on a server without LoRA slots), then the wrappers back."""
    wrapped = [
        (name, module)
        for name, module in model.named_modules()
        if hasattr(module, "base_layer") and hasattr(module, "set_lora")
    ]
    swapped = []
    try:
        for name, wrapper in wrapped:
            parent_name, _, attribute = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, attribute, wrapper.base_layer)
            swapped.append((parent, attribute, wrapper))
        yield
    finally:
        for parent, attribute, wrapper in swapped:
            setattr(parent, attribute, wrapper)


def parameter(model: nn.Module, name: str) -> torch.Tensor:
    """The base parameter a checkpoint calls ``name``."""
    found = dict(served_parameters(model)).get(name)
    if found is None:
        raise KeyError(f"the served model has no parameter {name!r}")
    return found


class SharedWeightsExtension:
    """RPC methods run inside vLLM's worker (``self`` is the worker)."""

    model_runner: Any

    def grpo_device_uuid(self) -> str:
        """UUID of the GPU holding the weights (the trainer must be on the same one)."""
        return device_uuid(self.model_runner.model)

    def grpo_export_weights(self) -> list[dict[str, Any]]:
        """CUDA IPC handles of every parameter (see ``grpo_trainer.serve.cuda_ipc``)."""
        return export_weights(self.model_runner.model)

    def grpo_weight_layout(self) -> list[list[Any]]:
        """``[name, shape, dtype]`` of every base parameter, in the worker's order."""
        return [
            [name, list(param.shape), str(param.dtype).removeprefix("torch.")]
            for name, param in served_parameters(self.model_runner.model)
        ]

    def grpo_parameter_values(self, name: str) -> list[Any]:
        """One parameter's values (a small one: the trainer probes the direct copy with it)."""
        return parameter(self.model_runner.model, name).detach().float().cpu().tolist()

    def grpo_reload_weights(self, weights_path: str) -> None:
        """Mode ``none`` in place: vLLM's own ``reload_weights`` from the checkpoint folder
        ``weights_path`` (layer by layer, copied into the existing parameters), with the
        LoRA wrappers set aside. The trainer pauses generation around it."""
        with lora_unwrapped(self.model_runner.model):
            self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]

    def grpo_update_weights(self, update_info: str) -> None:
        """vLLM's own ``update_weights`` (the NCCL receive), run under ``no_grad``.

        vLLM 0.24's kernel-format receiver copies into parameters with grad enabled, which
        fails on a Qwen2 model ("a leaf Variable that requires grad is being used in an
        in-place operation", H200, 2026-11-24). ``update_info`` is JSON: the RPC route
        passes strings only.
        """
        with torch.no_grad(), lora_unwrapped(self.model_runner.model):
            self.update_weights(json.loads(update_info))  # type: ignore[attr-defined]

    def grpo_receive_delta(self, update_info: str) -> int:
        """Apply the trainer's delta sync (``sync/delta.py``) to the live parameters.

        ``update_info`` is JSON: ``names``, ``shapes``, ``dtype_names`` (vLLM's own layout,
        in the trainer's send order) and ``bucket_bytes``. Runs on the NCCL group vLLM's
        weight-transfer engine opened with the trainer; every bucket is checksummed against
        the trainer's, a mismatch raises here (and so fails the trainer's sync). Returns the
        elements written.
        """
        info = json.loads(update_info)
        layout = [
            Entry(name, tuple(shape), dtype)
            for name, shape, dtype in zip(
                info["names"], info["shapes"], info["dtype_names"], strict=True
            )
        ]
        model = self.model_runner.model
        group = self.weight_transfer_engine.model_update_group  # type: ignore[attr-defined]
        params = dict(served_parameters(model))
        targets = [(entry.name, params[entry.name]) for entry in layout]
        with torch.no_grad():
            written = receive(
                targets, lambda t: group.broadcast(t, src=0), layout, int(info["bucket_bytes"])
            )
        if targets and targets[0][1].is_cuda:
            torch.cuda.synchronize()
        return written

    def grpo_load_weights(self, payload: str) -> int:
        """Load the trainer's tensors (``sync.cuda_ipc.tensor_handles``) into the model.

        vLLM 0.24's native ``ipc`` weight transfer is not used: its module imports ``ray``
        (not a vLLM requirement, not in the carried bundle), and its checkpoint-format path
        rebuilds layers on the meta device. ``load_weights`` copies into the existing
        parameters, as TRL's colocate mode does. Returns how many tensors were loaded.
        """
        weights = open_tensors(payload, torch.cuda.current_device())
        model = self.model_runner.model
        with torch.no_grad(), lora_unwrapped(model):
            model.load_weights(weights)
        torch.cuda.synchronize()
        return len(weights)

    def grpo_load_bucket(self, payloads: str) -> int:
        """Load this GPU's bucket of a multi-rank trainer (``colocate`` on N GPUs).

        ``payloads`` maps GPU UUIDs to buckets (``serve/buckets.py``); this replica opens the
        one of its own GPU by CUDA IPC, gathered there by the trainer rank beside it, and
        loads it with the model's own ``load_weights``. A call without this GPU's bucket
        is refused: behind vLLM's data-parallel front end only engine 0's answer reaches
        the trainer, so an error is how another replica's failure is heard.
        """
        model = self.model_runner.model
        payload = payload_for(payloads, device_uuid(model))
        weights = open_bucket(payload, torch.device("cuda", torch.cuda.current_device()))
        with torch.no_grad(), lora_unwrapped(model):
            model.load_weights(weights)
        torch.cuda.synchronize()
        return len(weights)

    def grpo_check_parameter(self, name: str, values: list[float]) -> None:
        """Raise unless this replica's ``name`` holds exactly the trainer's ``values``."""
        model = self.model_runner.model
        check_parameter(parameter(model, name), name, values, device_uuid(model))
