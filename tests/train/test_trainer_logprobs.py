"""The chunked logprob path equals the full log-softmax, in values and gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import tiny_model

from grpo_trainer.models import load_model
from grpo_trainer.train.logprobs import (
    ChunkedTokenLogprobs,
    chunked_token_logprobs,
    naive_token_logprobs,
)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.mark.parametrize("chunk_size", [1, 5, 4096])
def test_chunked_matches_naive_with_per_sequence_temperature(model_path: Path, chunk_size: int):
    model = load_model(model_path, dtype="float32")
    model.double()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 44, (3, 11), generator=g)
    attention = torch.ones_like(ids)
    attention[2, 7:] = 0
    temps = torch.tensor([1.0, 0.6, 1.7], dtype=torch.float64)
    weights = torch.rand(3, 10, generator=g, dtype=torch.float64)
    results = []
    for fn, kwargs in (
        (chunked_token_logprobs, {"chunk_size": chunk_size}),
        (naive_token_logprobs, {}),
    ):
        model.zero_grad()
        out = fn(model, ids, attention, temps, with_entropy=True, **kwargs)
        ((out.logprobs * weights).sum() + (out.entropy * weights.flip(0)).sum()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((out.logprobs.detach(), out.entropy.detach(), grads))
    (lp_a, ent_a, grads_a), (lp_b, ent_b, grads_b) = results
    assert torch.allclose(lp_a.double(), lp_b.double(), rtol=1e-6, atol=1e-6)
    assert torch.allclose(ent_a.double(), ent_b.double(), rtol=1e-6, atol=1e-6)
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)
    assert (lp_a <= 0).all()


def test_temperature_changes_logprobs(model_path: Path) -> None:
    model = load_model(model_path)
    ids = torch.randint(5, 44, (1, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    cold = chunked_token_logprobs(model, ids, mask, torch.tensor([0.5])).logprobs
    hot = chunked_token_logprobs(model, ids, mask, torch.tensor([2.0])).logprobs
    assert not torch.allclose(cold, hot)


def _reference(hidden, weight, labels, inv_temp):
    q = torch.log_softmax((hidden @ weight.T).to(inv_temp.dtype) * inv_temp[:, None], dim=-1)
    return q.gather(1, labels[:, None]).squeeze(1), -(q.exp() * q).sum(-1)


def _inputs(dtype: torch.dtype, weight_grad: bool = True):
    g = torch.Generator().manual_seed(3)
    n, dim, vocab = 8, 6, 300
    hidden = (torch.randn(n, dim, generator=g, dtype=torch.float64) * 2).to(dtype)
    weight = torch.randn(vocab, dim, generator=g, dtype=torch.float64).to(dtype)
    # Slice edges for widths 38 (chunk 1) and 256 (chunk 4), both vocabulary ends, repeats.
    labels = torch.tensor([0, 37, 38, 255, 256, 299, 38, 299])
    inv_temp = torch.rand(n, generator=g, dtype=torch.float64).add(0.5)
    inv_temp = inv_temp.to(torch.promote_types(dtype, torch.float32))
    return hidden.requires_grad_(), weight.requires_grad_(weight_grad), labels, inv_temp


@pytest.mark.parametrize("chunk_size", [1, 4, 100])
@pytest.mark.parametrize("terms", ["both", "logp", "entropy"])
def test_vocab_slices_match_reference_at_slice_edges(chunk_size: int, terms: str) -> None:
    """Labels on slice and vocabulary edges, a narrow last slice, N below one chunk."""
    results = []
    for chunked in (True, False):
        hidden, weight, labels, inv_temp = _inputs(torch.float64)
        if chunked:
            logp, entropy = ChunkedTokenLogprobs.apply(
                hidden, weight, labels, inv_temp, chunk_size, terms != "logp"
            )
        else:
            logp, entropy = _reference(hidden, weight, labels, inv_temp)
        loss = logp.sum() * (terms != "entropy") + entropy.square().sum() * (terms != "logp")
        loss.backward()
        results.append((logp, entropy if terms != "logp" else None, hidden.grad, weight.grad))
    for a, b in zip(*results, strict=True):
        if b is not None:
            assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_frozen_head_gets_no_gradient_and_hidden_still_does() -> None:
    hidden, weight, labels, inv_temp = _inputs(torch.float64, weight_grad=False)
    logp, _ = ChunkedTokenLogprobs.apply(hidden, weight, labels, inv_temp, 2, False)
    logp.sum().backward()
    expected = torch.autograd.grad(_reference(hidden, weight, labels, inv_temp)[0].sum(), hidden)
    assert weight.grad is None
    assert torch.allclose(hidden.grad, expected[0], rtol=1e-9, atol=1e-12)


def test_bfloat16_weights_keep_float32_logprobs_close_to_reference() -> None:
    """bf16 matmuls, float32 softmax: values and gradients within bf16 rounding of the reference."""
    hidden, weight, labels, inv_temp = _inputs(torch.bfloat16)
    logp, entropy = ChunkedTokenLogprobs.apply(hidden, weight, labels, inv_temp, 1, True)
    assert logp.dtype == entropy.dtype == torch.float32
    (logp.sum() + entropy.sum()).backward()
    grads = hidden.grad, weight.grad
    assert grads[0].dtype == grads[1].dtype == torch.bfloat16
    ref_logp, ref_entropy = _reference(hidden.float(), weight.float(), labels, inv_temp)
    ref_grads = torch.autograd.grad(ref_logp.sum() + ref_entropy.sum(), (hidden, weight))
    assert torch.allclose(logp, ref_logp, atol=0.05)
    assert torch.allclose(entropy, ref_entropy, atol=0.05)
    for got, ref in zip(grads, ref_grads, strict=True):
        assert (got.float() - ref.float()).norm() <= 0.03 * ref.float().norm()


def _masked_inputs():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, 44, (3, 12), generator=g)
    attention = torch.ones_like(ids)
    attention[2, 9:] = 0
    mask = torch.zeros(3, 11)
    mask[0, 4:] = 1  # a prompt of 5, then the completion
    mask[1, 6:9] = 1
    mask[2, 3:8] = 1  # ends before the padding
    return ids, attention, torch.tensor([1.0, 0.7, 1.3], dtype=torch.float64), mask


@pytest.mark.parametrize("chunk_size", [1, 4096])
def test_positions_score_only_trained_tokens_with_equal_values_and_gradients(
    model_path: Path, chunk_size: int
) -> None:
    """The LM head over the loss mask's positions only: at those positions the same
    logprobs, entropy and gradients as scoring every position; elsewhere 0, no gradient."""
    model = load_model(model_path, dtype="float32").double()
    ids, attention, temps, mask = _masked_inputs()
    g = torch.Generator().manual_seed(6)
    weights, entropy_weights = torch.rand(2, 3, 11, generator=g, dtype=torch.float64) * mask
    results = []
    for positions in (None, mask):
        model.zero_grad()
        out = chunked_token_logprobs(
            model, ids, attention, temps, chunk_size=chunk_size, with_entropy=True,
            positions=positions,
        )  # fmt: skip
        ((out.logprobs * weights).sum() + (out.entropy * entropy_weights).sum()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((out.logprobs.detach(), out.entropy.detach(), grads))
    (lp_all, ent_all, grads_all), (lp_kept, ent_kept, grads_kept) = results
    kept = mask.bool()
    assert torch.allclose(lp_kept[kept], lp_all[kept], rtol=1e-12, atol=1e-12)
    assert torch.allclose(ent_kept[kept], ent_all[kept], rtol=1e-12, atol=1e-12)
    assert (lp_kept[~kept] == 0).all() and (ent_kept[~kept] == 0).all()
    assert (lp_all[~kept] < 0).all()  # scored when every position is asked for
    for a, b in zip(grads_kept, grads_all, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)


def test_positions_none_trained_gives_zero_gradients(model_path: Path) -> None:
    """A micro-batch with nothing to train (every rank must still run its forward)."""
    model = load_model(model_path, dtype="float32")
    ids, attention, temps, mask = _masked_inputs()
    out = chunked_token_logprobs(
        model, ids, attention, temps.float(), with_entropy=True, positions=torch.zeros_like(mask)
    )
    (out.logprobs.sum() + out.entropy.sum()).backward()
    assert (out.logprobs == 0).all() and (out.entropy == 0).all()
    assert all(p.grad is None or (p.grad == 0).all() for p in model.parameters())
