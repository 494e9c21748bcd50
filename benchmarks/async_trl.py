"""TRL 1.16's ``AsyncGRPOTrainer`` on the GPU workload (``trl_workload.py --mode async``).

The trainer runs on this process's GPU; generation on a ``vllm serve`` that
``gpu_workload.py`` started on another GPU (``VLLM_SERVER_DEV_MODE=1``,
``--weight-transfer-config '{"backend": "nccl"}'``, the same KV cache and ``max-num-seqs``
as our server). TRL's own code runs unchanged except for three things this machine or the
workload forces, each said in the JSON record:

- **Attention kernel.** TRL packs a micro-batch as a prefix tree (a group's 8 completions
  share their prompt once) and runs it through FlashAttention-3 fetched from the Hugging
  Face hub at run time (``kernels-community/flash-attn3``); the device has no network.
  ``flash_attn_varlen`` below is the same varlen call on torch's own FlashAttention-2 kernel
  (``aten._flash_attention_forward``, with its backward), bottom-right causal as FA3 is.
- **Fixed-length completions.** TRL's rollout worker has no ``ignore_eos``; every system
  here generates exactly ``--completion-len`` tokens, so its ``/v1/completions`` payloads
  get ``ignore_eos`` (a subclass of the worker's loop, ``FixedLength``).
- **Prompts as chat.** The worker renders prompts with the chat template; the workload's
  tokenizer has none, so it gets one that writes the message content alone (the prompt
  stays exactly ``--prompt-len`` tokens).

Settings chosen to match ours (TRL's defaults in brackets): bf16 weights [float32],
no gradient checkpointing [on], ``token_budget = 0`` so every micro-batch holds exactly
``--micro-batch`` sequences and a step exactly prompts x group [max_model_len tokens per
micro-batch], ``max_staleness = 1`` [4], lr, clip and steps as ours.
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

import torch
from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def flash_attn_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float | None = None,
) -> torch.Tensor:
    """``flash_attn_varlen_func``'s call on torch's FlashAttention-2 (CUDA, differentiable).

    Queries ``[Tq, H, D]``, keys and values ``[Tk, Hkv, D]`` (grouped heads are repeated if
    the kernel refuses them), causal aligned to the end of each key sequence.
    """
    if softcap:
        raise ValueError("softcap is not supported by torch's flash attention")
    left, right = window_size

    def call(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten._flash_attention_forward(
            q, key, value, cu_seqlens_q.int(), cu_seqlens_k.int(), int(max_seqlen_q),
            int(max_seqlen_k), 0.0, causal, False, scale=softmax_scale,
            window_size_left=None if left < 0 else left,
            window_size_right=None if right < 0 else right,
        )  # fmt: skip
        return out[0]

    try:
        return call(k, v)
    except RuntimeError:
        if k.shape[1] == q.shape[1]:
            raise
        repeat = q.shape[1] // k.shape[1]
        return call(k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1))


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: list[int], cu_k: list[int]
) -> torch.Tensor:
    """Per-segment SDPA with a bottom-right causal mask: the check of ``flash_attn_varlen``."""
    outs = []
    repeat = q.shape[1] // k.shape[1]
    for (q0, q1), (k0, k1) in zip(itertools.pairwise(cu_q), itertools.pairwise(cu_k), strict=True):
        nq, nk = q1 - q0, k1 - k0
        allowed = torch.arange(nk, device=q.device)[None, :] <= (
            torch.arange(nq, device=q.device)[:, None] + nk - nq
        )
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(
                q[q0:q1].transpose(0, 1),
                k[k0:k1].repeat_interleave(repeat, 1).transpose(0, 1),
                v[k0:k1].repeat_interleave(repeat, 1).transpose(0, 1),
                attn_mask=allowed,
            ).transpose(0, 1)
        )
    return torch.cat(outs)


def check_kernel(device: str) -> float:
    """Largest difference of ``flash_attn_varlen`` against the reference on a small tree,
    in the output and in the gradients of queries, keys and values (TRL trains through it).
    """
    g = torch.Generator(device="cpu").manual_seed(0)
    cu_q, cu_k = [0, 5, 8, 12], [0, 5, 13, 17]  # a prompt, then two branches of it
    q = torch.randn(12, 4, 64, generator=g).to(device, torch.bfloat16)
    k, v = (torch.randn(17, 2, 64, generator=g).to(device, torch.bfloat16) for _ in range(2))
    weight = torch.randn(12, 4, 64, generator=g).to(device)
    tq, tk = (torch.tensor(c, device=device, dtype=torch.int32) for c in (cu_q, cu_k))
    diffs = []
    results = []
    for ours in (True, False):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        if ours:
            out = flash_attn_varlen(*inputs, tq, tk, 5, 8, causal=True).float()
        else:
            out = reference_attention(*(t.float() for t in inputs), cu_q, cu_k)
        (out * weight).sum().backward()
        results.append([out.detach(), *(t.grad.float() for t in inputs)])
    for got, want in zip(*results, strict=True):
        diffs.append(float((got - want).abs().max() / want.abs().max().clamp(min=1e-6)))
    return max(diffs)


class FixedLengthLoop(_AsyncRolloutLoop):
    """TRL's rollout loop (in its spawned child) with ``ignore_eos`` in every request."""

    async def _post(self, path: str, payload: dict, timeout: float, max_retries: int = 3) -> dict:
        if path == "/v1/completions":
            payload = {**payload, "ignore_eos": True}
        return await super()._post(path, payload, timeout, max_retries)


