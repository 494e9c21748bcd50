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
    ``z_n = s_n * W h_n``: ``logp_n = z_n[y_n] - logsumexp(z_n)``, ``H_n = -sum(p log p)``.
    Backward, with ``q = log_softmax(z)``: ``dlogp/dz = onehot(y) - p`` and
    ``dH/dz = -p * (q + H)``; chain through ``s_n`` to ``h`` and ``W``. Temporaries are
    updated in place so a chunk costs about two ``chunk_size x V`` buffers.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        inv_temp: Tensor,
        chunk_size: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        compute = _compute_dtype(hidden)
        logp = torch.empty(n, dtype=compute, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=compute, device=hidden.device)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            q = _chunk_log_softmax(hidden[start:end], weight, inv_temp[start:end], compute)
            logp[start:end] = q.gather(1, labels[start:end, None]).squeeze(1)
            if with_entropy:
                entropy[start:end] = -(q.exp() * q).sum(-1)
        ctx.save_for_backward(hidden, weight, labels, inv_temp, entropy)
        ctx.chunk_size = chunk_size
        ctx.with_entropy = with_entropy
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, labels, inv_temp, entropy = ctx.saved_tensors
        compute = _compute_dtype(hidden)
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=compute, device=weight.device)
            if ctx.needs_input_grad[1]
            else None
        )
        if not ctx.with_entropy:
            grad_entropy = None
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            end = min(start + ctx.chunk_size, hidden.shape[0])
            h = hidden[start:end]
            s = inv_temp[start:end, None]
            grad = _chunk_log_softmax(h, weight, inv_temp[start:end], compute)
            p = grad.exp()
            if grad_entropy is not None:
                # grad = p * (-g_H * (q + H) - g_logp)
                grad.add_(entropy[start:end, None]).mul_(-grad_entropy[start:end, None])
            else:
                grad.zero_()
            if grad_logp is not None:
                g = grad_logp[start:end, None]
                grad.sub_(g).mul_(p)
                grad.scatter_add_(1, labels[start:end, None], g)
            else:
                grad.mul_(p)
            del p
            grad.mul_(s)
            if grad_hidden is not None:
                grad_hidden[start:end] = (grad.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(grad.T, h.to(compute))
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _chunk_log_softmax(
    hidden: Tensor, weight: Tensor, inv_temp: Tensor, compute: torch.dtype
) -> Tensor:
    """``log_softmax((hidden @ W.T) * inv_temp)`` for one chunk, in ``compute`` precision."""
    z = (hidden @ weight.T).to(compute)
    z.mul_(inv_temp[:, None])
    return z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))


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
    chunk_size: int = 256,
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
        flat_hidden,
        output_projection(model),
        labels,
        inv_temp.contiguous(),
        chunk_size,
        with_entropy,
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
