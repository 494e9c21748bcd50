"""Mode ``none`` (Atropos' legacy): full checkpoint, then the supervisor restarts inference.

Slow (a server start per sync) but works with any server that loads a model directory.
"""

from __future__ import annotations

import time

from torch import nn
from transformers import PreTrainedTokenizerBase

from grpo_trainer.control import SupervisorLink
from grpo_trainer.models import load_tokenizer
from grpo_trainer.sync.artifacts import prune_served, save_full
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.client import InferenceClient
from grpo_trainer.sync.restart import require_link, restart_inference


class RestartSync(WeightSync):
    """Save full weights + tokenizer, restart inference on them, wait until healthy."""

    mode = "none"
    attaches_at_server = False

    def __init__(
        self,
        context: SyncContext,
        *,
        link: SupervisorLink | None = None,
        restart_timeout: float = 600.0,
    ) -> None:
        super().__init__(context)
        self.link = require_link(link, self.mode)
        self.client = InferenceClient(context.inference_url)
        self.restart_timeout = restart_timeout
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def _tokenizer_for(self, model: nn.Module) -> PreTrainedTokenizerBase | None:
        """The tokenizer of the model the trainer loaded, saved next to each checkpoint."""
        if self._tokenizer is None:
            source = getattr(model, "name_or_path", None)
            self._tokenizer = load_tokenizer(source) if source else None
        return self._tokenizer

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Write ``served/step_N``, restart inference on it, prune older synced weights."""
        start = time.perf_counter()
        path = save_full(model, self._tokenizer_for(model), self.context.checkpoint_dir, step)
        restart_inference(
            self.link, self.client, {"model": str(path.resolve())}, timeout=self.restart_timeout
        )
        prune_served(self.context.checkpoint_dir, keep=path)
        return SyncResult(sync_time=time.perf_counter() - start, policy_version=step)

    def close(self) -> None:
        """Close the HTTP client (the link belongs to the trainer)."""
        self.client.close()
