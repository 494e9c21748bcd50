"""How our vLLM servers start: the launcher that imports vLLM before the start gate, a
forked engine core and a persistent cache root (``settings.vllm_start_env``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grpo_trainer.serve import command_lines
from grpo_trainer.serve.command_lines import VLLM_LAUNCH_MODULE, inference_command, vllm_start_env
from grpo_trainer.serve.settings import InferenceSettings

CLI = ["python3", "-m", "vllm.entrypoints.cli.main"]


def test_start_env_forks_the_engine_core_and_keeps_vllm_s_cache_in_ours(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GRPO_TUI_CACHE", str(tmp_path))
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    assert vllm_start_env() == {
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
        "VLLM_WORKER_MULTIPROC_METHOD": "fork",
    }
    launch = inference_command(InferenceSettings(backend="vllm"), mode="none", model="M")
    assert launch.env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_a_variable_the_supervisor_s_environment_sets_is_left_to_it() -> None:
    mine = {"VLLM_CACHE_ROOT": "/fast/disk", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    assert vllm_start_env(mine) == {}
    assert set(vllm_start_env({"VLLM_CACHE_ROOT": "/x"})) == {"VLLM_WORKER_MULTIPROC_METHOD"}


def test_vllm_s_python_runs_our_launcher_which_reads_the_gate() -> None:
    launch = inference_command(
        InferenceSettings(backend="vllm", vllm_executable=CLI), mode="lora_only", model="M"
    )
    assert launch.argv[:5] == ["python3", "-m", VLLM_LAUNCH_MODULE, "serve", "M"]
    assert launch.gated


@pytest.mark.parametrize(
    "executable", [["vllm"], ["/opt/vllm/bin/vllm"], ["srun", "vllm"], ["py", "-m", "other"]]
)
def test_an_executable_we_cannot_name_the_python_of_runs_as_given(
    executable: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command_lines.importlib.util, "find_spec", lambda name: None)
    settings = InferenceSettings(backend="vllm", vllm_executable=executable)
    launch = inference_command(settings, mode="none", model="M")
    assert launch.argv[: len(executable) + 1] == [*executable, "serve"]
    assert not launch.gated


def test_plain_vllm_becomes_this_python_when_it_imports_vllm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(command_lines.importlib.util, "find_spec", lambda name: object())
    launch = inference_command(InferenceSettings(backend="vllm"), mode="none", model="M")
    assert launch.argv[:4] == [sys.executable, "-m", VLLM_LAUNCH_MODULE, "serve"]


def test_preimport_off_runs_the_cli_as_configured() -> None:
    settings = InferenceSettings(backend="vllm", vllm_executable=CLI, vllm_preimport=False)
    launch = inference_command(settings, mode="shared_vllm", model="M")
    assert launch.argv[:4] == [*CLI, "serve"] and not launch.gated
    assert launch.env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"  # a separate choice


def test_the_built_in_server_reads_the_gate() -> None:
    assert inference_command(InferenceSettings(), mode="none", model="M").gated
