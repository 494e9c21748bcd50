"""Mode ``none`` (Atropos' legacy): full weights written to disk, then served from there.

In place (the default): the running server loads the folder, no restart. vLLM through our
worker extension's ``grpo_reload_weights`` (vLLM's own ``reload_weights``, layer by layer
into the existing parameters) inside ``/pause?mode=wait`` ... ``/resume`` plus a prefix-cache
reset; the built-in server the same route; SGLang ``/update_weights_from_disk``, which waits
for running requests and flushes its cache itself. So ``none`` syncs every step by default.

``[inference] none_reload = "restart"``: the supervisor restarts inference on the folder
(slow, a server start per sync, but any server that loads a model directory works).
"""

from __future__ import annotations

import time
from pathlib import Path

from torch import nn
from transformers import PreTrainedTokenizerBase

from grpo_trainer.control import SupervisorLink
from grpo_trainer.models import load_tokenizer
from grpo_trainer.sync.artifacts import prune_served, save_full
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.client import InferenceClient, base_model_name
from grpo_trainer.sync.restart import InferenceRestarts
from grpo_trainer.sync.sglang import update_from_disk

RELOAD_METHOD = "grpo_reload_weights"
"""The worker extension's (and the built-in server's) ``/collective_rpc`` method."""


class FullWeightsSync(WeightSync):
    """Writes ``served/step_N`` (weights + tokenizer) and serves it; subclasses say how."""

    mode = "none"
    attaches_at_server = False

    def __init__(self, context: SyncContext, *, timeout: float = 600.0) -> None:
        super().__init__(context)
        self.client = InferenceClient(context.inference_url, timeout=timeout)
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def _tokenizer_for(self, model: nn.Module) -> PreTrainedTokenizerBase | None:
        """The tokenizer of the model the trainer loaded, saved next to each checkpoint."""
        if self._tokenizer is None:
            source = getattr(model, "name_or_path", None)
            self._tokenizer = load_tokenizer(source) if source else None
        return self._tokenizer

    def attach(self, model: nn.Module) -> nn.Module:
        """Nothing to reach before the first sync (the trainer may start before inference is
        up); the served name is asked for after the first load."""
        self.served_model = None
        return model

    def serve(self, path: Path, step: int) -> int | None:
        """Make the server serve the weights at ``path`` (written for ``step``); the
        inference incarnation that serves them where this started one."""
        raise NotImplementedError

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Write ``served/step_N``, serve it, prune older synced weights."""
        start = time.perf_counter()
        path = save_full(model, self._tokenizer_for(model), self.context.checkpoint_dir, step)
        written = time.perf_counter()
        incarnation = self.serve(path.resolve(), step)
        if self.served_model is None:  # the base's name, what environments ask for
            self.served_model = base_model_name(self.client)
        prune_served(self.context.checkpoint_dir, keep=path)
        done = time.perf_counter()
        phases = {"save": written - start, "load": done - written}
        return SyncResult(
            sync_time=done - start, policy_version=step, phases=phases, incarnation=incarnation
        )

    def close(self) -> None:
        """Close the HTTP client (the link belongs to the trainer)."""
        self.client.close()


class ReloadSync(FullWeightsSync):
    """The running server loads the folder in place (no restart)."""

    def serve(self, path: Path, step: int) -> None:
        if self.context.backend == "sglang":
            update_from_disk(self.client, str(path), step)
            return
        self.client.post("/pause", mode="wait")
        try:
            body = {"method": RELOAD_METHOD, "kwargs": {"weights_path": str(path)}}
            self.client.post("/collective_rpc", json=body)
        finally:
            self.client.post("/resume")
        self.client.post("/reset_prefix_cache")


class RestartSync(FullWeightsSync):
    """The supervisor restarts inference on the folder; waits until it is healthy."""

    def __init__(self, context: SyncContext, *, link: SupervisorLink | None = None) -> None:
        super().__init__(context)
        self.restarts = InferenceRestarts(self.mode, link)

    def serve(self, path: Path, step: int) -> int | None:
        incarnation = self.restarts.restart(self.client, {"model": str(path)})
        self.served_model = None  # a new server: its name is asked for again
        return incarnation
