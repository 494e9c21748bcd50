"""Mode ``lora_restart``: save the adapter, the supervisor restarts inference with it.

For servers where runtime LoRA loading is slow or off (vLLM without eager mode loads a
preloaded adapter much faster). The adapter is always served under ``served_model_name``:
preloaded by each restart, and loaded at run time by ``attach`` (at start, so the first
rollouts need no restart, and after a crash restart, whose server preloads the newest
adapter checkpoint or none: the trainer's current adapter replaces it; the rollout API
holds the environments until then, so no request runs on it).
"""

from __future__ import annotations

import time

from torch import nn

from grpo_trainer.control import SupervisorLink
from grpo_trainer.models import adapter_base
from grpo_trainer.sync.artifacts import prune_served, save_adapter
from grpo_trainer.sync.base import SyncContext, SyncResult
from grpo_trainer.sync.client import SyncError
from grpo_trainer.sync.lora_only import HotSwapSync, require_peft
from grpo_trainer.sync.restart import InferenceRestarts


class AdapterRestartSync(HotSwapSync):
    """Adapter -> supervisor restart of inference with ``--lora-modules NAME=PATH``."""

    mode = "lora_restart"

    def __init__(self, context: SyncContext, *, link: SupervisorLink | None = None) -> None:
        super().__init__(context)
        self.restarts = InferenceRestarts(self.mode, link)

    def attach(self, model: nn.Module) -> nn.Module:
        """Serve the trainer's adapter under the stable name, replacing one preloaded."""
        require_peft(model, self.mode)
        self.loaded = []
        name = self.context.served_model_name
        path = save_adapter(model, self.context.checkpoint_dir, "adapter_start")
        try:
            self.post_adapter("load_lora_adapter", name, path)
        except SyncError as error:
            if "already" not in str(error):  # vLLM, SGLang, ours: "already (been) loaded"
                raise
            self.post_adapter("unload_lora_adapter", name)
            self.post_adapter("load_lora_adapter", name, path)
        self.served_model = self._request_name(name)
        return model

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Write ``served/adapter_step_N``; restart inference on its base with it preloaded."""
        start = time.perf_counter()
        path = save_adapter(model, self.context.checkpoint_dir, f"adapter_step_{step}")
        args = {"model": adapter_base(path), "lora_path": str(path.resolve())}
        incarnation = self.restarts.restart(self.client, args)
        self.loaded = []  # a new server: none of the adapters loaded at run time
        self.served_model = self._request_name(self.context.served_model_name)
        prune_served(self.context.checkpoint_dir, keep=path)
        return SyncResult(
            sync_time=time.perf_counter() - start, policy_version=step, incarnation=incarnation
        )
