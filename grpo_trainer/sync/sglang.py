"""SGLang's weight-update APIs, as the sync strategies use them.

Mode ``none`` on SGLang needs no restart: the trainer writes the full weights and asks the
running server to load them in place (``POST /update_weights_from_disk``, which waits for
running requests and flushes the KV cache itself). The LoRA modes replace the served
adapter with ``/unload_lora_adapter`` then ``/load_lora_adapter`` under the same name,
since SGLang has no in-place reload; see :func:`replace_adapter` for why there is no
pause around them. SGLang answers ``{"success": false, "message": ...}`` (HTTP 400, or
200 in older releases) on failures, so the flag is checked, not just the status.

Run on an H200 with SGLang 0.5.17 (benchmarks/results/sglang_modes.md); SGLang cannot run
on this project's CPU CI, so CI checks the request and answer shapes, read from the wheel's
sources (``entrypoints/http_server.py``, ``managers/io_struct.py``,
``managers/tokenizer_control_mixin.py``, ``lora/lora_registry.py``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from torch import nn

from grpo_trainer.sync.artifacts import prune_served, save_full
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.client import InferenceClient, SyncError

CURRENT_ADAPTER = "adapter_current"
"""The stable path SGLang loads the served adapter from: a symlink to the newest one."""


def _succeeded(answer: Any, what: str) -> None:
    if isinstance(answer, dict) and answer.get("success") is False:
        why = answer.get("message") or answer.get("error_message") or "no reason given"
        raise SyncError(f"SGLang {what} failed: {why}")


def update_from_disk(client: InferenceClient, path: str, step: int) -> None:
    """Load the full weights at ``path`` into the running server (KV cache flushed)."""
    body = {"model_path": path, "weight_version": str(step), "flush_cache": True}
    _succeeded(client.post("/update_weights_from_disk", json=body).json(), "weight update")


def point_current(adapter: Path) -> Path:
    """Make ``served/adapter_current`` point at ``adapter`` (atomically); the link's path."""
    link = adapter.parent.resolve() / CURRENT_ADAPTER
    tmp = link.with_name(f".tmp-{CURRENT_ADAPTER}-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(adapter.name)
    os.replace(tmp, link)
    return link


def replace_adapter(client: InferenceClient, name: str, adapter: Path) -> None:
    """Serve ``adapter`` as ``name``, in place of any adapter of that name.

    SGLang 0.5.17's unload waits until no request holds the adapter, and a request holds it
    until it finishes, paused or not: with generation paused (``/pause_generation``, any
    mode but ``abort``) the unload would wait forever. So no pause: the unload waits for the
    running requests. It also waits forever once a request with ``n > 1`` used the adapter
    (seen on an H200, 2026-11-26): such a request counts n uses and releases n + 1 (its
    prefix-caching request too), so the count never returns to zero; environments therefore
    ask SGLang for n copies of the prompt (``EnvSettings.prompt_copies``). A request that
    arrives meanwhile finds the name gone and SGLang reloads the adapter itself from the
    path it was loaded from, before our load gets its turn. That path is
    :data:`CURRENT_ADAPTER`, already pointing at the new adapter, so whichever load comes
    first serves the new weights, and ours answering "already loaded" is that case. The
    unload is refused when no adapter of that name is loaded yet (the first load, a
    restarted server): expected and ignored.
    """
    path = str(point_current(adapter))
    with contextlib.suppress(SyncError):
        _succeeded(
            client.post("/unload_lora_adapter", json={"lora_name": name}).json(),
            "adapter unload",
        )
    try:
        answer = client.post("/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        _succeeded(answer.json(), "adapter load")
    except SyncError as error:
        if "already loaded" not in str(error):  # not SGLang's own reload of the same path
            raise


class SglangDiskSync(WeightSync):
    """Mode ``none`` on SGLang: full weights to disk, reloaded in place (no restart)."""

    mode = "none"
    attaches_at_server = False

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
