"""Assemble one trainer process from its config: resume point, policy, data, sync, reporting."""

from __future__ import annotations

import sys

import torch

from grpo_trainer.models import load_tokenizer
from grpo_trainer.sync.base import SyncContext, WeightSync
from grpo_trainer.sync.client import SyncError
from grpo_trainer.train.api_client import ApiClient, ApiRefused, ApiUnreachable, Registration
from grpo_trainer.train.config import EXIT_BAD_CONFIG, TrainerConfig
from grpo_trainer.train.data import DataError
from grpo_trainer.train.loop import SyncLagExceeded, Trainer, install_signal_handlers
from grpo_trainer.train.policy import build_policy, reference_model
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.resume import ResumePoint, resolve_resume, resume_from_path
from grpo_trainer.train.sources import ApiSource, BatchSource, FileSource


def resume_point(config: TrainerConfig) -> ResumePoint | None:
    """``--resume auto``: the rule in ``resolve_resume``; ``--resume PATH``: that checkpoint."""
    if config.resume is None:
        return None
    if config.resume == "auto":
        return resolve_resume(config.checkpoint_dir, config.weight_bridge_mode)
    return resume_from_path(config.resume, config.weight_bridge_mode)


def make_source(config: TrainerConfig, reporter: Reporter) -> BatchSource:
    """The offline file source when ``--batches-file`` is given, else the rollout API."""
    if config.batches_file is not None:
        return FileSource(config.batches_file, config.step_batch_size, wait=config.api_timeout)
    client = ApiClient(
        config.atropos_url,
        token=config.api_token,
        lease_seconds=config.lease_seconds,
        start_timeout=config.api_timeout,
        log=reporter.event,
    )
    registration = Registration(
        batch_size=config.step_batch_size,
        max_token_len=config.seq_len,
        checkpoint_dir=str(config.checkpoint_dir.resolve()),
        save_checkpoint_interval=config.checkpoint_interval,
        num_steps=config.training_steps,
        wandb_group=config.wandb_group or "",
        wandb_project=config.wandb_project or "",
    )
    return ApiSource(client, registration)


def make_strategy(config: TrainerConfig, reporter: Reporter) -> WeightSync | None:
    """The weight-sync strategy of ``--weight-bridge-mode`` (None with ``--sync-every 0``)."""
    if config.sync_every == 0:
        return None
    from grpo_trainer.sync.registry import make_strategy as registry_strategy

    context = SyncContext(
        inference_url=config.inference_url,
        served_model_name=config.served_model_name,
        checkpoint_dir=config.checkpoint_dir,
        backend=config.inference_backend,
    )
    return registry_strategy(config.weight_bridge_mode, context, link=reporter.link)


def _cannot_sync(reporter: Reporter, exc: SyncError) -> int:
    """A weight sync that cannot start (no supervisor, no server): one line, exit 2."""
    if reporter.link is not None:
        reporter.link.send_event("error", str(exc))
    print(f"error: {exc}", file=sys.stderr, flush=True)
    return EXIT_BAD_CONFIG


def run_session(config: TrainerConfig) -> int:
    """Run the trainer; returns the exit status: 0, 1 failure while running, 2 a weight
    sync that cannot start (before the first step), each with one clear line."""
    torch.manual_seed(config.seed)
    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    print(f"torch CPU threads: {torch.get_num_threads()}", file=sys.stderr, flush=True)
    reporter = Reporter.for_run(
        save_path=config.save_path,
        metrics_file=config.metrics_file,
        use_wandb=config.use_wandb,
        wandb_project=config.wandb_project,
        wandb_group=config.wandb_group,
        config=config.model_dump(mode="json"),
    )
    try:
        point = resume_point(config)
        if point is not None:
            reporter.event("info", f"resuming from {point.checkpoint} at step {point.step}")
        policy = build_policy(config, point)
        try:
            trainer = Trainer(
                config,
                policy.model,
                load_tokenizer(config.model_name),
                base=policy.base,
                source=make_source(config, reporter),
                reporter=reporter,
                strategy=make_strategy(config, reporter),
                reference=reference_model(config),
                resume=point,
            )
        except SyncError as exc:
            return _cannot_sync(reporter, exc)
        install_signal_handlers(trainer)
        step = trainer.run()
        reporter.event("info", f"trainer stopped at step {step} of {config.training_steps}")
        return 0
    except (ApiUnreachable, ApiRefused, DataError, SyncLagExceeded, ValueError) as exc:
        reporter.event("error", str(exc))
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        reporter.close()
