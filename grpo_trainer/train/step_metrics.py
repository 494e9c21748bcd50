"""One optimizer step's metrics: masked sums over its micro-batches (``StepSums``), reduced
over the ranks, then the step's record (``step_metrics``): loss and ratios, rewards,
entropy, the trainer/inference logprob alignment (all tokens and lag 0), mismatch KL per
environment, off-policy staleness, speed and memory."""

from __future__ import annotations

import resource
from collections import Counter
from dataclasses import dataclass, field

import torch

from grpo_trainer.ranks.group import Dist
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.data import MicroBatch, StepBatch
from grpo_trainer.train.loss import LossOutput, k3_kl

STALENESS_BUCKETS = 4
"""``staleness/lag0`` .. ``lag3`` and ``lag4+``: the share of a step's sequences per lag."""


@dataclass
class StepSums:
    """Masked sums over one step's micro-batches, for the step's metrics."""

    tokens: float = 0.0
    loss: float = 0.0
    ratio: float = 0.0
    clipped: float = 0.0
    train_logp: float = 0.0
    inference_logp: float = 0.0
    diff: float = 0.0
    abs_diff: float = 0.0
    max_diff: float = 0.0
    lag0_tokens: float = 0.0
    lag0_abs_diff: float = 0.0
    mismatch_kl: float = 0.0
    lag0_mismatch_kl: float = 0.0
    entropy: float = 0.0
    kl: float = 0.0
    pos_logp: float = 0.0
    pos_tokens: float = 0.0
    neg_logp: float = 0.0
    neg_tokens: float = 0.0
    processed_tokens: float = 0.0
    env_tokens: list[float] = field(default_factory=list)
    env_mismatch_kl: list[float] = field(default_factory=list)
    """Per environment of the step (``StepBatch.env_names``)."""

    @classmethod
    def of(cls, batch: StepBatch) -> StepSums:
        """Zero sums for ``batch`` (one per-environment slot per environment in it)."""
        envs = len(batch.env_names)
        return cls(env_tokens=[0.0] * envs, env_mismatch_kl=[0.0] * envs)

    def reduced(self, world: Dist) -> StepSums:
        """The sums over every rank (``max_diff``: the maximum)."""
        names = [name for name, v in vars(self).items() if isinstance(v, float)]
        names.remove("max_diff")
        totals = world.sum([getattr(self, name) for name in names])
        out = StepSums(**dict(zip(names, totals, strict=True)))
        out.max_diff = world.max([self.max_diff])[0]
        per_env = world.sum(self.env_tokens + self.env_mismatch_kl)
        out.env_tokens = per_env[: len(self.env_tokens)]
        out.env_mismatch_kl = per_env[len(self.env_tokens) :]
        return out

    def add(
        self,
        micro: MicroBatch,
        logp: torch.Tensor,
        entropy: torch.Tensor | None,
        result: LossOutput,
        version: int,
    ) -> None:
        """Add one micro-batch; ``version`` is the policy the trainer holds
        (sequences sampled at it are on-policy: their logprob difference is the weight
        sync's error alone, with no optimizer step in between)."""
        mask = micro.loss_mask
        diff = (logp - micro.inference_logprobs) * mask
        lag0 = mask * (micro.policy_versions == version).unsqueeze(1)
        self.lag0_tokens += float(lag0.sum())
        self.lag0_abs_diff += float((diff.abs() * lag0).sum())
        # k3 of KL(inference || trainer) per sampled token: exp(d) - 1 - d, d = trainer -
        # inference (loss.k3_kl with the inference logprobs in the policy's place)
        mismatch = k3_kl(micro.inference_logprobs, logp) * mask
        self.mismatch_kl += float(mismatch.sum())
        self.lag0_mismatch_kl += float((mismatch * lag0).sum())
        for env in range(len(self.env_tokens)):
            rows = (micro.envs == env).unsqueeze(1)
            self.env_tokens[env] += float((mask * rows).sum())
            self.env_mismatch_kl[env] += float((mismatch * rows).sum())
        self.tokens += float(mask.sum())
        self.loss += float(result.loss.detach())
        self.ratio += float((result.ratio * mask).sum())
        self.clipped += float((result.clipped * mask).sum())
        self.train_logp += float((logp * mask).sum())
        self.inference_logp += float((micro.inference_logprobs * mask).sum())
        self.diff += float(diff.sum())
        self.abs_diff += float(diff.abs().sum())
        self.max_diff = max(self.max_diff, float(diff.abs().max()))
        if entropy is not None:
            self.entropy += float((entropy.detach() * mask).sum())
        if result.kl is not None:
            self.kl += float((result.kl * mask).sum())
        pos = mask * (micro.advantages > 0)
        neg = mask * (micro.advantages < 0)
        self.pos_logp += float((logp * pos).sum())
        self.pos_tokens += float(pos.sum())
        self.neg_logp += float((logp * neg).sum())
        self.neg_tokens += float(neg.sum())
        self.processed_tokens += float(micro.attention_mask.sum())


