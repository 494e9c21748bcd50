"""Mode ``lora_only``: each synced adapter is loaded beside the served one, under a new name.

No request ever waits for a reload and no adapter is reloaded under running requests:

1. the adapter is saved to ``served/adapter_step_N`` and loaded into a free slot under a
   new name (``policy-step12-ab3f1``); generation goes on meanwhile;
2. the trainer reports that name with the served version to the rollout API, and each
   environment asks for it from its next group on (``served_model``: the switch is atomic
   for them, between two groups);
3. adapters two loads old are unloaded: by then no environment asks for them, and the
   requests that did have finished (the built-in server refuses to unload an adapter in
   use, 409, and it is tried again at the next sync; vLLM's unload only forgets the name).

vLLM's engine could die when an adapter was reloaded in place under running requests
(vllm-project/vllm#13698, seen on an H200 with 0.24.0); before the two slots every reload
paused generation (``mode=wait``) around it, which cost 23.6 s per step against 12.6 s in
``shared_vllm`` at the 0.5B workload. The built-in server refuses an in-place reload of an
adapter in use (409), so a regression to one fails on CPU. SGLang loads and unloads by the
same names (``/load_lora_adapter``, ``/unload_lora_adapter``, which waits until no request
holds the adapter) and is asked for ``<base>:<adapter>``.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from torch import nn

from grpo_trainer.sync.artifacts import prune_served, save_adapter
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.client import InferenceClient, SyncError, base_model_name
from grpo_trainer.sync.sglang import succeeded

LOADED_KEPT = 2
"""Adapters kept loaded: the served one and the one environments may still name."""


def require_peft(model: nn.Module, mode: str) -> None:
    """LoRA modes train a peft model; anything else is a wiring error."""
    if not hasattr(model, "peft_config"):
        raise SyncError(f"weight-sync mode {mode!r} needs a peft (LoRA) model to train")


class HotSwapSync(WeightSync):
    """Adapter -> a new slot -> the served name moves to it -> the old slot is freed."""

    mode = "lora_only"
    attach_serves = True

    def __init__(self, context: SyncContext) -> None:
        super().__init__(context)
        self.client = InferenceClient(context.inference_url)
        self.loaded: list[str] = []
        """Adapter names this strategy loaded into the running server, oldest first."""
        self.base: str | None = None
        self._tag = os.urandom(2).hex()
        """Names stay unique across trainer restarts on one server (a new tag each)."""

    @property
    def adapter(self) -> str | None:
        """The adapter served now (None before the first load)."""
        return self.loaded[-1] if self.loaded else None

    def load_adapter(self, path: Path, label: str) -> str:
        """Load the adapter at ``path`` under a new name (``label``: ``step12``, ``start``);
        environments are told it with the next served version. Returns the name."""
        name = f"{self.context.served_model_name}-{label}-{self._tag}{len(self.loaded)}"
        self.post_adapter("load_lora_adapter", name, path)
        self.loaded.append(name)
        self.served_model = self._request_name(name)
        self._unload_stale()
        return name

    def post_adapter(self, action: str, name: str, path: Path | None = None) -> None:
        """``load_lora_adapter`` / ``unload_lora_adapter`` of ``name`` on either backend
        (SGLang's routes, and its ``success`` flag checked); ``SyncError`` on a refusal."""
        route = f"/{action}" if self.context.backend == "sglang" else f"/v1/{action}"
        body = {"lora_name": name}
        if path is not None:
            body["lora_path"] = str(path.resolve())
        answer = self.client.post(route, json=body)
        if self.context.backend == "sglang":
            succeeded(answer.json(), f"adapter {action.split('_')[0]}")

    def _request_name(self, adapter: str) -> str:
        """What environments put in ``model``: SGLang picks an adapter by ``base:adapter``."""
        if self.context.backend != "sglang":
            return adapter
        if self.base is None:
            self.base = base_model_name(self.client)
        return f"{self.base}:{adapter}"

    def _unload_stale(self) -> None:
        """Unload all but the last ``LOADED_KEPT``; one still in use stays for the next try."""
        for name in self.loaded[:-LOADED_KEPT]:
            try:
                self.post_adapter("unload_lora_adapter", name)
            except SyncError:
                continue
            self.loaded.remove(name)

    def attach(self, model: nn.Module) -> nn.Module:
        """Serve the trainer's adapter before the first rollout is asked for (also after an
        inference restart: the new server holds none of ours). Ours are unloaded first
        where the server still holds them: a trainer that found inference down at its start
        attaches to the next server, then re-attaches to that same one once it is up."""
        require_peft(model, self.mode)
        for name in self.loaded:
            with contextlib.suppress(SyncError):  # a new server: it never had it
                self.post_adapter("unload_lora_adapter", name)
        self.loaded = []
        self.base = None
        path = save_adapter(model, self.context.checkpoint_dir, "adapter_start")
        self.load_adapter(path, "start")
        return model

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Write ``served/adapter_step_N`` and serve it under a new name."""
        start = time.perf_counter()
        path = save_adapter(model, self.context.checkpoint_dir, f"adapter_step_{step}")
        self.load_adapter(path, f"step{step}")
        prune_served(self.context.checkpoint_dir, keep=path)
        return SyncResult(sync_time=time.perf_counter() - start, policy_version=step)

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()
