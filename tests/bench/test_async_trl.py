"""benchmarks/async_trl.py without a GPU: the attention semantics TRL's prefix tree needs
(the reference the GPU kernel is checked against), the workload's chat prompts, and the
settings AsyncGRPOTrainer gets."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import async_trl  # noqa: E402
from workload_task import PROMPT_CHARS, trl_reward  # noqa: E402

from grpo_trainer.models import build_tiny_tokenizer  # noqa: E402


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal attention over one whole sequence ([T, H, D], grouped heads repeated)."""
    repeat = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(repeat, 1).transpose(0, 1),
        v.repeat_interleave(repeat, 1).transpose(0, 1), is_causal=True,
    ).transpose(0, 1)  # fmt: skip


def test_tree_segments_attend_as_each_whole_sequence_does() -> None:
    """Two completions sharing a 5-token prompt, packed as TRL packs them (the prompt once,
    each branch attending to its root-to-branch path): every token's output equals plain
    causal attention over its own whole sequence."""
    g = torch.Generator().manual_seed(0)
    prompt, a, b = (torch.randn(n, 3, 2, 16, generator=g) for n in (5, 3, 4))  # q, k, v
    packed = torch.cat([prompt, a, b])  # [12, 3, H, D]: prompt, branch a, branch b
    kv_index = [*range(5), *range(5), 5, 6, 7, *range(5), 8, 9, 10, 11]  # each segment path
    q = packed[:, 0, :, :]
    q = torch.cat([q, q], 1)  # 4 query heads on 2 kv heads
    k, v = packed[kv_index, 1], packed[kv_index, 2]
    out = async_trl.reference_attention(q, k, v, [0, 5, 8, 12], [0, 5, 13, 22])
    for rows, branch in ((slice(5, 8), a), (slice(8, 12), b)):
        whole = torch.cat([prompt, branch])
        wq = torch.cat([whole[:, 0], whole[:, 0]], 1)
        expected = causal(wq, whole[:, 1], whole[:, 2])
        assert torch.allclose(out[rows], expected[5:], atol=1e-6)
        assert torch.allclose(out[:5], expected[:5], atol=1e-6)


def test_chat_prompts_stay_the_workloads_token_count_and_rewards_read_messages() -> None:
    tokenizer = build_tiny_tokenizer(vocab_size=151936)
    tokenizer.chat_template = async_trl.CHAT_TEMPLATE
    args = argparse.Namespace(prompt_len=PROMPT_CHARS)
    for messages in async_trl.chat_prompts(args, 3):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert len(ids) == PROMPT_CHARS
    assert trl_reward([[{"role": "assistant", "content": "a1b2"}], "xx99"]) == [0.5, 0.5]


def test_async_trainer_gets_our_batch_and_staleness() -> None:
    args = argparse.Namespace(
        out="/tmp/t.json", prompts=64, group_size=8, micro_batch=32, completion_len=256,
        lr=1e-6, clip_eps=0.2, steps=11, server_url="http://127.0.0.1:9", max_staleness=1,
    )  # fmt: skip
    config = async_trl.async_config(args)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (32, 16)
    assert (config.max_staleness, config.token_budget, config.max_steps) == (1, 0, 11)
    assert not config.gradient_checkpointing and config.model_init_kwargs["dtype"] == "bfloat16"