def peak_memory_gb(device: str) -> float:
    """Peak accelerator memory allocated (CUDA), else the process' peak RSS, in GB."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def step_metrics(
    sums: StepSums,
    batch: StepBatch,
    *,
    lr: float,
    grad_norm: float,
    step_time: float,
    lag_base: int,
    config: TrainerConfig,
    world: Dist,
) -> dict[str, float]:
    """The step's record from its reduced sums; ``lag_base`` is the policy version trained
    (``off_policy_lag`` and the staleness histogram count from it)."""
    n = max(sums.tokens, 1.0)
    scores = torch.tensor(batch.scores, dtype=torch.float64)
    lengths = batch.completion_lengths
    metrics = {
        "loss": sums.loss,
        "lr": lr,
        "grad_norm": grad_norm,
        "mean_ratio": sums.ratio / n,
        "clipped_fraction": sums.clipped / n,
        "pos_logp": sums.pos_logp / max(sums.pos_tokens, 1.0),
        "neg_logp": sums.neg_logp / max(sums.neg_tokens, 1.0),
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std(unbiased=False)),
        "reward/zero_std_fraction": batch.zero_std_groups / max(batch.groups, 1),
        "entropy": sums.entropy / n,
        "logprobs/training_mean": sums.train_logp / n,
        "logprobs/inference_mean": sums.inference_logp / n,
        "alignment/diff_mean": sums.diff / n,
        "alignment/diff_abs_mean": sums.abs_diff / n,
        "alignment/diff_max": sums.max_diff,
        "completion_len/mean": sum(lengths) / max(len(lengths), 1),
        "completion_len/max": float(max(lengths, default=0)),
        "tokens_per_s": sums.processed_tokens / max(step_time, 1e-9),
        "step_time": step_time,
        "training_steps": float(config.training_steps),
    }
    peaks = world.gather(peak_memory_gb(config.device))
    if world.is_main:
        metrics["peak_memory_gb"] = max(peaks)
    if world.enabled:
        metrics.update({f"gpu_memory_gb/rank{r}": gb for r, gb in enumerate(peaks)})
    if config.beta > 0:
        metrics["kl"] = sums.kl / n
    if batch.policy_versions:
        lags = [lag_base - v for v in batch.policy_versions]
        metrics["off_policy_lag"] = sum(lags) / len(lags)
        metrics |= staleness(lag_base, batch.sequence_versions)
    metrics["mismatch_kl"] = sums.mismatch_kl / n
    for name, tokens, total in zip(
        batch.env_names, sums.env_tokens, sums.env_mismatch_kl, strict=True
    ):
        if name and tokens:
            metrics[f"mismatch_kl/env/{name}"] = total / tokens
    if sums.lag0_tokens:
        # Sequences sampled at the weights being trained: a weight-sync error shows here
        # (bf16 rounding only: ~5e-3 on GPU, ~1e-7 in float32), off-policy drift cannot.
        metrics["alignment/diff_abs_mean_lag0"] = sums.lag0_abs_diff / sums.lag0_tokens
        metrics["alignment/lag0_fraction"] = sums.lag0_tokens / n
        metrics["mismatch_kl/lag0"] = sums.lag0_mismatch_kl / sums.lag0_tokens
    return metrics


def hyperparameters(config: TrainerConfig) -> dict[str, float]:
    """The editable values in force at a step (``hparam/...``: live edits show in them)."""
    values = {
        "hparam/lr": config.base_lr,
        "hparam/beta": config.beta,
        "hparam/clip_eps": config.clip_eps,
        "hparam/clip_eps_high": config.clip_high,
        "hparam/entropy_coef": config.entropy_coef,
    }
    if config.tis_cap is not None:
        values["hparam/tis_cap"] = config.tis_cap
    return values


def staleness(base: int, versions: list[int]) -> dict[str, float]:
    """The step's staleness histogram: the share of its sequences sampled ``k`` steps
    before the weights being trained (``staleness/lag0`` .. ``lag3``, ``lag4+``;
    ``staleness/negative`` when a sequence came from weights newer than these, e.g. an
    abandoned policy after a resume), and ``staleness/max``."""
    lags = [base - v for v in versions if v >= 0]
    if not lags:
        return {}
    counts = Counter(min(lag, STALENESS_BUCKETS) for lag in lags if lag >= 0)
    shares = {
        f"staleness/lag{k}{'+' if k == STALENESS_BUCKETS else ''}": counts[k] / len(lags)
        for k in range(STALENESS_BUCKETS + 1)
    }
    negative = sum(1 for lag in lags if lag < 0)
    if negative:
        shares["staleness/negative"] = negative / len(lags)
    return shares | {"staleness/max": float(max(lags))}
