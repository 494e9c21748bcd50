"""Per-token logprobs of the sampled tokens, without a full-vocabulary float32 tensor.

Temperature convention (the inference server's): ``logp = log_softmax(logits / T)`` at the
sampled token, with ``T`` per sequence. The naive way materialises float32 logits and
log-softmax for every position of the micro-batch (``B * L * V`` floats, twice, plus their
gradients). ``ChunkedTokenLogprobs`` instead takes the final hidden states and the output
projection, and computes the logits of ``chunk_size`` positions at a time, in forward and
again in backward, so that peak memory grows with ``chunk_size * V``, not ``B * L * V``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class TokenLogprobs:
    """Selected-token logprobs ``[B, L-1]`` and, when asked, the entropy at each position."""

    logprobs: Tensor
    entropy: Tensor | None


def _compute_dtype(tensor: Tensor) -> torch.dtype:
    """At least float32: bf16/fp16 logits are upcast per chunk, float64 stays float64."""
    return torch.promote_types(tensor.dtype, torch.float32)


class ChunkedTokenLogprobs(torch.autograd.Function):
    """``log_softmax(h @ W.T / T)[label]`` and entropy, chunk by chunk, recomputed in backward.

    Forward, for positions ``n`` with hidden ``h_n``, inverse temperature ``s_n`` and
    ``z_n = s_n * W h_n``: ``logp_n = z_n[y_n] - logsumexp(z_n)``, ``H_n = lse - sum(p z)``.
    Backward: ``dlogp/dz = onehot(y) - p`` and ``dH/dz = -p * (z - sum(p z))``; chain
    through ``s_n`` to ``h`` and ``W``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        inv_temp: Tensor,
        chunk_size: int,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        compute = _compute_dtype(hidden)
        logp = torch.empty(n, dtype=compute, device=hidden.device)
        entropy = torch.empty(n, dtype=compute, device=hidden.device)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            z = (hidden[start:end] @ weight.T).to(compute) * inv_temp[start:end, None]
            lse = torch.logsumexp(z, dim=-1)
            logp[start:end] = z.gather(1, labels[start:end, None]).squeeze(1) - lse
            p = torch.exp(z - lse[:, None])
            entropy[start:end] = lse - (p * z).sum(-1)
        ctx.save_for_backward(hidden, weight, labels, inv_temp)
        ctx.chunk_size = chunk_size
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, labels, inv_temp = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        compute = _compute_dtype(hidden)
        grad_weight = (
            torch.zeros(weight.shape, dtype=compute, device=weight.device)
            if ctx.needs_input_grad[1]
            else None
        )
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            end = min(start + ctx.chunk_size, hidden.shape[0])
            h = hidden[start:end]
            s = inv_temp[start:end, None]
            z = (h @ weight.T).to(compute) * s
            p = torch.softmax(z, dim=-1)
            grad_z = torch.zeros_like(z)
            if grad_logp is not None:
                grad_z -= p * grad_logp[start:end, None]
                grad_z.scatter_add_(1, labels[start:end, None], grad_logp[start:end, None])
            if grad_entropy is not None:
                mean_z = (p * z).sum(-1, keepdim=True)
                grad_z -= grad_entropy[start:end, None] * p * (z - mean_z)
            grad_logits = grad_z * s
            if grad_hidden is not None:
                grad_hidden[start:end] = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += grad_logits.T @ h.to(compute)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def output_projection(model: nn.Module) -> Tensor:
    """The LM head's weight ``[V, H]``; the chunked path needs a bias-free linear head."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise TypeError(
            f"chunked logprobs need a bias-free nn.Linear LM head, got {type(head).__name__}"
        )
    return head.weight


def chunked_token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperatures: Tensor,
    *,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> TokenLogprobs:
    """Logprobs of ``input_ids[:, 1:]`` under ``model``: memory-lean path.

    ``temperatures`` is ``[B]``. Runs the decoder for final hidden states, then the LM head
    chunk by chunk (see ``ChunkedTokenLogprobs``).
    """
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask)[0]
    batch, length = input_ids.shape
    flat_hidden = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    labels = input_ids[:, 1:].reshape(-1)
    inv_temp = (
        (1.0 / temperatures.to(_compute_dtype(hidden)))[:, None]
        .expand(batch, length - 1)
        .reshape(-1)
    )
    logp, entropy = ChunkedTokenLogprobs.apply(
        flat_hidden, output_projection(model), labels, inv_temp.contiguous(), chunk_size
    )
    shape = (batch, length - 1)
    return TokenLogprobs(logp.view(shape), entropy.view(shape) if with_entropy else None)


def naive_token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperatures: Tensor,
    *,
    with_entropy: bool = False,
) -> TokenLogprobs:
    """Reference path: full float32 ``log_softmax(logits / T)`` over the vocabulary."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    compute = _compute_dtype(logits)
    logp_all = torch.log_softmax(
        logits.to(compute) / temperatures.to(compute)[:, None, None], dim=-1
    )
    logp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return TokenLogprobs(logp, entropy)
