"""Where grpo-tui keeps what outlives a run: built tiny models, vLLM's compile cache.

``$GRPO_TUI_CACHE``, else ``$XDG_CACHE_HOME/grpo-tui``, else ``~/.cache/grpo-tui``; one
variable moves all of it (e.g. to node-local disk on a cluster). Deleting the folder is
always safe: everything in it is rebuilt on the next run, at the cost of that run's time.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "GRPO_TUI_CACHE"


def cache_dir(name: str) -> Path:
    """The cache folder for ``name`` (e.g. ``tiny-models``, ``vllm``); not created here."""
    if explicit := os.environ.get(CACHE_ENV):
        return Path(explicit) / name
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "grpo-tui" / name
