"""The processed sampling distribution and the logprobs reported for it.

Convention (the same as vLLM's ``--logprobs-mode processed_logprobs``): the logits are
divided by the temperature, then top-k, then top-p keep a subset of tokens; the sampled
token's logprob is its log-probability under that processed distribution. With top-k and
top-p off this is exactly ``log_softmax(logits / T)``, the trainer's formula, so the
server's logprobs and the trainer's recomputation agree to float rounding. Temperature 0
means greedy decoding, reported under ``log_softmax(logits)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample the completions of one prompt."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    top_logprobs: int = 0


def processed_logprobs(
    logits: torch.Tensor, *, temperature: float, top_k: int = -1, top_p: float = 1.0
) -> torch.Tensor:
    """Log-probabilities of the distribution sampled from: ``logits / T``, top-k, top-p.

    ``logits`` is ``[batch, vocab]``; tokens outside top-k / top-p get ``-inf``.
    """
    scaled = logits.float()
    if temperature > 0:
        scaled = scaled / temperature
    if top_k > 0 and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def sample_next(
    logprobs: torch.Tensor, *, greedy: bool, generator: torch.Generator | None
) -> torch.Tensor:
    """One token id per row of ``logprobs``: argmax when greedy, else a draw."""
    if greedy:
        return torch.argmax(logprobs, dim=-1)
    return torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
