"""Mode ``lora_only``: save the adapter, hot-swap it into the running server.

The adapter is served under the stable name environments ask for
(``served_model_name``); ``load_inplace`` replaces its weights without a restart. Works
the same on vLLM (runtime LoRA updating on) and on the built-in server.
"""

from __future__ import annotations

import time
from pathlib import Path

from torch import nn

from grpo_trainer.sync.artifacts import prune_served, save_adapter
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.client import InferenceClient, SyncError
from grpo_trainer.sync.sglang import replace_adapter

INITIAL_ADAPTER = "adapter_initial"


def require_peft(model: nn.Module, mode: str) -> None:
    """LoRA modes train a peft model; anything else is a wiring error."""
    if not hasattr(model, "peft_config"):
        raise SyncError(f"weight-sync mode {mode!r} needs a peft (LoRA) model to train")


class HotSwapSync(WeightSync):
    """Adapter -> ``POST /v1/load_lora_adapter {load_inplace: true}``."""

    mode = "lora_only"

    def __init__(self, context: SyncContext) -> None:
        super().__init__(context)
        self.client = InferenceClient(context.inference_url)

    def load_adapter(self, path: Path) -> None:
        """Serve the adapter at ``path`` under the stable name, replacing the previous one.

        vLLM's engine can die when an adapter is reloaded while generations use it
        (vllm-project/vllm#13698, seen on an H200 with 0.24.0), so generation is paused
        (``wait``: in-flight requests finish first) around the reload there. SGLang has
        no in-place reload: :func:`replace_adapter` unloads and loads from a stable path.
        """
        if self.context.backend == "sglang":
            replace_adapter(self.client, self.context.served_model_name, path)
            return
        body = {
            "lora_name": self.context.served_model_name,
            "lora_path": str(path.resolve()),
            "load_inplace": True,
        }
        if self.context.backend != "vllm":
            self.client.post("/v1/load_lora_adapter", json=body)
            return
        self.client.post("/pause", mode="wait")
        try:
            self.client.post("/v1/load_lora_adapter", json=body)
        finally:
            self.client.post("/resume")
        self.client.post("/reset_prefix_cache")

    def attach(self, model: nn.Module) -> nn.Module:
        """Serve the trainer's starting adapter before the first rollout is asked for."""
        require_peft(model, self.mode)
        path = save_adapter(model, self.context.checkpoint_dir, INITIAL_ADAPTER)
        self.load_adapter(path)
        return model

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Write ``served/adapter_step_N`` and load it in place."""
        start = time.perf_counter()
        path = save_adapter(model, self.context.checkpoint_dir, f"adapter_step_{step}")
        self.load_adapter(path)
        prune_served(self.context.checkpoint_dir, keep=path)
        return SyncResult(sync_time=time.perf_counter() - start, policy_version=step)

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()
