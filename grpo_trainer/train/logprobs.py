"""Per-token logprobs of the sampled tokens, without a full-vocabulary float32 tensor.

Temperature convention (the inference server's): ``logp = log_softmax(logits / T)`` at the
sampled token, with ``T`` per sequence. The naive way materialises float32 logits and
log-softmax for every position of the micro-batch (``B * L * V`` floats, several times,
plus their gradients). ``ChunkedTokenLogprobs`` instead takes the final hidden states and
the output projection and computes the logits one vocabulary slice at a time, in forward
and again in backward, each slice ``tokens x width`` with ``tokens * width ~ chunk_size *
V``: peak memory grows with ``chunk_size * V``, not ``B * L * V``, and every matmul runs
in the weight's dtype (tensor cores for bf16).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

# Slice widths above this are rounded up to a multiple of it: bf16 GEMM operands stay
# 16-byte aligned and fill whole tiles.
_WIDTH_ALIGN = 128


@dataclass
class TokenLogprobs:
    """Selected-token logprobs ``[B, L-1]`` and, when asked, the entropy at each position."""

    logprobs: Tensor
    entropy: Tensor | None


def _compute_dtype(tensor: Tensor) -> torch.dtype:
    """At least float32: bf16/fp16 logits are upcast per slice, float64 stays float64."""
    return torch.promote_types(tensor.dtype, torch.float32)


class ChunkedTokenLogprobs(torch.autograd.Function):
    """``log_softmax(h @ W.T * s)[label]`` and entropy by vocabulary slices, redone in backward.

    For position ``n`` with hidden ``h_n``, inverse temperature ``s_n`` and logits
    ``z_n = s_n * W h_n``: ``logp_n = z_n[y_n] - lse_n``, ``H_n = -sum(p q)`` with
    ``q = z_n - lse_n`` and ``p = exp(q)``. Forward computes each slice ``W[v0:v1]``'s own
    logsumexp (and entropy), combines them per position and keeps only ``lse`` for backward.
    Backward recomputes each slice with the same matmul call as forward (the same logits, so
    ``p`` agrees with forward's ``lse``), forms ``dz = s * (g_logp * (onehot(y) - p) - g_H * p *
    (q + H))`` in float32, then ``dW[v0:v1] = dz.T @ h`` as one matmul (the sum over all
    positions happens inside it: no ``V x H`` float32 buffer) and ``dh += dz @ W[v0:v1]``
    (``N x H``, accumulated in float32).
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
        s = inv_temp[:, None]
        width = _slice_width(hidden.shape[0], weight.shape[0], chunk_size)
        # Per slice k and position: -max of the scaled logits u, sum e^u, sum e^u * u.
        neg_shift, total, weighted = inv_temp.new_empty(3, -(-weight.shape[0] // width), len(s))
        label_logit = torch.zeros_like(inv_temp)
        neg_inv_temp = -inv_temp
        for k, (v0, v1, hit, cols) in enumerate(_vocab_slices(labels, weight.shape[0], width)):
            z = hidden @ weight[v0:v1].T
            label_logit = torch.where(hit, z.gather(1, cols).squeeze(1), label_logit)
            torch.mul(z.amax(-1), neg_inv_temp, out=neg_shift[k])
            u = torch.addcmul(neg_shift[k, :, None], s, z)
            e = u.exp() if with_entropy else u.exp_()
            torch.sum(e, -1, out=total[k])
            if with_entropy:
                torch.sum(e.mul_(u), -1, out=weighted[k])
        slice_lse = total.log() - neg_shift
        lse = torch.logsumexp(slice_lse, 0)
        logp = label_logit * inv_temp - lse
        entropy = inv_temp.new_empty(0)
        if with_entropy:
            # H = sum_k w_k * (H_k - d_k): slice entropy H_k, d_k = lse_k - lse, w_k = e^d_k
            slice_entropy = total.log() - weighted / total
            entropy = ((slice_entropy - slice_lse + lse) * (slice_lse - lse).exp()).sum(0)
        ctx.save_for_backward(hidden, weight, labels, inv_temp, lse, entropy)
        ctx.width = width
        ctx.with_entropy = with_entropy
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, labels, inv_temp, lse, entropy = ctx.saved_tensors
        if not ctx.with_entropy:
            grad_entropy = None
        s = inv_temp[:, None]
        neg_lse = -lse[:, None]
        g = (grad_logp if grad_logp is not None else torch.zeros_like(lse))[:, None]
        if grad_entropy is None:
            # dz = -s g * (p - onehot(y))
            scale = -s * g
            label_value = torch.full_like(lse, -1.0)
        else:
            # dz = p * (a + b q) + s g onehot(y)
            gh = grad_entropy[:, None]
            a = -s * (g + gh * entropy[:, None])
            b = -s * gh
            label_value = (s * g).squeeze(1)
        grad_hidden = torch.zeros_like(hidden, dtype=lse.dtype) if ctx.needs_input_grad[0] else None
        grad_weight = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
        for v0, v1, hit, cols in _vocab_slices(labels, weight.shape[0], ctx.width):
            w = weight[v0:v1]
            z = hidden @ w.T
            q = torch.addcmul(neg_lse, s, z)
            onehot = torch.where(hit, label_value, 0.0)[:, None]
            if grad_entropy is None:
                p = q.exp_()
                p.scatter_add_(1, cols, onehot)
                grad = torch.mul(p, scale, out=z)
            else:
                p = q.exp()
                p.mul_(torch.addcmul(a, b, q, out=q))
                p.scatter_add_(1, cols, onehot)
                grad = z.copy_(p)
            if grad_weight is not None:
                torch.mm(grad.T, hidden, out=grad_weight[v0:v1])
            if grad_hidden is not None:
                grad_hidden += grad @ w
        if grad_hidden is not None:
            grad_hidden = grad_hidden.to(hidden.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _slice_width(tokens: int, vocab: int, chunk_size: int) -> int:
    """Vocabulary rows per slice: ``tokens x width`` logits cost ``chunk_size`` full rows."""
    width = -(-chunk_size * vocab // max(tokens, 1))
    if width > _WIDTH_ALIGN:
        width = -(-width // _WIDTH_ALIGN) * _WIDTH_ALIGN
    return min(width, vocab)


def _vocab_slices(
    labels: Tensor, vocab: int, width: int
) -> Iterator[tuple[int, int, Tensor, Tensor]]:
    """``(v0, v1, hit, cols)`` per slice ``[v0, v1)`` of the vocabulary.

    ``hit[n]`` says whether ``labels[n]`` falls in the slice and ``cols[n, 0]`` is its column
    there; for the other positions ``cols`` is only clamped into range (their ``hit`` is False).
    """
    slice_of = torch.div(labels, width, rounding_mode="floor")
    cols = (labels - slice_of * width)[:, None]
    for k, v0 in enumerate(range(0, vocab, width)):
        v1 = min(v0 + width, vocab)
        yield v0, v1, slice_of == k, cols.clamp(max=v1 - v0 - 1)


def output_projection(model: nn.Module) -> Tensor:
    """The LM head's weight ``[V, H]``; the chunked path needs a bias-free linear head."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise TypeError(
            f"chunked logprobs need a bias-free nn.Linear LM head, got {type(head).__name__}"
        )
    return head.weight


def final_hidden_states(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The decoder's final (normed) hidden states ``[B, L, H]``, through the model's forward.

    Through the top-level forward (head on the last position only), not the bare decoder:
    an FSDP2-sharded model gathers its root parameters (embeddings, final norm, the tied
    head) in that forward and keeps them gathered for the backward, so the head weight
    read afterwards is the whole tensor and its gradient is reduced like any other.
    """
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        logits_to_keep=1,
        output_hidden_states=True,
        use_cache=False,
    )
    return out.hidden_states[-1]


def chunked_token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperatures: Tensor,
    *,
    chunk_size: int = 256,
    with_entropy: bool = False,
    positions: Tensor | None = None,
) -> TokenLogprobs:
    """Logprobs of ``input_ids[:, 1:]`` under ``model``: memory-lean path.

    ``temperatures`` is ``[B]``. Runs the decoder for final hidden states, then the LM head
    slice by vocabulary slice (see ``ChunkedTokenLogprobs``). ``positions`` (``[B, L-1]``,
    nonzero where a logprob is needed: the loss mask) limits the LM head and its softmax to
    those positions; the others read 0 (logprob and entropy) and get no gradient. The
    decoder still runs over every position (the completion attends to the prompt); only
    the head's ``positions x V`` work shrinks (TRL scores completion tokens only too).
    """
    hidden = final_hidden_states(model, input_ids, attention_mask)
    batch, length = input_ids.shape
    shape = (batch, length - 1)
    keep = (
        torch.ones(shape, dtype=torch.bool, device=input_ids.device)
        if positions is None
        else positions.to(device=input_ids.device) != 0
    )
    inv_temp = (1.0 / temperatures.to(_compute_dtype(hidden)))[:, None].expand(shape)
    logp, entropy = ChunkedTokenLogprobs.apply(
        hidden[:, :-1][keep],
        output_projection(model),
        input_ids[:, 1:][keep],
        inv_temp[keep].contiguous(),
        chunk_size,
        with_entropy,
    )
    if positions is None:
        return TokenLogprobs(logp.view(shape), entropy.view(shape) if with_entropy else None)
    zeros = logp.new_zeros(shape)
    return TokenLogprobs(
        zeros.masked_scatter(keep, logp),
        zeros.masked_scatter(keep, entropy) if with_entropy else None,
    )


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
