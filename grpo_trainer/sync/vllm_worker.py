"""The vLLM worker extension (``--worker-extension-cls``) for ``shared_vllm`` on one GPU.

vLLM mixes this class into each GPU worker; ``POST /collective_rpc {"method": ...}`` calls
its methods there, where ``self.model_runner.model`` is the live model. It only reads:
it exports CUDA IPC handles of the parameters so that the trainer, on the same GPU, can
map them and update them in place. No vLLM import, no patching of vLLM.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

import torch
from torch.multiprocessing.reductions import reduce_tensor


class SharedWeightsExtension:
    """RPC methods run inside vLLM's worker (``self`` is the worker)."""

    model_runner: Any

    def grpo_device_uuid(self) -> str:
        """UUID of the GPU holding the weights (the trainer must be on the same one)."""
        device = next(self.model_runner.model.parameters()).device
        return str(torch.cuda.get_device_properties(device).uuid)

    def grpo_export_weights(self) -> list[dict[str, Any]]:
        """Name, shape, dtype and a base64 pickled CUDA IPC handle of every parameter."""
        exported = []
        for name, param in self.model_runner.model.named_parameters():
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
