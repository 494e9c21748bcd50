"""The command line that starts an inference server, for each engine: the built-in server,
vLLM and SGLang (``inference_command``: settings plus a weight-sync mode become an argv and
environment).

Torch-free, as ``settings.py``: ``grpo-tui check`` builds every role's command through here.
One server serves every mode a run can switch to (``capabilities.py``): the in-place modes
start it with every capability the profile leaves on; ``lora_restart`` (and ``none`` with
``none_reload = "restart"``) start it with their own flags, as a restart serves each sync.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import typing
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from grpo_trainer.api.settings import is_loopback
from grpo_trainer.cache import cache_dir
from grpo_trainer.serve.capabilities import LORA_SLOTS, MODE_NEEDS, capabilities, in_place
from grpo_trainer.serve.settings import (
    LORA_MODES,
    SGLANG_MODULE,
    SHARED_MODES,
    InferenceSettings,
    Mode,
)

VLLM_WORKER_EXTENSION = "grpo_trainer.sync.vllm_worker.SharedWeightsExtension"
VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"
VLLM_LAUNCH_MODULE = "grpo_trainer.serve.vllm_launch"
"""vLLM's CLI run in-process after its imports and the start gate (``vllm_preimport``)."""
SGLANG_TOKEN_LAUNCH = "grpo_trainer.serve.sglang_launch"
"""Beyond loopback, SGLang is started through this module, which passes it the token."""
VLLM_TOKEN_GUARD = "grpo_trainer.sync.vllm_guard.EnvTokenGuard"
"""vLLM's ``--middleware`` beyond loopback: the run's token on every route, dev ones too."""
VLLM_LEASE = "grpo_trainer.serve.lease.LeaseMiddleware"
"""vLLM's ``--middleware`` of an in-place server: the lease of a run attached to it when it
is kept between runs (``serve/lease.py``); listed before the token guard, which vLLM then
adds outside it."""


class InferenceLaunch(BaseModel):
    """A resolved launch: the argv to exec and the environment variables to add.

    ``gated``: the command reads the start gate after its imports and takes a new command
    there (``grpo_trainer.start_gate``), so it may be spawned early, and kept as a standby.
    """

    model_config = ConfigDict(extra="forbid")

    argv: list[str]
    env: dict[str, str]
    gated: bool = False


def inference_command(
    settings: InferenceSettings,
    *,
    mode: str,
    model: str,
    adapter: str | None = None,
    shared_dir: str | None = None,
) -> InferenceLaunch:
    """The command that serves ``model`` (plus ``adapter`` in LoRA modes) for sync ``mode``.

    An in-place mode's server has every capability ``settings`` leaves on and those its
    mode needs (``capabilities.py``): the same for each of them unless one is off; a restart
    mode's has its own flags. ``shared_dir`` (built-in, one replica) is where its weights
    live in shared memory, so that a trainer can share them (``shared_vllm``, ``colocate``).
    Raises ``ValueError`` naming the problem for an unknown mode, an adapter outside the
    LoRA modes, the built-in ``shared_vllm`` / ``colocate`` mode without a ``shared_dir``,
    or a mode the SGLang backend cannot run (``SGLANG_REFUSED``).
    """
    if mode not in typing.get_args(Mode):
        raise ValueError(f"unknown weight-sync mode {mode!r}")
    if adapter is not None and mode not in LORA_MODES:
        raise ValueError(f"an adapter is only served in LoRA modes, not in {mode!r}")
    if settings.backend == "vllm":
        return _vllm_command(settings, mode=mode, model=model, adapter=adapter)
    if settings.backend == "sglang":
        return _sglang_command(settings, mode=mode, model=model, adapter=adapter)
    return _builtin_command(
        settings, mode=mode, model=model, adapter=adapter, shared_dir=shared_dir
    )


def started_with(settings: InferenceSettings, mode: str) -> frozenset[str]:
    """The capabilities the server of ``mode`` starts with (``capabilities.py``)."""
    if not in_place(mode, settings.none_reload):
        return MODE_NEEDS[mode]
    return capabilities(settings, mode)


def _serve_flags(settings: InferenceSettings, *, mode: str, model: str) -> list[str]:
    """The model and the flags both servers share (vLLM's names)."""
    return [
        model,
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--served-model-name",
        settings.base_model_name(mode),
        "--dtype",
        settings.dtype,
        "--seed",
        str(settings.seed),
    ]


