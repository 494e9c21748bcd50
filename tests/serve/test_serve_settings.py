"""``inference_command``: the vLLM and built-in command lines and environment for each mode.

The in-place modes (``none``, ``shared_vllm``, ``colocate``, ``lora_only``) share one server
with every capability the profile leaves on; the restart modes start their own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from grpo_trainer.serve.__main__ import build_parser, torch_threads
from grpo_trainer.serve.capabilities import switch_restarts_inference
from grpo_trainer.serve.command_lines import (
    VLLM_LAUNCH_MODULE,
    VLLM_WORKER_EXTENSION,
    inference_command,
    vllm_start_env,
)
from grpo_trainer.serve.settings import InferenceSettings

MODES = ("none", "lora_only", "lora_restart", "shared_vllm", "colocate")
IN_PLACE = ("none", "lora_only", "shared_vllm", "colocate")


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("mode", MODES)
def test_vllm_every_mode_is_plain_vllm_serve_on_loopback(mode: str) -> None:
    settings = InferenceSettings(backend="vllm", port=9100, dtype="bfloat16")
    launch = inference_command(settings, mode=mode, model="Qwen/Qwen3-0.6B")
    argv = launch.argv
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-0.6B"]
    assert flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--port") == "9100"
    assert flag(argv, "--dtype") == "bfloat16"
    assert flag(argv, "--logprobs-mode") == "processed_logprobs"
    assert "--device" not in argv


def test_vllm_full_modes_serve_the_stable_name() -> None:
    settings = InferenceSettings(backend="vllm", none_reload="restart")
    launch = inference_command(settings, mode="none", model="M")
    assert flag(launch.argv, "--served-model-name") == "policy"
    assert "--enable-lora" not in launch.argv
    assert launch.env == vllm_start_env()
    in_place = inference_command(InferenceSettings(backend="vllm"), mode="none", model="M")
    assert flag(in_place.argv, "--served-model-name") == "policy"


@pytest.mark.parametrize("backend", ["vllm", "builtin"])
def test_the_in_place_modes_share_one_server_with_every_capability(backend: str) -> None:
    """A switch among them keeps the server: the same command whatever the mode but the
    base model's name (``<name>-base`` when started in lora_only). On vLLM with NCCL
    weight transfer: CUDA IPC sharing leaves sleep mode to colocate (below)."""
    transfer = {"weight_transfer": "nccl"} if backend == "vllm" else {}
    settings = InferenceSettings(backend=backend, max_lora_rank=8, **transfer)

    def launch(mode: str, **changes: object) -> tuple[list[str], dict[str, str]]:
        argv = inference_command(
            settings.model_copy(update=changes), mode=mode, model="M", shared_dir="/s"
        )
        named = argv.argv.index("--served-model-name")
        return argv.argv[:named] + argv.argv[named + 2 :], argv.env

    commands = {mode: launch(mode) for mode in IN_PLACE}
    assert len({(tuple(a), tuple(sorted(e.items()))) for a, e in commands.values()}) == 1
    argv, env = commands["none"]
    assert "--enable-lora" in argv and flag(argv, "--max-lora-rank") == "8"
    assert "--enable-sleep-mode" in argv
    if backend == "vllm":
        assert flag(argv, "--max-loras") == "2"
        assert flag(argv, "--worker-extension-cls") == VLLM_WORKER_EXTENSION
        assert json.loads(flag(argv, "--weight-transfer-config")) == {"backend": "nccl"}
        lora_on = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1"}
        assert env == {**vllm_start_env(), **lora_on}
    else:
        assert flag(argv, "--shared-weights") == "/s"
    if backend == "vllm":  # CUDA IPC cannot share weights held by sleep mode's allocator
        ipc = settings.model_copy(update={"weight_transfer": "cuda_ipc"})
        for mode in IN_PLACE:
            argv = inference_command(ipc, mode=mode, model="M").argv
            assert "--enable-lora" in argv
            assert ("--enable-sleep-mode" in argv) == (mode == "colocate"), mode
    # a capability turned off: its flags go, but for the modes that need them
    argv, env = launch("shared_vllm", enable_lora=False, enable_sleep_mode=False)
    assert "--enable-lora" not in argv and "--enable-sleep-mode" not in argv
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env
    argv, _ = launch("lora_only", enable_lora=False, enable_sleep_mode=False)
    assert "--enable-lora" in argv and "--enable-sleep-mode" not in argv
    argv, _ = launch("colocate", enable_lora=False, enable_sleep_mode=False)
    assert "--enable-lora" not in argv and "--enable-sleep-mode" in argv
    # the restart modes keep their own flags: lora_restart no sleep mode, none nothing
    argv, _ = launch("lora_restart")
    assert "--enable-lora" in argv and "--enable-sleep-mode" not in argv
    argv, _ = launch("none", none_reload="restart")
    assert "--enable-lora" not in argv and "--shared-weights" not in argv


def test_which_switch_restarts_inference_and_why() -> None:
    every = InferenceSettings(backend="vllm", weight_transfer="nccl")
    for old in IN_PLACE:
        for new in IN_PLACE:
            assert switch_restarts_inference(every, old, new) is None, (old, new)
    assert "lora_restart" in str(switch_restarts_inference(every, "lora_only", "lora_restart"))
    restart = every.model_copy(update={"none_reload": "restart"})
    assert "none reloads weights by restarting" in str(
        switch_restarts_inference(restart, "shared_vllm", "none")
    )
    no_lora = every.model_copy(update={"enable_lora": False})
    why = switch_restarts_inference(no_lora, "shared_vllm", "lora_only")
    assert why == (
        "mode lora_only's server has lora and sleep, mode shared_vllm's sleep "
        "(inference.enable_lora = false)"
    )
    assert switch_restarts_inference(no_lora, "shared_vllm", "colocate") is None
    assert switch_restarts_inference(no_lora, "lora_only", "lora_only") is None
    # a server keeps its capabilities through in-place switches: back restarts too
    assert switch_restarts_inference(no_lora, "lora_only", "none") is not None
    # CUDA IPC (vLLM's default weight transfer): only colocate's server sleeps
    ipc = InferenceSettings(backend="vllm")
    for old in IN_PLACE:
        for new in IN_PLACE:
            moves = switch_restarts_inference(ipc, old, new)
            assert (moves is None) == ((old == "colocate") == (new == "colocate")), (old, new)
    assert "cannot share weights through CUDA IPC" in str(
        switch_restarts_inference(ipc, "colocate", "shared_vllm")
    )
    replicas = InferenceSettings(data_parallel_size=2)
    assert "data_parallel_size" in str(switch_restarts_inference(replicas, "colocate", "none"))


@pytest.mark.parametrize("mode", ["lora_only", "lora_restart"])
def test_vllm_lora_modes(mode: str) -> None:
    settings = InferenceSettings(backend="vllm", max_lora_rank=32, served_model_name="pol")
    bare = inference_command(settings, mode=mode, model="M")
    assert flag(bare.argv, "--served-model-name") == "pol-base"
    assert flag(bare.argv, "--max-lora-rank") == "32"
    assert "--enable-lora" in bare.argv
    assert "--lora-modules" not in bare.argv
    assert bare.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    preloaded = inference_command(settings, mode=mode, model="M", adapter="/ck/adapter_step_3")
    assert flag(preloaded.argv, "--lora-modules") == "pol=/ck/adapter_step_3"


def test_vllm_shared_mode_uses_dev_mode_and_the_worker_extension() -> None:
    settings = InferenceSettings(
        backend="vllm",
        gpu_memory_utilization=0.3,
        max_model_len=2048,
        enforce_eager=True,
        gpus=[1, 2],
        tensor_parallel_size=2,
        vllm_executable=["python3", "-m", "vllm.entrypoints.cli.main"],
        extra_args=["--max-num-seqs", "64"],
    )
    launch = inference_command(settings, mode="shared_vllm", model="M")
    argv = launch.argv
    assert argv[:4] == ["python3", "-m", VLLM_LAUNCH_MODULE, "serve"]  # vllm_preimport
    assert flag(argv, "--worker-extension-cls") == VLLM_WORKER_EXTENSION
    assert json.loads(flag(argv, "--weight-transfer-config")) == {"backend": "nccl"}
    assert flag(argv, "--gpu-memory-utilization") == "0.3"
    assert flag(argv, "--max-model-len") == "2048"
    assert "--enforce-eager" in argv
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert "--data-parallel-size" not in argv  # 1 is vLLM's default: the flag stays out
    assert argv[-2:] == ["--max-num-seqs", "64"]
    # the GPUs become CUDA_VISIBLE_DEVICES in the role layer's launcher, not here
    lora_on = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1"}
    assert launch.env == {**vllm_start_env(), **lora_on}


def test_vllm_colocate_sleeps_and_takes_weights_by_ipc() -> None:
    """vLLM 0.24's sleep takes the weights too: the trainer's own go in by CUDA IPC through
    the worker extension (vLLM's ``ipc`` transfer imports ray, which vLLM does not need)."""
    launch = inference_command(
        InferenceSettings(backend="vllm", gpu_memory_utilization=0.4), mode="colocate", model="M"
    )
    assert "--enable-sleep-mode" in launch.argv
    assert flag(launch.argv, "--worker-extension-cls") == VLLM_WORKER_EXTENSION
    lora_on = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1"}
    assert launch.env == {**vllm_start_env(), **lora_on}


def test_worker_extension_path_names_a_real_class() -> None:
    module, _, name = VLLM_WORKER_EXTENSION.rpartition(".")
    code = f"import {module} as m, sys; sys.exit(0 if hasattr(m, {name!r}) else 1)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("mode", MODES)
def test_builtin_argv_parses_with_the_servers_own_parser(mode: str) -> None:
    settings = InferenceSettings(port=9200, device="cuda:0", max_model_len=128)
    adapter = "/ck/a" if mode.startswith("lora") else None
    launch = inference_command(
        settings, mode=mode, model="/m", adapter=adapter, shared_dir="/run/shared"
    )
    assert launch.argv[1:3] == ["-m", "grpo_trainer.serve"]
    args = build_parser().parse_args(launch.argv[3:])
    assert (args.model, args.host, args.port, args.device) == ("/m", "127.0.0.1", 9200, "cuda:0")
    assert args.max_model_len == 128
    assert args.enable_lora  # lora modes need it, the in-place ones have every capability
    assert args.lora_modules == ([("policy", "/ck/a")] if adapter else [])
    assert (args.shared_weights is not None) == (mode in IN_PLACE)
    assert args.enable_sleep_mode == (mode in IN_PLACE)
    expected = "policy-base" if mode.startswith("lora") else "policy"
    assert args.served_model_name == expected


def test_bad_settings_are_refused_with_the_reason() -> None:
    with pytest.raises(ValidationError, match="backend"):
        InferenceSettings(backend="tgi")
    with pytest.raises(ValidationError, match="gpu_memory"):
        InferenceSettings(gpu_memory_utilization=1.5)
    with pytest.raises(ValidationError, match="unknown_key"):
        InferenceSettings(unknown_key=1)
    with pytest.raises(ValueError, match="unknown weight-sync mode"):
        inference_command(InferenceSettings(), mode="nccl", model="M")
    with pytest.raises(ValueError, match="only served in LoRA modes"):
        inference_command(InferenceSettings(), mode="none", model="M", adapter="/a")
    with pytest.raises(ValueError, match="shared_dir"):
        inference_command(InferenceSettings(), mode="shared_vllm", model="M")


def test_settings_module_is_torch_free() -> None:
    code = (
        "import sys, grpo_trainer.serve.settings; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_builtin_cpu_threads_default_to_one_on_cpu_only() -> None:
    def threads(**fields: object) -> int | None:
        launch = inference_command(InferenceSettings(**fields), mode="none", model="/m")
        return build_parser().parse_args(launch.argv[3:]).cpu_threads

    assert threads() == 1, "CPU: one thread unless set (the stack shares few cores)"
    assert threads(cpu_threads=3) == 3
    assert threads(cpu_threads=0) == 0, "0 asks for torch's own default"
    assert threads(device="cuda") is None, "GPU: torch's default, no flag"
    assert threads(device="cuda:1", cpu_threads=2) == 2
    assert torch_threads(None, "cpu") == 1 and torch_threads(None, "cuda:0") is None
    assert torch_threads(0, "cpu") is None and torch_threads(4, "cuda") == 4
    with pytest.raises(SystemExit):
        build_parser().parse_args(["/m", "--cpu-threads", "-1"])


def test_cpu_threads_are_refused_for_vllm() -> None:
    with pytest.raises(ValidationError, match="cpu_threads is a built-in backend setting"):
        InferenceSettings(backend="vllm", cpu_threads=1)
    launch = inference_command(InferenceSettings(backend="vllm"), mode="none", model="M")
    assert "--cpu-threads" not in launch.argv
