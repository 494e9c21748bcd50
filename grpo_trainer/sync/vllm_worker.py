"""The vLLM worker extension (``--worker-extension-cls``) for ``shared_vllm`` on one GPU.

vLLM mixes this class into each GPU worker; ``POST /collective_rpc {"method": ...}`` calls
its methods there, where ``self.model_runner.model`` is the live model. It only reads:
it exports CUDA IPC handles of the parameters so that the trainer, on the same GPU, can
map them and update them in place, and it lists the parameters' layout so that a trainer
on other GPUs can send them in vLLM's own (kernel) format. No vLLM import, no patching.
"""

from __future__ import annotations

from typing import Any

from grpo_trainer.serve.cuda_ipc import device_uuid, export_weights


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
        """``[name, shape, dtype]`` of every parameter, in the worker's order."""
        return [
            [name, list(param.shape), str(param.dtype).removeprefix("torch.")]
            for name, param in self.model_runner.model.named_parameters()
        ]