def async_config(args: argparse.Namespace) -> Any:
    """TRL's ``AsyncGRPOConfig`` for the workload (module docstring: what differs and why)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig
    from trl_workload import shared_settings

    return AsyncGRPOConfig(
        **shared_settings(args, torch.cuda.is_available()),
        model_init_kwargs={"dtype": "bfloat16"},
        vllm_server_base_url=args.server_url,
        vllm_server_timeout=300.0,
        token_budget=0,
        max_staleness=args.max_staleness,
    )


def chat_prompts(args: argparse.Namespace, count: int) -> list[list[dict[str, str]]]:
    """The workload's prompts as one user message each."""
    import random

    from workload_task import prompt_text

    rng = random.Random(0)
    return [[{"role": "user", "content": prompt_text(rng, args.prompt_len)}] for _ in range(count)]


def train_async(args: argparse.Namespace, record: dict[str, Any]) -> None:

    from datasets import Dataset
    from datasets.table import InMemoryTable
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOTrainer, packing
    from trl_workload import step_timer
    from workload_task import trl_reward

    record["attention"] = "torch FlashAttention-2 (aten._flash_attention_forward), for FA3"
    record["attention_check_max_diff"] = check_kernel("cuda")  # relative, output and grads
    if record["attention_check_max_diff"] > 0.05:
        raise RuntimeError(f"attention substitute is off: {record['attention_check_max_diff']}")
    packing._flash_attn = lambda: argparse.Namespace(flash_attn_varlen_func=flash_attn_varlen)
    prompts = chat_prompts(args, args.prompts * (args.steps + 2))
    dataset = Dataset(InMemoryTable.from_pydict({"prompt": prompts}), fingerprint="workload")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    record["prompt_tokens"] = sorted(
        {
            len(tokenizer.apply_chat_template(p, add_generation_prompt=True, return_dict=False))
            for p in prompts[:8]
        }
    )
    config = async_config(args)
    started = time.perf_counter()
    trainer = AsyncGRPOTrainer(
        model=args.model,
        reward_funcs=trl_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[step_timer(record, args.out)],
    )
    trainer.rollout_worker._loop_cls = FixedLengthLoop  # started by train(): ignore_eos
    record["config"] = {
        k: getattr(config, k)
        for k in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                  "max_completion_length", "epsilon", "max_staleness", "token_budget",
                  "gradient_checkpointing", "bf16", "max_inflight_tasks", "weight_sync_steps")
    }  # fmt: skip
    record["init_s"] = time.perf_counter() - started
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    record["peak_memory_gb"] = torch.cuda.max_memory_reserved() / 1e9
    record["status"] = "ok"
