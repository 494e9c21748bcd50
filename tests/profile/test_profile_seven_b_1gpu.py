"""profiles/qwen2.5-7b-1gpu.toml: the 7B shape with trainer and vLLM on GPU 0 (issue 40).

It passes ``check --profile-only`` in the three modes it is measured in, builds the model
in bf16, shares the weights zero-copy in ``shared_vllm``, and carries the memory settings
its header argues for (no checkpointing, fused AdamW, a fixed 4 GiB KV cache).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_tui.cli import app
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles/qwen2.5-7b-1gpu.toml"


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.mark.parametrize("mode", ["shared_vllm", "colocate", "lora_only"])
def test_checks_in_each_measured_mode_on_gpu_0(mode: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["check", str(PROFILE), "--mode", mode, "--profile-only"])
    assert result.exit_code == 0, result.output
    assert f"mode={mode}" in result.output
    assert "gpus      trainer [0]; inference [0]" in result.output
    assert f"--weight-bridge-mode {mode}" in result.output


def test_the_plan_builds_the_7b_shape_in_bf16_and_shares_it_on_one_gpu(tmp_path: Path) -> None:
    specs = {s.name: s for s in build_plan(load_profile(PROFILE), tmp_path).specs}
    build = specs["model"].command
    shape = {k: flag(build, f"--{k}") for k in ("hidden-size", "num-layers", "num-heads")}
    assert shape == {"hidden-size": "3584", "num-layers": "28", "num-heads": "28"}
    assert (flag(build, "--num-kv-heads"), flag(build, "--intermediate-size")) == ("4", "18944")
    assert flag(build, "--dtype") == "bfloat16"
    inference, trainer = specs["inference"].command, specs["trainer"].command
    assert flag(inference, "--kv-cache-memory-bytes") == str(4 << 30)
    assert "--enforce-eager" in inference
    assert flag(trainer, "--dtype") == "bfloat16" and flag(trainer, "--optimizer-impl") == "fused"
    assert "--gradient-checkpointing" not in trainer
    assert flag(trainer, "--batch-size") == "128"  # 16 prompts x group 8, one micro-batch
    assert flag(specs["api"].command, "--max-batches-offpolicy") == "0"
    for role in ("inference", "trainer"):
        assert specs[role].env["CUDA_VISIBLE_DEVICES"] == "0"
        assert specs[role].env["NCCL_NVLS_ENABLE"] == "0"


def test_parameter_count_matches_the_header() -> None:
    """6.53 B parameters: the header's memory arithmetic rests on it."""
    from grpo_trainer.train.memory_fit import param_count

    tiny = load_profile(PROFILE).run.tiny
    config = {
        "hidden_size": tiny.hidden_size, "num_hidden_layers": tiny.num_layers,
        "vocab_size": 44, "num_attention_heads": tiny.num_heads,
        "num_key_value_heads": tiny.num_kv_heads, "intermediate_size": tiny.intermediate_size,
        "model_type": "qwen2", "tie_word_embeddings": True,
    }  # fmt: skip
    assert round(param_count(config) / 1e9, 2) == 6.53
