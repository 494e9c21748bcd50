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

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial

import torch
from pydantic import ValidationError
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import PreTrainedTokenizerBase

from grpo_trainer.live_edits import EditWatcher
from grpo_trainer.ranks.group import Dist, rank_slice
from grpo_trainer.ranks.mirror import Consolidator
from grpo_trainer.records.timeline import sync_split
from grpo_trainer.run_notices import ModeSwitch
from grpo_trainer.sync.base import WeightSync
from grpo_trainer.sync.client import SyncError
from grpo_trainer.train.api_client import LeasedBatch
from grpo_trainer.train.checkpoint import (
    load_trainer_state,
    prune_checkpoints,
    save_checkpoint,
    set_rng_state,
)
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.data import DataError, StepBatch, build_step_batch, parse_groups
from grpo_trainer.train.dcp import has_sharded_state, load_sharded_state, save_sharded_checkpoint
from grpo_trainer.train.gradients import accumulate_gradients
from grpo_trainer.train.loss import LossSettings
from grpo_trainer.train.optim import build_optimizer, lr_factor
from grpo_trainer.train.phases import PhaseClock, per_rank
from grpo_trainer.train.recording import StepRecorder
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.resume import ResumePoint
from grpo_trainer.train.sources import BatchSource
from grpo_trainer.train.step_metrics import hyperparameters, step_metrics
from grpo_trainer.train.weight_path import SyncLagExceeded, WeightPath

READY_LINE = "grpo-trainer ready"
"""Printed once the data source is connected (the supervisor's log_line readiness probe)."""
SPLIT_PREFIX = "sync/split/"
"""A sync's seconds by phase (``sync_split``): ``sync/split/pause_s`` ... ``resume_s``."""


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
        switch_mode: Callable[[Trainer, ModeSwitch], None] | None = None,
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
        self.path = WeightPath(self, None if switch_mode is None else partial(switch_mode, self))
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
        self.loss_settings = LossSettings.of(config)
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
                metrics.update(hyperparameters(self.config))
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
                try:
                    self.strategy.close()
                except SyncError as exc:
                    self.reporter.event("error", f"weight sync did not close cleanly: {exc}")
            if self.recorder is not None:
                self.recorder.close()
        return self.step

    def _span(self, phase: str) -> AbstractContextManager[None]:
        """Time ``phase`` on the step timeline (a no-op without a recorder)."""
        return nullcontext() if self.recorder is None else self.recorder.span(phase)

    def _record_sync(self, start: float, metrics: dict[str, float]) -> None:
        """The sync as timeline spans: its split (``sync/split/<phase>_s``: wake, pause,
        transfer, finish, resume) laid end to end in that order."""
        if self.recorder is None:
            return
        at = start
        for key, seconds in metrics.items():
            if key.startswith(SPLIT_PREFIX):
                phase = key.removeprefix(SPLIT_PREFIX).removesuffix("_s")
                self.recorder.timeline.add(phase, at, at + seconds)
                at += seconds

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
        self.loss_settings = LossSettings.of(config)
        changes = ", ".join(f"{key} {current[key]} -> {value}" for key, value in new.items())
        self.reporter.event("info", f"live edit from step {self.step + 1}: {changes}")

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

    def train_step(self, batch: StepBatch) -> dict[str, float]:
        """One optimizer step over all micro-batches of ``batch``; returns its metrics."""
        config = self.config
        started = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self._span("forward_backward"):
            sums = accumulate_gradients(
                self.model,
                batch,
                config=config,
                settings=self.loss_settings,
                reference=self.reference,
                world=self.world,
                version=self.step,
                recorder=self.recorder,
            )
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
        return step_metrics(
            sums.reduced(self.world),
            batch,
            lr=lr,
            grad_norm=grad_norm,
            step_time=step_time,
            lag_base=lag_base,
            config=config,
            world=self.world,
        )

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
                split = sync_split(result.sync_time, result.phases)
                metrics |= {f"{SPLIT_PREFIX}{name}_s": t for name, t in split.items()}
            if self.path.failed_attempts:  # the sync's result for the dashboard's alert
                metrics["sync/failed_attempts"] = float(self.path.failed_attempts)
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
