"""Mode ``lora_restart``: save the adapter, the supervisor restarts inference with it.

For servers where runtime LoRA loading is slow or off (vLLM without eager mode loads a
preloaded adapter much faster). The starting adapter is loaded at run time in ``attach``
(both LoRA modes start inference with LoRA slots) so the first rollouts need no restart;
after each restart the adapter is preloaded under ``served_model_name``.
"""

from __future__ import annotations

import time

from torch import nn

from grpo_trainer.control import SupervisorLink
from grpo_trainer.models import adapter_base
from grpo_trainer.sync.artifacts import prune_served, save_adapter
from grpo_trainer.sync.base import SyncContext, SyncResult
from grpo_trainer.sync.lora_only import HotSwapSync
from grpo_trainer.sync.restart import InferenceRestarts


class AdapterRestartSync(HotSwapSync):
    """Adapter -> supervisor restart of inference with ``--lora-modules NAME=PATH``."""

    mode = "lora_restart"

    def __init__(self, context: SyncContext, *, link: SupervisorLink | None = None) -> None:
        super().__init__(context)
        self.restarts = InferenceRestarts(self.mode, link)

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Write ``served/adapter_step_N``; restart inference on its base with it preloaded."""
        start = time.perf_counter()
        path = save_adapter(model, self.context.checkpoint_dir, f"adapter_step_{step}")
        args = {"model": adapter_base(path), "lora_path": str(path.resolve())}
        self.restarts.restart(self.client, args)
        self.loaded = []  # a new server: none of the adapters loaded at run time
        self.served_model = self._request_name(self.context.served_model_name)
        prune_served(self.context.checkpoint_dir, keep=path)
        return SyncResult(sync_time=time.perf_counter() - start, policy_version=step)
