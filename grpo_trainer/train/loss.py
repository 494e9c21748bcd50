"""The GRPO policy loss, one function per idea.

Notation, per token ``t`` of sequence ``i`` (only completion tokens, ``mask = 1``):
``logp`` trainer logprob (with grad), ``mu`` the inference server's logprob of the same
sampled token, ``A`` the advantage, ``r = exp(logp - mu)``.

Every term returns a per-token tensor; ``aggregate`` turns it into a scalar with one of the
three normalisations, given the *whole optimizer step's* sequence and token counts so that
gradient accumulation over micro-batches sums to exactly the full-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from grpo_trainer.train.config import TrainerConfig


def clipped_surrogate(
    logp: Tensor, mu: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO clipped objective against the inference logprobs (Schulman et al. 2017; Atropos).

    ``L = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` with ``r = exp(logp - mu)``;
    ``eps_high > eps_low`` is DAPO's clip-higher (Yu et al. 2025).
    Returns the per-token loss, the ratio and a 0/1 tensor of tokens where the clip bound.
    """
    ratio = torch.exp(logp - mu)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, ratio, (clipped < unclipped).to(logp.dtype)


def truncated_is_surrogate(
    logp: Tensor,
    mu: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    cap: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Clipped objective with truncated importance sampling for trainer/inference mismatch.

    After Yao et al. 2025 ("Your efficient RL framework secretly brings you off-policy RL
    training"): the ratio to the sampler splits into ``rho = exp(logp - sg(logp))`` (the
    policy-gradient ratio, 1 in value) and the mismatch ``w = exp(sg(logp) - mu)``, which is
    truncated: ``L = -min(w, cap) * min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``.
    One optimizer step per batch makes ``rho = 1``, so the clip never binds and a token
    whose inference logprob is far below the trainer's cannot dominate the gradient.
    """
    rho = torch.exp(logp - logp.detach())
    weight = torch.clamp(torch.exp(logp.detach() - mu), max=cap)
    unclipped = rho * advantages
    clipped = torch.clamp(rho, 1 - clip_low, 1 + clip_high) * advantages
    loss = -weight * torch.minimum(unclipped, clipped)
    return loss, torch.exp(logp.detach() - mu), (weight >= cap).to(logp.dtype)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token KL(pi || ref) estimate ``exp(ref - logp) - (ref - logp) - 1`` (Schulman's k3,
    as in DeepSeekMath's GRPO): unbiased, always >= 0."""
    delta = ref_logp - logp
    return torch.expm1(delta) - delta  # expm1: exp(d) - 1 - d cancels to 0 in float32


def aggregate(
    token_loss: Tensor,
    mask: Tensor,
    loss_type: str,
    *,
    step_sequences: int,
    step_tokens: int,
    max_len: int,
) -> Tensor:
    """Reduce ``[B, L]`` per-token losses of one micro-batch to its share of the step loss.

    - ``grpo`` (Shao et al. 2024; Atropos): mean over each sequence's tokens, then mean over
      the step's ``step_sequences`` sequences.
    - ``dapo`` (Yu et al. 2025): sum over all tokens / the step's ``step_tokens``.
    - ``dr_grpo`` (Liu et al. 2025, "Dr. GRPO"): sum over all tokens /
      (``step_sequences * max_len``), a constant, so that length does not rescale the signal.
    """
    masked = token_loss * mask
    if loss_type == "grpo":
        per_sequence = masked.sum(-1) / mask.sum(-1).clamp(min=1)
        return per_sequence.sum() / step_sequences
    if loss_type == "dapo":
        return masked.sum() / max(step_tokens, 1)
    if loss_type == "dr_grpo":
        return masked.sum() / (step_sequences * max_len)
    raise ValueError(f"unknown loss_type {loss_type!r}: grpo, dapo or dr_grpo")


@dataclass(frozen=True)
class LossSettings:
    """The knobs of ``policy_loss`` (a view of TrainerConfig, so tests need no config)."""

    loss_type: str = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    beta: float = 0.0
    tis_cap: float | None = None
    entropy_coef: float = 0.0

    @classmethod
    def of(cls, config: TrainerConfig) -> LossSettings:
        """The loss knobs of ``config``."""
        return cls(
            loss_type=config.loss_type,
            clip_low=config.clip_eps,
            clip_high=config.clip_high,
            beta=config.beta,
            tis_cap=config.tis_cap,
            entropy_coef=config.entropy_coef,
        )


@dataclass
class LossOutput:
    """The micro-batch's loss share and per-token tensors for metrics (detached)."""

    loss: Tensor
    ratio: Tensor
    clipped: Tensor
    kl: Tensor | None


def policy_loss(
    logp: Tensor,
    mu: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: LossSettings,
    *,
    step_sequences: int,
    step_tokens: int,
    max_len: int,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
) -> LossOutput:
    """Surrogate + ``beta`` * KL - ``entropy_coef`` * entropy, aggregated per ``loss_type``.

    ``advantages`` is per token (a sequence's scalar broadcast). KL needs ``ref_logp`` when
    ``beta > 0``; the bonus needs ``entropy`` when ``entropy_coef > 0``.
    """
    if settings.tis_cap is None:
        token_loss, ratio, clipped = clipped_surrogate(
            logp, mu, advantages, settings.clip_low, settings.clip_high
        )
    else:
        token_loss, ratio, clipped = truncated_is_surrogate(
            logp, mu, advantages, settings.clip_low, settings.clip_high, settings.tis_cap
        )
    kl = None
    if settings.beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs reference logprobs")
        kl = k3_kl(logp, ref_logp)
        token_loss = token_loss + settings.beta * kl
    if settings.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropy")
        token_loss = token_loss - settings.entropy_coef * entropy
    loss = aggregate(
        token_loss,
        mask,
        settings.loss_type,
        step_sequences=step_sequences,
        step_tokens=step_tokens,
        max_len=max_len,
    )
    return LossOutput(
        loss=loss,
        ratio=ratio.detach(),
        clipped=clipped.detach(),
        kl=None if kl is None else kl.detach(),
    )
