"""Our loss and gradients against a plain float64 reference, per aggregation and term."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from grpo_trainer.train.loss import LossSettings, k3_kl, policy_loss

B, L, MAX_LEN = 4, 7, 10


def reference_loss(logp, mu, adv, mask, ref, ent, s: LossSettings) -> torch.Tensor:
    """Loop-by-loop float64 version of the documented formulas."""
    per_seq_sums, per_seq_counts = [], []
    for i in range(B):
        total = torch.zeros((), dtype=torch.float64)
        count = 0
        for t in range(L):
            if mask[i, t] == 0:
                continue
            a = adv[i, t]
            if s.tis_cap is None:
                r = torch.exp(logp[i, t] - mu[i, t])
                term = -torch.minimum(r * a, torch.clamp(r, 1 - s.clip_low, 1 + s.clip_high) * a)
            else:
                rho = torch.exp(logp[i, t] - logp[i, t].detach())
                w = min(math.exp(float(logp[i, t]) - float(mu[i, t])), s.tis_cap)
                term = -w * torch.minimum(
                    rho * a, torch.clamp(rho, 1 - s.clip_low, 1 + s.clip_high) * a
                )
            if s.beta:
                d = ref[i, t] - logp[i, t]
                term = term + s.beta * (torch.exp(d) - d - 1)
            if s.entropy_coef:
                term = term - s.entropy_coef * ent[i, t]
            total = total + term
            count += 1
        per_seq_sums.append(total)
        per_seq_counts.append(count)
    if s.loss_type == "grpo":
        return sum(t / max(c, 1) for t, c in zip(per_seq_sums, per_seq_counts, strict=True)) / B
    if s.loss_type == "dapo":
        return sum(per_seq_sums) / sum(per_seq_counts)
    return sum(per_seq_sums) / (B * MAX_LEN)


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    mu = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3
    logp = (mu + torch.randn(B, L, generator=g, dtype=torch.float64) * 0.4).clamp(max=-1e-3)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, L).clone()
    mask = (torch.rand(B, L, generator=g) > 0.3).double()
    mask[0] = 1.0
    mask[1, :3] = 0.0
    ref = mu + torch.randn(B, L, generator=g, dtype=torch.float64) * 0.2
    ent = torch.rand(B, L, generator=g, dtype=torch.float64) * 3
    return logp, mu, adv, mask, ref, ent


TERMS = {
    "plain": {},
    "kl": {"beta": 0.1},
    "tis": {"tis_cap": 1.5},
    "entropy": {"entropy_coef": 0.01},
    "all": {"beta": 0.05, "tis_cap": 2.0, "entropy_coef": 0.02, "clip_high": 0.28},
}


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_loss_and_gradients_match_float64_reference(loss_type: str, terms: str) -> None:
    settings = LossSettings(loss_type=loss_type, **TERMS[terms])
    logp0, mu, adv, mask, ref, ent0 = inputs(
        seed=zlib.crc32(f"{loss_type}/{terms}".encode()) % 1000
    )
    ours_logp = logp0.clone().requires_grad_(True)
    ours_ent = ent0.clone().requires_grad_(True)
    ours = policy_loss(
        ours_logp,
        mu,
        adv,
        mask,
        settings,
        step_sequences=B,
        step_tokens=int(mask.sum()),
        max_len=MAX_LEN,
        ref_logp=ref,
        entropy=ours_ent,
    ).loss
    ours.backward()
    want_logp = logp0.clone().requires_grad_(True)
    want_ent = ent0.clone().requires_grad_(True)
    want = reference_loss(want_logp, mu, adv, mask, ref, want_ent, settings)
    want.backward()
    assert abs(float(ours.detach() - want.detach())) <= 1e-6 * abs(float(want.detach())) + 1e-15
    assert (ours_ent.grad is None) == (want_ent.grad is None)
    pairs = [(ours_logp.grad, want_logp.grad)]
    if want_ent.grad is not None:
        pairs.append((ours_ent.grad, want_ent.grad))
    for got, expected in pairs:
        scale = expected.abs().max().clamp(min=1e-12)
        assert float((got - expected).abs().max() / scale) < 1e-6


def test_clip_binds_where_ratio_leaves_the_trust_region() -> None:
    logp = torch.log(torch.tensor([[0.9, 0.5]], dtype=torch.float64)).requires_grad_(True)
    mu = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    out = policy_loss(
        logp,
        mu,
        torch.ones(1, 2, dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.float64),
        LossSettings(),
        step_sequences=1,
        step_tokens=2,
        max_len=2,
    )
    out.loss.backward()
    assert out.clipped.tolist() == [[1.0, 0.0]]
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] != 0.0


def test_micro_batches_sum_to_the_full_batch_loss() -> None:
    logp, mu, adv, mask, _, _ = inputs(seed=3)
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        settings = LossSettings(loss_type=loss_type)
        common = {"step_sequences": B, "step_tokens": int(mask.sum()), "max_len": MAX_LEN}
        whole = policy_loss(logp, mu, adv, mask, settings, **common).loss
        halves = sum(
            policy_loss(logp[s], mu[s], adv[s], mask[s], settings, **common).loss
            for s in (slice(0, 1), slice(1, B))
        )
        assert abs(float(whole - halves)) < 1e-12


def test_kl_without_reference_is_an_error() -> None:
    logp, mu, adv, mask, _, _ = inputs(seed=4)
    with pytest.raises(ValueError, match="reference"):
        policy_loss(
            logp, mu, adv, mask, LossSettings(beta=0.1), step_sequences=B, step_tokens=1, max_len=1
        )


def test_k3_kl_keeps_small_differences_in_float32() -> None:
    logp = torch.tensor([-2.0, -1.0], dtype=torch.float32)
    ref = logp + torch.tensor([1e-4, -3e-4])
    kl = k3_kl(logp, ref)
    expected = torch.tensor([1e-4, -3e-4], dtype=torch.float64) ** 2 / 2
    assert torch.allclose(kl.double(), expected, rtol=1e-2)


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory):
    from train_helpers import tiny_model

    from grpo_trainer.models import load_model

    path = tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return load_model(path, dtype="float32").double()


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_trainer_path_scoring_trained_tokens_only_matches_float64_reference(
    tiny_policy, loss_type: str, terms: str
) -> None:
    """The trainer's path (LM head over the loss mask's positions only, ``positions``)
    through a real model: loss and every parameter's gradient equal the float64 reference
    formulas on the full log-softmax over every position (TRL's ``_compute_loss`` terms)."""
    from grpo_trainer.train.logprobs import chunked_token_logprobs, naive_token_logprobs

    model, settings = tiny_policy, LossSettings(loss_type=loss_type, **TERMS[terms])
    _, mu, adv, mask, ref, _ = inputs(seed=7)
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(5, 44, (B, L + 1), generator=g)
    attention, temps = torch.ones_like(ids), torch.tensor([1.0, 0.8, 1.2, 1.0], dtype=torch.float64)
    results = []
    for ours in (True, False):
        model.zero_grad()
        if ours:
            out = chunked_token_logprobs(
                model, ids, attention, temps, chunk_size=3, with_entropy=True, positions=mask
            )
            loss = policy_loss(
                out.logprobs, mu, adv, mask, settings, step_sequences=B,
                step_tokens=int(mask.sum()), max_len=MAX_LEN, ref_logp=ref, entropy=out.entropy,
            ).loss  # fmt: skip
        else:
            out = naive_token_logprobs(model, ids, attention, temps, with_entropy=True)
            loss = reference_loss(out.logprobs, mu, adv, mask, ref, out.entropy, settings)
        loss.backward()
        results.append((float(loss), [p.grad.clone() for p in model.parameters()]))
    (ours_loss, ours_grads), (want_loss, want_grads) = results
    assert abs(ours_loss - want_loss) <= 1e-9 * abs(want_loss) + 1e-15
    for got, expected in zip(ours_grads, want_grads, strict=True):
        scale = expected.abs().max().clamp(min=1e-12)
        assert float((got - expected).abs().max() / scale) < 1e-8
