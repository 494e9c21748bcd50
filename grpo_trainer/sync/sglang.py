"""SGLang's weight-update APIs, as the sync strategies use them.

Mode ``none`` on SGLang needs no restart: the trainer writes the full weights and asks the
running server to load them in place (``POST /update_weights_from_disk``, which pauses
and flushes the KV cache itself). The LoRA modes replace the served adapter between
``/pause_generation`` and ``/continue_generation`` (SGLang's documented order for weight
updates): ``/unload_lora_adapter`` then ``/load_lora_adapter`` under the same name, since
SGLang has no in-place reload. SGLang answers ``{"success": false, "message": ...}`` with
HTTP 200 on some failures, so the flag is checked, not just the status.

Untested on a GPU so far (SGLang cannot run on this project's CPU CI): the request and
answer shapes follow SGLang's documentation (docs/advanced_features/sglang_for_rl.md,
lora.ipynb).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from torch import nn

from grpo_trainer.sync.artifacts import prune_served, save_full
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.client import InferenceClient, SyncError

PAUSE_MODE = "retract"
"""Running requests go back to the waiting queue and resume after the update (``abort``
would fail them, ``in_place`` keeps KV that the update invalidates)."""


def _succeeded(answer: Any, what: str) -> None:
    if isinstance(answer, dict) and answer.get("success") is False:
        why = answer.get("message") or answer.get("error_message") or "no reason given"
        raise SyncError(f"SGLang {what} failed: {why}")


def update_from_disk(client: InferenceClient, path: str, step: int) -> None:
    """Load the full weights at ``path`` into the running server (KV cache flushed)."""
    body = {"model_path": path, "weight_version": str(step), "flush_cache": True}
    _succeeded(client.post("/update_weights_from_disk", json=body).json(), "weight update")


def replace_adapter(client: InferenceClient, name: str, path: str) -> None:
    """Serve the adapter at ``path`` as ``name``, in place of any adapter of that name.

    The unload is refused when no adapter of that name is loaded yet (the first load, or
    a server restarted with none): that refusal is expected and ignored; a server that is
    down fails the load that follows.
    """
    client.post("/pause_generation", json={"mode": PAUSE_MODE})
    try:
        with contextlib.suppress(SyncError):
            _succeeded(
                client.post("/unload_lora_adapter", json={"lora_name": name}).json(),
                "adapter unload",
            )
        answer = client.post("/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        _succeeded(answer.json(), "adapter load")
    finally:
        client.post("/continue_generation", json={})


class SglangDiskSync(WeightSync):
    """Mode ``none`` on SGLang: full weights to disk, reloaded in place (no restart)."""

    mode = "none"

    def __init__(self, context: SyncContext) -> None:
        super().__init__(context)
        self.client = InferenceClient(context.inference_url, timeout=600.0)

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Write ``served/step_N`` and load it into the running server."""
        start = time.perf_counter()
        path = save_full(model, None, self.context.checkpoint_dir, step)
        update_from_disk(self.client, str(path.resolve()), step)
        prune_served(self.context.checkpoint_dir, keep=path)
        return SyncResult(sync_time=time.perf_counter() - start, policy_version=step)

    def close(self) -> None:
        self.client.close()
