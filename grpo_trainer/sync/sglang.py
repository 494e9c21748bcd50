"""SGLang's answers to weight updates, as the sync strategies read them.

SGLang answers ``{"success": false, "message": ...}`` (HTTP 400, or 200 in older releases)
on failures, so the flag is checked, not just the status. Mode ``none`` loads full weights
into the running server (``POST /update_weights_from_disk``, which waits for running
requests and flushes the KV cache itself); ``lora_only`` loads each adapter under a new
name and unloads old ones (``sync/lora_only.py``).

Run on an H200 with SGLang 0.5.17 (benchmarks/results/sglang_modes.md); SGLang cannot run
on this project's CPU CI, so CI checks the request and answer shapes, read from the wheel's
sources (``entrypoints/http_server.py``, ``managers/io_struct.py``,
``managers/tokenizer_control_mixin.py``, ``lora/lora_registry.py``).
"""

from __future__ import annotations

from typing import Any

from grpo_trainer.sync.client import InferenceClient, SyncError


def succeeded(answer: Any, what: str) -> None:
    """Raise ``SyncError`` with SGLang's reason when ``answer`` says the call failed."""
    if isinstance(answer, dict) and answer.get("success") is False:
        why = answer.get("message") or answer.get("error_message") or "no reason given"
        raise SyncError(f"SGLang {what} failed: {why}")


def update_from_disk(client: InferenceClient, path: str, step: int) -> None:
    """Load the full weights at ``path`` into the running server (KV cache flushed)."""
    body = {"model_path": path, "weight_version": str(step), "flush_cache": True}
    succeeded(client.post("/update_weights_from_disk", json=body).json(), "weight update")
