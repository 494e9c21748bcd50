"""What each weight-sync mode needs from the inference server, and what a switch restarts.

One server per run: it starts with every capability the run may switch to (LoRA slots,
sleep mode; on vLLM also the worker extension, the weight-transfer config and dev mode,
which cost nothing measurable), so a switch among the *in-place modes* (``none``,
``shared_vllm``, ``colocate``, ``lora_only``) changes how weights flow, not which process
serves them. Inference restarts only where the engine requires it:

- ``lora_restart`` serves each adapter from a restart (by definition), and ``none`` with
  ``[inference] none_reload = "restart"`` reloads by restarting;
- a switch between modes whose servers differ in capabilities (``capabilities``): one the
  profile turned off (``enable_lora``, ``enable_sleep_mode``; a server still has what its
  own mode needs), or vLLM's sleep mode beside CUDA IPC weight sharing (``cuda_ipc_shares``:
  the two cannot share one server, so only ``colocate``'s has sleep mode there).

Measured costs (H200, vLLM 0.24, ``benchmarks/results/vllm_startup.md``): LoRA slots make
vLLM capture twice the CUDA graphs (16 s instead of 1-2 s at start) and generate the
quickstart's burst in 107-119 ms instead of 100-109 ms; eager mode (``enforce_eager``)
skips the capture. Sleep mode's own cost was not separable from LoRA's there.
Torch-free: ``grpo-tui check`` and the stack decide through here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from grpo_trainer.serve.settings import InferenceSettings

Capability = Literal["lora", "sleep"]
CAPABILITY_KEYS: dict[str, str] = {"lora": "enable_lora", "sleep": "enable_sleep_mode"}
"""Each capability and the ``[inference]`` key that turns it off."""
MODE_NEEDS: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "shared_vllm": frozenset(),
    "colocate": frozenset({"sleep"}),
    "lora_only": frozenset({"lora"}),
    "lora_restart": frozenset({"lora"}),
}
RESTART_MODES = ("none", "lora_restart")
"""Modes whose sync can restart inference: ``lora_restart`` always, ``none`` when its
reload is ``restart`` (``restarts_inference``)."""
LORA_SLOTS = 2
"""vLLM's ``--max-loras``: the served adapter and the one replacing it (``lora_only``)."""


def restarts_inference(mode: str, none_reload: str = "in_place") -> bool:
    """Whether a sync in ``mode`` restarts the inference server: the one place that says so.

    ``none`` reloads full weights into the running server (vLLM's ``reload_weights``,
    SGLang's ``/update_weights_from_disk``, the built-in server's same route) unless
    ``none_reload`` is ``restart``; ``lora_restart`` always restarts.
    """
    return mode == "lora_restart" or (mode == "none" and none_reload == "restart")


def in_place(mode: str, none_reload: str = "in_place") -> bool:
    """Whether ``mode`` runs on the one server with every capability (no sync restarts it)."""
    return not restarts_inference(mode, none_reload)


def capabilities(settings: InferenceSettings, mode: str) -> frozenset[str]:
    """What an in-place server of ``settings`` in ``mode`` is started with: what the
    profile leaves on, and what ``mode`` needs.

    Built-in replicas (``data_parallel_size`` > 1) load their weights from a multi-rank
    trainer's buckets and take no adapters: no LoRA slots there unless the mode needs them
    (which the server refuses). Sleep mode is left out where the trainer maps vLLM's
    weights through CUDA IPC (``cuda_ipc_shares``), but for ``colocate``, which needs it.
    """
    found = set()
    if settings.enable_lora and not (
        settings.backend == "builtin" and settings.data_parallel_size > 1
    ):
        found.add("lora")
    if (
        settings.enable_sleep_mode
        and settings.backend != "sglang"
        and not cuda_ipc_shares(settings)
    ):
        found.add("sleep")
    return frozenset(found) | MODE_NEEDS[mode]


def cuda_ipc_shares(settings: InferenceSettings) -> bool:
    """Whether ``shared_vllm`` maps vLLM's weights into the trainer through CUDA IPC
    (vLLM, ``weight_transfer = "cuda_ipc"``). vLLM's sleep mode allocates the weights with
    its own cuMem allocator, outside torch's, and CUDA IPC cannot share those: exporting
    them fails with ``CUDA error: invalid argument`` (vLLM 0.24, H100, 2026-11-26)."""
    return settings.backend == "vllm" and settings.weight_transfer == "cuda_ipc"


def switch_restarts_inference(settings: InferenceSettings, old: str, new: str) -> str | None:
    """Why a switch from ``old`` to ``new`` restarts inference; None: it keeps serving.

    A server switched in place keeps its capabilities, so a switch stays in place only
    between modes whose servers have the same ones: the server running in ``old`` then
    has exactly ``capabilities(settings, old)``, whichever in-place switches led there.
    """
    for mode in (old, new):
        if restarts_inference(mode, settings.none_reload):
            return f"{mode} reloads weights by restarting inference"
    if settings.backend == "builtin" and settings.data_parallel_size > 1:
        return "built-in replicas (data_parallel_size > 1) serve one mode"
    has, wants = capabilities(settings, old), capabilities(settings, new)
    if has == wants:
        return None
    differ = sorted(has ^ wants)
    why = [f"inference.{CAPABILITY_KEYS[cap]} = false" for cap in differ if not _on(settings, cap)]
    if "sleep" in differ and cuda_ipc_shares(settings):
        why.append("vLLM's sleep mode cannot share weights through CUDA IPC")
    return f"mode {new}'s server has {_named(wants)}, mode {old}'s {_named(has)} ({'; '.join(why)})"


def _on(settings: InferenceSettings, capability: str) -> bool:
    return bool(getattr(settings, CAPABILITY_KEYS[capability]))


def _named(found: frozenset[str]) -> str:
    return " and ".join(sorted(found)) or "no optional capability"
