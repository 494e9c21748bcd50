"""``make_strategy(mode, context)``: the one place a mode name becomes a sync object."""

from __future__ import annotations

from grpo_trainer.control import SupervisorLink
from grpo_trainer.serve.capabilities import restarts_inference
from grpo_trainer.serve.command_lines import SGLANG_REFUSED
from grpo_trainer.sync.base import MODES, SyncContext, WeightSync
from grpo_trainer.sync.colocate import ColocateSharedSync, VllmColocateSync
from grpo_trainer.sync.lora_only import HotSwapSync
from grpo_trainer.sync.lora_restart import AdapterRestartSync
from grpo_trainer.sync.none import ReloadSync, RestartSync
from grpo_trainer.sync.shared import SharedFileSync
from grpo_trainer.sync.vllm_shared import VllmSharedSync


def make_strategy(
    mode: str, context: SyncContext, *, link: SupervisorLink | None = None
) -> WeightSync:
    """The weight-sync strategy for ``mode`` on ``context.backend``.

    ``link`` is the trainer's supervisor link (restart modes need it and default to one
    from ``GRPO_TUI_SOCKET``; ``shared_vllm`` on vLLM reports a fallback there). Raises
    ``ValueError`` for an unknown mode or backend and ``SyncError`` when the mode cannot
    run here (a restart mode without a supervisor).
    """
    if mode not in MODES:
        raise ValueError(f"unknown weight-sync mode {mode!r}; choose one of {', '.join(MODES)}")
    if context.backend not in ("builtin", "vllm", "sglang"):
        raise ValueError(f"unknown inference backend {context.backend!r}")
    if context.backend == "sglang" and mode in SGLANG_REFUSED:
        raise ValueError(f"backend sglang cannot run mode {mode!r}: {SGLANG_REFUSED[mode]}")
    if mode == "none":
        if restarts_inference(mode, context.none_reload):
            return RestartSync(context, link=link)
        return ReloadSync(context)
    if mode == "lora_restart":
        return AdapterRestartSync(context, link=link)
    if mode == "lora_only":
        return HotSwapSync(context)
    if mode == "colocate":
        if context.backend == "builtin":
            return ColocateSharedSync(context)
        return VllmColocateSync(context)
    if context.backend == "builtin":
        return SharedFileSync(context)
    return VllmSharedSync(context, link=link)