def _builtin_command(
    settings: InferenceSettings,
    *,
    mode: str,
    model: str,
    adapter: str | None,
    shared_dir: str | None,
) -> InferenceLaunch:
    argv = [
        sys.executable,
        "-m",
        "grpo_trainer.serve",
        *_serve_flags(settings, mode=mode, model=model),
        "--device",
        settings.device,
        *settings.cpu_threads_flag,
    ]
    if settings.max_model_len is not None:
        argv += ["--max-model-len", str(settings.max_model_len)]
    capable = started_with(settings, mode)
    if "lora" in capable:
        argv += ["--enable-lora", "--max-lora-rank", str(settings.max_lora_rank)]
        if adapter is not None:
            argv += ["--lora-modules", f"{settings.served_model_name}={adapter}"]
    if settings.data_parallel_size > 1:
        # one replica per trainer rank, each loaded from that rank's gathered weights
        argv += ["--data-parallel-size", str(settings.data_parallel_size)]
    elif mode in SHARED_MODES and shared_dir is None:
        raise ValueError(f"{mode} on the built-in backend needs shared_dir")
    elif shared_dir is not None and (mode in SHARED_MODES or in_place(mode, settings.none_reload)):
        argv += ["--shared-weights", shared_dir]
    if "sleep" in capable:
        argv.append("--enable-sleep-mode")
    return InferenceLaunch(argv=[*argv, *settings.extra_args], env={}, gated=True)


VLLM_FLAGS = {
    "max_model_len": "--max-model-len",
    "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "enforce_eager": "--enforce-eager",
    "tensor_parallel_size": "--tensor-parallel-size",
    "data_parallel_size": "--data-parallel-size",
}
SGLANG_FLAGS = {
    "max_model_len": "--context-length",
    "gpu_memory_utilization": "--mem-fraction-static",
    "enforce_eager": "--disable-cuda-graph",
    "tensor_parallel_size": "--tp-size",
    "data_parallel_size": "--dp-size",
}
"""Each engine's flag for the same optional settings (vLLM's and SGLang's names)."""


def _engine_flags(settings: InferenceSettings, names: dict[str, str]) -> list[str]:
    """The optional engine settings that are set, under the engine's own flag names."""
    argv: list[str] = []
    for key in ("max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes"):
        if key in names and (value := getattr(settings, key)) is not None:
            argv += [names[key], str(value)]
    if settings.enforce_eager:
        argv.append(names["enforce_eager"])
    for key in ("tensor_parallel_size", "data_parallel_size"):
        if (size := getattr(settings, key)) > 1:
            argv += [names[key], str(size)]
    return argv


