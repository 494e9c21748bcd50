"""The trainer-beside-vLLM memory arithmetic: parameter counts from ``config.json``, the
static ``grpo-tui check`` refusal with its numbers, the start-up message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, Qwen2Config
from typer.testing import CliRunner

from grpo_trainer.train.memory_fit import (
    fit_problem,
    footprint,
    param_count,
    read_model_config,
    startup_problem,
)
from grpo_tui.cli import app

REPO = Path(__file__).resolve().parents[2]
QWEN25_3B = {
    "model_type": "qwen2",
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
"""Qwen2.5-3B's shape: 3,085,938,688 parameters as published."""


@pytest.mark.parametrize("tied", [True, False])
def test_param_count_equals_a_real_models_numel(tied: bool) -> None:
    config = Qwen2Config(
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=300,
        tie_word_embeddings=tied,
    )
    model = AutoModelForCausalLM.from_config(config)
    assert param_count(config.to_dict()) == sum(p.numel() for p in model.parameters())
    assert param_count(QWEN25_3B) == 3_085_938_688


def test_fit_arithmetic_and_message_name_the_numbers() -> None:
    params = param_count(QWEN25_3B)
    own = footprint("colocate", params, "bfloat16", "adamw", "vllm")
    views = footprint("shared_vllm", params, "bfloat16", "adamw", "vllm")
    assert own is not None and views is not None
    assert own.total == params * 6 and views.total == params * 4  # bf16 weights; 2 moments
    assert footprint("colocate", params, "bfloat16", "adamw", "builtin") is None
    assert footprint("lora_only", params, "bfloat16", "adamw", "vllm") is None
    # 18.5 GB beside vLLM's 0.9 of an 80 GB card (8 GB left): refused, with the way out
    message = fit_problem(own, total_gb=80, utilization=0.9)
    assert message is not None
    assert "3.09e+09 params x (2 B weights + 4 B adamw state) = 18.5 GB" in message
    assert "gpu_memory_utilization 0.9 of 80 GB leaves 8.0 GB" in message
    assert "gpu_memory_utilization <= 0.76" in message
    assert fit_problem(own, total_gb=80, utilization=0.76) is None
    low = startup_problem(own, free_bytes=10 * 10**9, total_bytes=80 * 10**9)
    assert low is not None and "(12.3 GB) is still to be allocated but only 10.0 GB" in low
    assert startup_problem(own, free_bytes=13 * 10**9, total_bytes=80 * 10**9) is None


def test_fsdp2_ranks_keep_float32_master_shards_per_gpu() -> None:
    """N ranks on N GPUs keep float32 masters and their AdamW state, 1/N on each GPU: the
    3B shape in colocate needs 12 B / 2 = 6 B per parameter per GPU, not bf16's 6 B whole."""
    params = param_count(QWEN25_3B)
    one = footprint("colocate", params, "bfloat16", "adamw", "vllm")
    two = footprint("colocate", params, "bfloat16", "adamw", "vllm", shards=2)
    assert one is not None and two is not None
    assert two.weight_bytes == params * 4 // 2 and two.optimizer_bytes == params * 8 // 2
    assert two.total == one.total  # 12 B / 2 ranks = 6 B, as 2 + 4 B on one GPU
    eight = footprint("colocate", params, "bfloat16", "adamw", "vllm", shards=8)
    assert eight is not None and eight.total * 8 == params * 12
    message = fit_problem(eight, total_gb=80, utilization=0.9)
    assert message is None  # 4.6 GB per GPU fits in the 8 GB left
    refused = fit_problem(two, total_gb=80, utilization=0.9)
    assert refused is not None and "/ 2 ranks (float32 masters) = 18.5 GB on the GPU" in refused
    # a sharded shared_vllm trainer owns its master shards (no views of vLLM's weights)
    shared = footprint("shared_vllm", params, "bfloat16", "adamw", "vllm", shards=2)
    assert shared is not None and shared.own_weights and shared.total == two.total


def test_check_refuses_a_model_that_cannot_fit_beside_vllm(tmp_path: Path) -> None:
    model = tmp_path / "qwen25-3b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_3B))
    assert read_model_config(str(model)) == QWEN25_3B
    profile = REPO / "profiles/gsm8k-qwen2.5-3b-shared.toml"
    text = (
        profile.read_text()
        .replace('mode = "shared_vllm"', 'mode = "colocate"')
        .replace('"Qwen/Qwen2.5-3B-Instruct"', json.dumps(str(model)))
        .replace(
            "gpu_memory_utilization = 0.45", "gpu_memory_utilization = 0.9\ngpu_memory_gb = 80"
        )
        .replace('weight_transfer = "cuda_ipc"', "")
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    refused = CliRunner().invoke(app, ["check", str(bad), "--profile-only"])
    assert refused.exit_code == 2, refused.output
    output = " ".join(refused.output.split())
    assert "inference.gpu_memory_utilization" in output
    assert "= 18.5 GB on the GPU while vLLM generates" in output
    # the same model fits beside a smaller share; shared_vllm keeps no own weights
    (tmp_path / "ok.toml").write_text(text.replace("= 0.9\n", "= 0.7\n"))
    assert (
        CliRunner().invoke(app, ["check", str(tmp_path / "ok.toml"), "--profile-only"]).exit_code
        == 0
    )
    (tmp_path / "shared.toml").write_text(text.replace('"colocate"', '"shared_vllm"'))
    shared = CliRunner().invoke(app, ["check", str(tmp_path / "shared.toml"), "--profile-only"])
    assert shared.exit_code == 2 and "= 12.3 GB" in " ".join(shared.output.split())
