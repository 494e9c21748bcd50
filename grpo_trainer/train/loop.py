"""The GRPO optimisation loop: fetch a batch, accumulate gradients, step, sync, report, save.

Per optimizer step::

    batch = source.next_batch()                 # data_wait_time
    sync.before_train_step()                    # colocate: inference sleeps
    for micro in batch: loss(micro).backward()  # grads sum to the full-batch loss
    clip grad norm; set lr (warm-up, constant/cosine)
    sync.before_optimizer_step(); optimizer.step(); sync.after_optimizer_step()
    source.done(batch)                          # ack the leased batch
    every sync_every steps: sync.sync(model, step)   (retried; bounded staleness)
    report metrics (phase/<phase>_s: phases.py); every checkpoint_interval steps: checkpoint

With a ``StepRecorder`` (``recording.py``) each step's groups and its phases as timed spans
(wait, sleep, forward_backward, pause, optimizer, resume, sync) are recorded as well, off
the training thread.

SIGTERM / SIGINT ask for a graceful stop: the current step finishes, a checkpoint is
written, and ``run`` returns normally. So does a sync that the supervisor refuses because
it is shutting down.

Under torchrun (``ranks/group.py``) rank 0 leases each batch and broadcasts it, every rank
trains its share of the sequences, metrics are reduced over ranks and only rank 0 reports
them, and a stop on any rank stops every rank after the same step.
"""

from __future__ import annotations

import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from pydantic import ValidationError
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import PreTrainedTokenizerBase

from grpo_trainer.live_edits import EditWatcher
from grpo_trainer.ranks.group import Dist, rank_slice
from grpo_trainer.ranks.mirror import Consolidator
from grpo_trainer.records.timeline import SYNC_PHASES
from grpo_trainer.sync.base import WeightSync
from grpo_trainer.train.api_client import LeasedBatch
from grpo_trainer.train.checkpoint import (
    load_trainer_state,
    prune_checkpoints,
    save_checkpoint,
    set_rng_state,
)
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.data import (
    DataError,
    MicroBatch,
    StepBatch,
    build_step_batch,
    parse_groups,
)
from grpo_trainer.train.dcp import has_sharded_state, load_sharded_state, save_sharded_checkpoint
from grpo_trainer.train.logprobs import chunked_token_logprobs
from grpo_trainer.train.loss import LossOutput, LossSettings, k3_kl, policy_loss
from grpo_trainer.train.optim import build_optimizer, lr_factor
from grpo_trainer.train.phases import PhaseClock, per_rank
from grpo_trainer.train.recording import StepRecorder
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.resume import ResumePoint
from grpo_trainer.train.sources import BatchSource
from grpo_trainer.train.weight_path import SyncLagExceeded, WeightPath

READY_LINE = "grpo-trainer ready"
"""Printed once the data source is connected (the supervisor's log_line readiness probe)."""
STALENESS_BUCKETS = 4
"""``staleness/lag0`` .. ``lag3`` and ``lag4+``: the share of a step's sequences per lag."""


@dataclass
class _Sums:
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

    def reduced(self, world: Dist) -> _Sums:
        """The sums over every rank (``max_diff``: the maximum)."""
        names = [name for name, v in vars(self).items() if isinstance(v, float)]
        names.remove("max_diff")
        totals = world.sum([getattr(self, name) for name in names])
        out = _Sums(**dict(zip(names, totals, strict=True)))
        out.max_diff = world.max([self.max_diff])[0]
        per_env = world.sum(self.env_tokens + self.env_mismatch_kl)
        out.env_tokens = per_env[: len(self.env_tokens)]
        out.env_mismatch_kl = per_env[len(self.env_tokens) :]
        return out


