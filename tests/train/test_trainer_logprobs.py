"""The chunked logprob path equals the full log-softmax, in values and gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import tiny_model

from grpo_trainer.models import load_model
from grpo_trainer.train.logprobs import chunked_token_logprobs, naive_token_logprobs


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
