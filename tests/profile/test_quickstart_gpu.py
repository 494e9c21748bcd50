"""profiles/quickstart-gpu.toml: vLLM on GPU 0 beside the trainer, a tiny model with
64-wide attention heads, every mode; and the ``[run.tiny]`` shape it relies on."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_tui.cli import app
from grpo_tui.plan.profile import ProfileError, load_profile
from grpo_tui.plan.roles import build_plan

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles/quickstart-gpu.toml"
MODES = ("none", "shared_vllm", "lora_only", "lora_restart", "colocate")


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.mark.parametrize("mode", MODES)
def test_checks_in_every_mode_on_gpu_0_with_vllm(mode: str) -> None:
    result = CliRunner().invoke(app, ["check", str(PROFILE), "--mode", mode, "--profile-only"])
    assert result.exit_code == 0, result.output
    assert f"mode={mode}" in result.output
    assert "gpus      trainer [0]; inference [0]" in result.output


def test_plan_builds_a_head_dim_64_model_that_vllm_serves(tmp_path: Path) -> None:
    specs = {s.name: s for s in build_plan(load_profile(PROFILE), tmp_path).specs}
    build = specs["model"].command
    hidden = 64  # the builder's default, which the profile keeps
    assert hidden // int(flag(build, "--num-heads")) == 64
    assert flag(build, "--num-kv-heads") == "1"
    inference, trainer = specs["inference"], specs["trainer"]
    assert "serve" in inference.command and str(tmp_path / "model") in inference.command
    assert flag(inference.command, "--dtype") == flag(trainer.command, "--dtype") == "bfloat16"
    assert flag(trainer.command, "--device") == "cuda"
    for spec in (inference, trainer):
        assert spec.env["CUDA_VISIBLE_DEVICES"] == "0"
        assert spec.env["NCCL_NVLS_ENABLE"] == "0"


def test_tiny_shape_flags_only_for_keys_set(tmp_path: Path) -> None:
    quickstart = build_plan(load_profile(REPO / "profiles/quickstart.toml"), tmp_path)
    build = next(s for s in quickstart.specs if s.name == "model").command
    assert build[-2:] == ["--seed", "0"]  # default shape: the builder's own defaults


def _profile(tmp_path: Path, run: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(textwrap.dedent(run) + "\n[api]\n[trainer]\n")
    return path


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ('[run]\nmodel = "org/m"\n[run.tiny]\nnum_layers = 3\n', 'model = "tiny" only'),
        ("[run.tiny]\nhidden_size = 60\nnum_heads = 8\n", "not a multiple of num_heads"),
        ("[run.tiny]\nnum_heads = 4\nnum_kv_heads = 3\n", "not a multiple of num_kv_heads"),
        ("[run.tiny]\nheads = 4\n", "run.tiny.heads"),
    ],
)
def test_bad_tiny_shape_names_the_key(tmp_path: Path, run: str, expected: str) -> None:
    with pytest.raises(ProfileError) as caught:
        load_profile(_profile(tmp_path, run))
    text = str(caught.value)
    assert expected in text and "run" in text