def vllm_start_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What our vLLM servers start with, each unless the supervisor's environment sets it
    already (and a profile overrides either with ``[process.inference] env``)."""
    environ = os.environ if environ is None else environ
    wanted = {
        # vLLM caches the model-class inspection (modelinfos/: a subprocess importing vLLM
        # again, ~23 s on a cold start) and torch.compile's artifacts (Inductor, 14-16 s)
        # under its cache root. Ours lives in the grpo-tui cache: the next start, and the
        # next run, reuse both, and one variable moves or clears every cache we keep.
        "VLLM_CACHE_ROOT": str(cache_dir("vllm").absolute()),
        # vLLM's CLI sets spawn when this is unset (vllm/entrypoints/serve/utils/
        # api_utils.py, cli_env_setup): the engine core is then a fresh interpreter that
        # imports vLLM again, ~20 s on an H200. Forked, it inherits the API server's
        # imports and starts within a second. Safe here: the API server has not touched
        # CUDA when it forks, and vLLM itself falls back to spawn, with a warning, when
        # CUDA is initialised (vllm/utils/system_utils.py, _maybe_force_spawn).
        "VLLM_WORKER_MULTIPROC_METHOD": "fork",
    }
    return {key: value for key, value in wanted.items() if key not in environ}


def _vllm_launcher(settings: InferenceSettings) -> tuple[list[str], bool]:
    """How to start vLLM's CLI, and whether that reads the start gate: our launcher in
    vLLM's Python (``vllm_preimport``) where we can name that Python, else the CLI as
    configured. The plain ``vllm`` script is ours to replace only when this interpreter
    can import vLLM (``pip install 'grpo-tui[vllm]'``)."""
    executable = settings.vllm_executable
    if not settings.vllm_preimport:
        return executable, False
    if len(executable) == 3 and executable[1:] == ["-m", VLLM_CLI_MODULE]:
        return [executable[0], "-m", VLLM_LAUNCH_MODULE], True
    if executable == ["vllm"] and importlib.util.find_spec("vllm") is not None:
        return [sys.executable, "-m", VLLM_LAUNCH_MODULE], True
    return executable, False


def _vllm_command(
    settings: InferenceSettings, *, mode: str, model: str, adapter: str | None
) -> InferenceLaunch:
    """``vllm serve`` with the flags of ``started_with(settings, mode)``.

    In-place modes: dev mode (``/pause``, ``/collective_rpc`` with ``reload_weights``,
    ``/reset_prefix_cache``, the weight-transfer routes), the worker extension and the
    NCCL weight-transfer config always (they cost nothing measurable at start); LoRA slots
    (two: the served adapter and the one replacing it) and sleep mode as the profile leaves
    them on. Restart modes: ``lora_restart`` its LoRA flags, ``none`` a plain server.
    """
    launcher, gated = _vllm_launcher(settings)
    argv = [
        *launcher,
        "serve",
        *_serve_flags(settings, mode=mode, model=model),
        "--logprobs-mode",
        "processed_logprobs",
    ]
    argv += _engine_flags(settings, VLLM_FLAGS)
    if in_place(mode, settings.none_reload):
        argv += ["--middleware", VLLM_LEASE]
    if not is_loopback(settings.host):
        argv += ["--middleware", VLLM_TOKEN_GUARD]
    env = vllm_start_env()
    capable = started_with(settings, mode)
    if "lora" in capable:
        argv += ["--enable-lora", "--max-lora-rank", str(settings.max_lora_rank)]
        if in_place(mode, settings.none_reload):
            argv += ["--max-loras", str(LORA_SLOTS)]
        if adapter is not None:
            argv += ["--lora-modules", f"{settings.served_model_name}={adapter}"]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache after an in-place reload
    if in_place(mode, settings.none_reload):
        # Sleep level 2 frees weights and KV cache while the trainer steps (colocate);
        # between ``/wake_up?tags=weights`` and ``?tags=kv_cache`` the worker extension opens
        # the trainer's tensors by CUDA IPC and loads them (``grpo_load_weights``).
        if "sleep" in capable:
            argv.append("--enable-sleep-mode")
        argv += [
            "--worker-extension-cls",
            VLLM_WORKER_EXTENSION,
            "--weight-transfer-config",
            json.dumps({"backend": "nccl"}),
        ]
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return InferenceLaunch(argv=[*argv, *settings.extra_args], env=env, gated=gated)


SGLANG_REFUSED: dict[str, str] = {
    "shared_vllm": (
        "the SGLang backend has no shared-weights path here: SGLang's closest equivalent "
        "(/init_weights_update_group + /update_weights_from_distributed, an NCCL broadcast "
        "from the trainer) is not wired into the trainer yet; use mode none (weights "
        "reloaded in place through /update_weights_from_disk, no restart) or a LoRA mode"
    ),
    "colocate": (
        "the SGLang backend does not run colocate here (SGLang's sleep/wake is "
        "/release_memory_occupation + /update_weights_from_tensor, not wired in yet); use "
        "mode none or a LoRA mode"
    ),
}
"""Modes the SGLang backend refuses at ``grpo-tui check`` time, with the reason."""


def _sglang_command(
    settings: InferenceSettings, *, mode: str, model: str, adapter: str | None
) -> InferenceLaunch:
    """``python -m sglang.launch_server`` with SGLang's flag names.

    Metrics on (``/metrics``) for the dashboard; with LoRA slots (``lora_only``, and
    ``none`` unless ``enable_lora`` is off, so a switch between them keeps the server)
    runtime adapter loading (``/load_lora_adapter``) on every module and, after a
    ``lora_restart`` restart, the adapter preloaded under the served name
    (``--lora-paths NAME=PATH``).
    """
    if mode in SGLANG_REFUSED:
        raise ValueError(f"backend sglang cannot run mode {mode!r}: {SGLANG_REFUSED[mode]}")
    argv = [
        *_sglang_launcher(settings),
        "--model-path",
        model,
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--served-model-name",
        settings.base_model_name(mode),
        "--dtype",
        settings.dtype,
        "--random-seed",
        str(settings.seed),
        "--enable-metrics",
    ]
    argv += _engine_flags(settings, SGLANG_FLAGS)
    if "lora" in started_with(settings, mode):
        argv += ["--enable-lora", "--max-lora-rank", str(settings.max_lora_rank)]
        argv += ["--lora-target-modules", "all"]
        if adapter is not None:
            argv += ["--lora-paths", f"{settings.served_model_name}={adapter}"]
    return InferenceLaunch(argv=[*argv, *settings.extra_args], env={})


def _sglang_launcher(settings: InferenceSettings) -> list[str]:
    """``sglang_executable``; beyond loopback, the same Python running our launcher, which
    hands SGLang ``--api-key`` from the environment instead of the command line."""
    executable = settings.sglang_executable
    if is_loopback(settings.host):
        return executable
    if executable[-2:] != ["-m", SGLANG_MODULE]:
        raise ValueError(
            f"SGLang on {settings.host} needs the run's token, which it reads only as "
            f"--api-key; to keep it off the command line grpo-tui starts it through "
            f"{SGLANG_TOKEN_LAUNCH}, so sglang_executable must end with "
            f"'-m {SGLANG_MODULE}' (got {executable})"
        )
    return [*executable[:-1], SGLANG_TOKEN_LAUNCH]