def peak_memory_gb(device: str) -> float:
    """Peak accelerator memory allocated (CUDA), else the process' peak RSS, in GB."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


class Trainer:
    """One GRPO training run over a model, a data source and an optional weight sync.

    On several ranks (``world``), ``model`` is FSDP2-sharded, ``source`` is rank 0's alone
    (None elsewhere) and ``consolidator`` holds rank 0's CPU copy for the weights it writes.
    """

    def __init__(
        self,
        config: TrainerConfig,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        base: str,
        source: BatchSource | None,
        reporter: Reporter,
        strategy: WeightSync | None = None,
        reference: nn.Module | None = None,
        resume: ResumePoint | None = None,
        world: Dist | None = None,
        consolidator: Consolidator | None = None,
        recorder: StepRecorder | None = None,
    ) -> None:
        self.config = config
        self.recorder = recorder
        self.world = world or Dist(device=config.device)
        self.consolidator = consolidator
        if self.world.enabled and consolidator is None:
            raise ValueError("a multi-rank trainer needs a Consolidator (rank 0's CPU mirror)")
        self.tokenizer = tokenizer
        self.base = base
        self.source = source
        self.reporter = reporter
        self.strategy = strategy
        self.reference = reference
        self.step = 0 if resume is None else resume.step
        self.path = WeightPath(self)
        if self.world.is_main:  # before attaching: a server restarted since is newer
            self.path.incarnation.adopt()
        self.model = model if strategy is None else strategy.attach(model)
        self.optimizer = build_optimizer(
            self.model, config.optimizer, config.base_lr, config.weight_decay,
            config.optimizer_impl,
        )  # fmt: skip
        if resume is not None and resume.exact and has_sharded_state(resume.checkpoint):
            load_sharded_state(resume.checkpoint, self.model, self.optimizer, self.world)
        elif resume is not None and resume.exact and self.world.enabled:
            reporter.event(
                "info",
                f"resuming at step {resume.step} from {resume.checkpoint} with fresh optimizer "
                "state (a single-process checkpoint has no sharded optimizer state)",
            )
        elif resume is not None and resume.exact:
            state = load_trainer_state(resume.checkpoint)
            self.optimizer.load_state_dict(state["optimizer"])
            set_rng_state(state["rng"])
        elif resume is not None:
            reporter.event(
                "info",
                f"resuming at step {resume.step} from {resume.checkpoint} with fresh optimizer "
                "state (the trained parameter set changed with the weight-sync mode)",
            )
        self.loss_settings = loss_settings(config)
        self.edits = EditWatcher.for_role("trainer")
        self.policy_version = self.step
        self.last_synced_step = self.step
        self.last_saved_step = self.step
        self.stop_requested = False

    def request_stop(self) -> None:
        """Finish the current step, checkpoint, and return from ``run`` (SIGTERM handler)."""
        self.stop_requested = True

    def run(self, on_ready: Callable[[], None] | None = None) -> int:
        """Train until ``training_steps`` or a stop request; returns the last step."""
        if self.source is not None:
            self.source.start(self.step)
        self.path.report()
        print(READY_LINE, flush=True)
        if on_ready is not None:
            on_ready()
        clock = PhaseClock(self.reporter.phase, self.step)
        try:
            while self.step < self.config.training_steps and not self.stop_requested:
                self.path.take()
                wait_start = time.perf_counter()
                with nullcontext() if self.recorder is None else self.recorder.waiting():
                    leased = self._next_batch()
                if leased is None:
                    # stopped, or a notice came (an inference restart, a mode switch)
                    self.stop_requested = self.world.any(self.stop_requested)
                    continue
                data_wait = time.perf_counter() - wait_start
                self.apply_edits()
                groups = parse_groups(leased.groups)
                batch = build_step_batch(
                    groups,
                    micro_batch_size=self.config.batch_size,
                    seq_len=self.config.seq_len,
                    pad_id=self.tokenizer.pad_token_id,
                    share=rank_slice(sum(len(g.tokens) for g in groups), self.world),
                )
                if self.strategy is not None:
                    if self.strategy.sleeps:
                        clock.enter("sleeping", self.step)
                    with self._span("sleep") if self.strategy.sleeps else nullcontext():
                        self.path.release_device()
                clock.enter("training", self.step)
                if self.recorder is not None:
                    self.recorder.begin_step(self.step + 1)
                metrics = self.train_step(batch)
                if self.recorder is not None:
                    self.recorder.record(self.step, groups, batch, self.step - 1)
                if self.source is not None:
                    self.source.done(leased, self.step)
                metrics["data_wait_time"] = data_wait
                metrics.update(self.hyperparameters())
                clock.enter("syncing", self.step)
                sync_start = time.time()
                metrics.update(self._maybe_sync())
                self._record_sync(sync_start, metrics)
                clock.enter("generating", self.step)
                if self.strategy is not None and self.strategy.sleeps:
                    clock.move(metrics.get("sync/wake_time", 0.0), "syncing", "waking")
                phases = clock.take()
                metrics.update(phases)
                if self.world.enabled:
                    metrics.update(per_rank(self.world.gather(phases)))
                self.stop_requested = self.world.any(self.stop_requested)
                if self.recorder is not None:
                    self.recorder.end_step(self.step)
                    if self.recorder.dropped:
                        metrics["record/dropped"] = float(self.recorder.dropped)
                if self.world.is_main:
                    self.reporter.metrics(self.step, metrics)
                interval = self.config.checkpoint_interval
                if interval and self.step % interval == 0:
                    self.checkpoint()
        finally:
            if self.step > self.last_saved_step:
                self.checkpoint()
            if self.source is not None:
                self.source.close()
            if self.strategy is not None:
                self.strategy.close()
            if self.recorder is not None:
                self.recorder.close()
        return self.step

    def _span(self, phase: str) -> AbstractContextManager[None]:
        """Time ``phase`` on the step timeline (a no-op without a recorder)."""
        return nullcontext() if self.recorder is None else self.recorder.span(phase)

    def _record_sync(self, start: float, metrics: dict[str, float]) -> None:
        """The sync as timeline spans: the strategy's own phases (``sync/<phase>_time``:
        pause, resume, wake) laid end to end in the order it reports them, the rest of
        ``sync_time`` as ``transfer``."""
        if self.recorder is None or "sync_time" not in metrics:
            return
        at = start
        for key, seconds in metrics.items():
            if key.startswith("sync/") and key.endswith("_time"):
                phase = SYNC_PHASES.get(key.removeprefix("sync/").removesuffix("_time"))
                if phase is not None:
                    self.recorder.timeline.add(phase, at, at + seconds)
                    at += seconds
        rest = metrics["sync_time"] - (at - start)
        if rest > 0:
            self.recorder.timeline.add("transfer", at, at + rest)

    def apply_edits(self) -> None:
        """Take the run's live edits (``grpo_trainer.live_edits``) from this step on.

        Validated again here with the trainer's own config (the supervisor already did);
        a value this process cannot take is refused with an error event, the rest applies.
        """
        changed = self.world.broadcast(self.edits.poll() if self.world.is_main else None)
        if not changed:
            return
        current = self.config.model_dump()
        new = {key: value for key, value in changed.items() if current.get(key) != value}
        if new.get("beta") and self.reference is None and not self.config.is_lora:
            self.reporter.event(
                "error",
                f"live edit beta={new.pop('beta')} refused: this trainer started with beta 0 "
                "and loaded no KL reference model",
            )
        if not new:
            return
        try:
            config = TrainerConfig.model_validate({**current, **new})
        except ValidationError as exc:
            self.reporter.event("error", f"live edit refused: {exc.errors()[0]['msg']}")
            return
        self.config = config
        self.loss_settings = loss_settings(config)
        changes = ", ".join(f"{key} {current[key]} -> {value}" for key, value in new.items())
        self.reporter.event("info", f"live edit from step {self.step + 1}: {changes}")

    def hyperparameters(self) -> dict[str, float]:
        """The editable values in force at this step (``hparam/...`` metrics)."""
        config = self.config
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

    def _next_batch(self) -> LeasedBatch | None:
        """Rank 0 leases the step's batch and every rank gets it; None: stop first.

        A failure on rank 0 (bad data, API gone) reaches the other ranks as a ``DataError``
        so that no rank waits forever in the broadcast.
        """

        def interrupted() -> bool:
            return self.stop_requested or self.path.pending()

        if self.source is not None and not self.world.enabled:
            return self.source.next_batch(self.step, interrupted)
        if self.source is not None:
            try:
                leased = self.source.next_batch(self.step, interrupted)
            except Exception as exc:
                self.world.broadcast(("error", str(exc)))
                raise
            self.world.broadcast(("ok", None if leased is None else leased.groups))
            return leased
        status, payload = self.world.broadcast(None)
        if status == "error":
            raise DataError(f"rank 0 could not get the step's batch: {payload}")
        return None if payload is None else LeasedBatch(groups=payload, batch_id=None)

    def checkpoint(self) -> None:
        """Save the current step and prune old checkpoints."""
        common = {
            "checkpoint_dir": self.config.checkpoint_dir,
            "step": self.step,
            "optimizer": self.optimizer,
            "scheduler": {"step": self.step, "lr_schedule": self.config.lr_schedule},
            "config": self.config.model_dump(mode="json"),
            "base": self.base,
        }
        if self.consolidator is not None:
            save_sharded_checkpoint(
                self.model,
                self.tokenizer,
                **common,
                world=self.world,
                consolidator=self.consolidator,
            )
            if self.world.is_main:
                prune_checkpoints(self.config.checkpoint_dir, self.config.keep_checkpoints)
            self.world.barrier()
            self.last_saved_step = self.step
            return
        save_checkpoint(self.model, self.tokenizer, **common)
        prune_checkpoints(self.config.checkpoint_dir, self.config.keep_checkpoints)
        self.last_saved_step = self.step

    def _lr(self) -> float:
        factor = lr_factor(
            self.step,
            warmup_steps=self.config.warmup_steps,
            total_steps=self.config.training_steps,
            schedule=self.config.lr_schedule,
            floor=self.config.min_lr_ratio,
        )
        return self.config.base_lr * factor

    def _reference_logprobs(self, micro: MicroBatch) -> torch.Tensor | None:
        if self.config.beta == 0:
            return None
        with torch.no_grad():
            if self.reference is not None:
                ref = self.reference
                out = chunked_token_logprobs(
                    ref,
                    micro.input_ids,
                    micro.attention_mask,
                    micro.temperatures,
                    chunk_size=self.config.logprob_chunk_size,
                    positions=micro.loss_mask,
                )
                return out.logprobs
            with self.model.disable_adapter():
                out = chunked_token_logprobs(
                    self.model,
                    micro.input_ids,
                    micro.attention_mask,
                    micro.temperatures,
                    chunk_size=self.config.logprob_chunk_size,
                    positions=micro.loss_mask,
                )
            return out.logprobs

    def _forward_backward(self, batch: StepBatch) -> _Sums:
        """Every micro-batch's forward and backward (gradients accumulate); the sums for the
        step's metrics."""
        config = self.config
        sums = _Sums(
            env_tokens=[0.0] * len(batch.env_names), env_mismatch_kl=[0.0] * len(batch.env_names)
        )
        for micro_cpu in batch.micro_batches:
            micro = micro_cpu.to(config.device)
            out = chunked_token_logprobs(
                self.model,
                micro.input_ids,
                micro.attention_mask,
                micro.temperatures,
                chunk_size=config.logprob_chunk_size,
                with_entropy=True,
                positions=micro.loss_mask,  # the LM head scores trained tokens only
            )
            result = policy_loss(
                out.logprobs,
                micro.inference_logprobs,
                micro.advantages,
                micro.loss_mask,
                self.loss_settings,
                step_sequences=batch.sequences,
                step_tokens=batch.tokens,
                max_len=config.seq_len,
                ref_logp=self._reference_logprobs(micro),
                entropy=out.entropy,
            )
            # FSDP2 averages gradients over ranks; each loss is this rank's share of the sum
            (result.loss * self.world.world_size).backward()
            self._accumulate(sums, micro, out.logprobs.detach(), out.entropy, result, self.step)
            if self.recorder is not None:
                self.recorder.capture(out.logprobs, out.entropy, result.ratio)
        return sums

    def train_step(self, batch: StepBatch) -> dict[str, float]:
        """One optimizer step over all micro-batches of ``batch``; returns its metrics."""
        config = self.config
        started = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self._span("forward_backward"):
            sums = self._forward_backward(batch)
        with self._span("optimizer"):
            params = [p for p in self.model.parameters() if p.requires_grad]
            norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
            lr = self._lr()
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        if self.strategy is not None:
            with self._span("pause"):
                self.strategy.before_optimizer_step()
        with self._span("optimizer"):
            self.optimizer.step()
        if self.strategy is not None:
            with self._span("resume"):
                self.strategy.after_optimizer_step()
        self.optimizer.zero_grad(set_to_none=True)  # no gradients held while inference runs
        lag_base = self.step
        self.step += 1
        step_time = time.perf_counter() - started
        return self._metrics(sums.reduced(self.world), batch, lr, grad_norm, step_time, lag_base)

    @staticmethod
    def _accumulate(
        sums: _Sums,
        micro: MicroBatch,
        logp: torch.Tensor,
        entropy: torch.Tensor | None,
        result: LossOutput,
        version: int,
    ) -> None:
        """Add one micro-batch to ``sums``; ``version`` is the policy the trainer holds
        (sequences sampled at it are on-policy: their logprob difference is the weight
        sync's error alone, with no optimizer step in between)."""
        mask = micro.loss_mask
        diff = (logp - micro.inference_logprobs) * mask
        lag0 = mask * (micro.policy_versions == version).unsqueeze(1)
        sums.lag0_tokens += float(lag0.sum())
        sums.lag0_abs_diff += float((diff.abs() * lag0).sum())
        # k3 of KL(inference || trainer) per sampled token: exp(d) - 1 - d, d = trainer -
        # inference (loss.k3_kl with the inference logprobs in the policy's place)
        mismatch = k3_kl(micro.inference_logprobs, logp) * mask
        sums.mismatch_kl += float(mismatch.sum())
        sums.lag0_mismatch_kl += float((mismatch * lag0).sum())
        for env in range(len(sums.env_tokens)):
            rows = (micro.envs == env).unsqueeze(1)
            sums.env_tokens[env] += float((mask * rows).sum())
            sums.env_mismatch_kl[env] += float((mismatch * rows).sum())
        sums.tokens += float(mask.sum())
        sums.loss += float(result.loss.detach())
        sums.ratio += float((result.ratio * mask).sum())
        sums.clipped += float((result.clipped * mask).sum())
        sums.train_logp += float((logp * mask).sum())
        sums.inference_logp += float((micro.inference_logprobs * mask).sum())
        sums.diff += float(diff.sum())
        sums.abs_diff += float(diff.abs().sum())
        sums.max_diff = max(sums.max_diff, float(diff.abs().max()))
        if entropy is not None:
            sums.entropy += float((entropy.detach() * mask).sum())
        if result.kl is not None:
            sums.kl += float((result.kl * mask).sum())
        pos = mask * (micro.advantages > 0)
        neg = mask * (micro.advantages < 0)
        sums.pos_logp += float((logp * pos).sum())
        sums.pos_tokens += float(pos.sum())
        sums.neg_logp += float((logp * neg).sum())
        sums.neg_tokens += float(neg.sum())
        sums.processed_tokens += float(micro.attention_mask.sum())

    def _metrics(
        self,
        sums: _Sums,
        batch: StepBatch,
        lr: float,
        grad_norm: float,
        step_time: float,
        lag_base: int,
    ) -> dict[str, float]:
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
            "training_steps": float(self.config.training_steps),
        }
        peaks = self.world.gather(peak_memory_gb(self.config.device))
        if self.world.is_main:
            metrics["peak_memory_gb"] = max(peaks)
        if self.world.enabled:
            metrics.update({f"gpu_memory_gb/rank{r}": gb for r, gb in enumerate(peaks)})
        if self.config.beta > 0:
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

    def _maybe_sync(self) -> dict[str, float]:
        """Sync every ``sync_every`` steps with retries; stop when staleness exceeds the cap.

        A restart refused because the supervisor is shutting down is a stop request: no
        retry, and ``run`` checkpoints and returns (the supervisor is stopping us anyway).
        An inference restart seen between two attempts is followed first (``WeightPath``).
        """
        every = self.config.sync_every
        if self.strategy is None or every == 0:
            return {}
        metrics: dict[str, float] = {}
        failure = ""
        if self.step % every == 0:
            result, failure = self.path.attempt("weight sync")
            if self.stop_requested and result is None:
                return {}
            if result is not None:
                metrics["sync_time"] = result.sync_time
                metrics |= {f"sync/{name}_time": t for name, t in result.phases.items()}
        stale = self.step - self.last_synced_step
        if stale > self.config.max_sync_lag:
            raise SyncLagExceeded(
                f"inference still serves step {self.last_synced_step} weights after step "
                f"{self.step}: {stale} steps on stale weights is more than --max-sync-lag "
                f"{self.config.max_sync_lag}; stopping (a checkpoint of step {self.step} "
                f"is written, resume with --resume auto)"
                + (f" (last failure: {failure})" if failure else "")
            )
        metrics["policy_version"] = float(self.policy_version)
        return metrics


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


def loss_settings(config: TrainerConfig) -> LossSettings:
    """The loss knobs of ``config``."""
    return LossSettings(
        loss_type=config.loss_type,
        clip_low=config.clip_eps,
        clip_high=config.clip_high,
        beta=config.beta,
        tis_cap=config.tis_cap,
        entropy_coef=config.entropy_coef,
    )


@contextmanager
def stop_on_signals(trainer: Trainer) -> Iterator[None]:
    """While the trainer runs, SIGTERM and SIGINT finish the current step, checkpoint and
    exit 0. The previous handlers come back after: a trainer run in-process (a test, a
    notebook) must not leave its process deaf to SIGTERM and Ctrl-C."""
    import signal

    def handler(signum: int, frame: object) -> None:
        print(f"signal {signum}: finishing the current step, then saving", file=sys.stderr)
        trainer.request_stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
