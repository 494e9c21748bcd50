"""Assemble one trainer process from its config: resume point, policy, data, sync, reporting."""

from __future__ import annotations

import os
import sys

import torch
from transformers import PreTrainedTokenizerBase

from grpo_trainer.api.settings import TOKEN_ENV
from grpo_trainer.models import load_tokenizer
from grpo_trainer.ranks.group import Dist, init_distributed, shutdown_distributed
from grpo_trainer.sync.base import WeightSync
from grpo_trainer.sync.client import InferenceClient, SyncError
from grpo_trainer.train.api_client import ApiClient, ApiRefused, ApiUnreachable, Registration
from grpo_trainer.train.config import EXIT_BAD_CONFIG, TrainerConfig
from grpo_trainer.train.data import DataError
from grpo_trainer.train.loop import Trainer, stop_on_signals
from grpo_trainer.train.memory_fit import GpuDoesNotFit, footprint, startup_problem
from grpo_trainer.train.policy import build_policy, reference_model
from grpo_trainer.train.recording import StepRecorder, fast_decode
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.resume import RESUMED, ResumePoint, resume_point
from grpo_trainer.train.sources import ApiSource, BatchSource, FileSource
from grpo_trainer.train.strategy import make_strategy, sync_context
from grpo_trainer.train.switch import switch_in_place
from grpo_trainer.train.weight_path import SyncLagExceeded


def make_source(config: TrainerConfig, reporter: Reporter) -> BatchSource:
    """The offline file source when ``--batches-file`` is given, else the rollout API."""
    if config.batches_file is not None:
        return FileSource(config.batches_file, config.step_batch_size, wait=config.api_timeout)
    client = ApiClient(
        config.atropos_url,
        token=config.api_token or os.environ.get(TOKEN_ENV),
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


def wait_for_inference(
    config: TrainerConfig, reporter: Reporter, strategy: WeightSync | None
) -> None:
    """Before the first weight attach: wait for the inference server's ``/health``.

    The role layer starts the trainer alongside inference where the GPU allows it (a fixed
    KV cache, or other GPUs), so that the model loads while the server starts; here the
    trainer waits for the server, at most ``inference_timeout`` seconds (``SyncError``
    then), saying what it waits for when it starts waiting and every 15 s after. Returns at
    once when the server is up already. Only where something needs the server before the
    first step: a ``strategy`` whose attach talks to it, or a GPU whose room is to be
    checked beside it (``gpu_fit_problem``).
    """
    if strategy is None:
        return
    if not strategy.attaches_at_server and not config.device.startswith("cuda"):
        return
    client = InferenceClient(config.inference_url)
    url, limit = config.inference_url, config.inference_timeout

    def say(seconds: float) -> None:
        reporter.event(
            "info",
            f"waiting for inference at {url}/health (it starts alongside; needed before the "
            f"first step): {seconds:.0f} s of at most {limit:.0f} s (inference_timeout)",
        )

    try:
        waited = client.wait_healthy(limit, say)
    finally:
        client.close()
    if waited >= 1.0:
        reporter.event("info", f"inference healthy after {waited:.1f} s with the model loaded")


def make_recorder(
    config: TrainerConfig, tokenizer: PreTrainedTokenizerBase, reporter: Reporter, world: Dist
) -> StepRecorder | None:
    """This rank's records of what it trained on and when (``recording.py``); every rank
    calls it (the ranks agree on a random id for this trainer process)."""
    return StepRecorder.for_trainer(
        config.save_path,
        fast_decode(tokenizer),
        max_mb=config.record_rollouts_mb,
        every=config.record_rollouts_every,
        rank=world.rank,
        session=world.broadcast(int.from_bytes(os.urandom(4), "little")),
        on_error=lambda message: reporter.event("warning", message),
    )


def gpu_fit_problem(config: TrainerConfig, model: torch.nn.Module) -> str | None:
    """Before the first step, on the GPU vLLM shares: is there room for the optimizer state?

    In ``shared_vllm`` the trainer's own copy of the weights is about to be freed (its
    parameters become views of vLLM's), so that memory counts as free.
    """
    if not config.device.startswith("cuda"):
        return None
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    need = footprint(
        config.weight_bridge_mode, params, config.dtype, config.optimizer, config.inference_backend
    )
    if need is None:
        return None
    free, total = torch.cuda.mem_get_info(torch.device(config.device))
    if not need.own_weights:
        free += sum(p.numel() * p.element_size() for p in model.parameters())
    return startup_problem(need, free_bytes=free, total_bytes=total)


def _cannot_sync(reporter: Reporter, exc: Exception) -> int:
    """A weight sync that cannot start (no supervisor, no server, no room on the GPU beside
    vLLM): one line, exit 2."""
    if reporter.link is not None:
        reporter.link.send_event("error", str(exc))
    print(f"error: {exc}", file=sys.stderr, flush=True)
    return EXIT_BAD_CONFIG


def _sharded_trainer(
    config: TrainerConfig, world: Dist, reporter: Reporter, point: ResumePoint | None
) -> Trainer:
    """The multi-rank trainer: policy loaded on CPU in float32, sharded with FSDP2.

    Rank 0 alone leases batches, reports and talks to inference (through ``ShardedSync``);
    every rank holds a shard and takes part in each collective.
    """
    from grpo_trainer.models import DTYPES
    from grpo_trainer.ranks.mirror import Consolidator
    from grpo_trainer.sync.sharded import ShardedSync
    from grpo_trainer.train.fsdp import shard_model

    on_cpu = config.model_copy(
        update={"device": "cpu", "dtype": "float32", "gradient_checkpointing": False}
    )
    policy = build_policy(on_cpu, point)
    consolidator = Consolidator(policy.model, world, config.dtype)
    strategy: WeightSync | None = None
    if config.sync_every and config.weight_bridge_mode == "colocate":
        from grpo_trainer.sync.colocate_ranks import ColocateRanksSync

        strategy = ColocateRanksSync(sync_context(config), world=world, dtype=DTYPES[config.dtype])
    elif config.sync_every:
        strategy = ShardedSync(
            sync_context(config),
            mode=config.weight_bridge_mode,
            inner=make_strategy(config, reporter.link) if world.is_main else None,
            world=world,
            consolidator=consolidator,
            dtype=DTYPES[config.dtype],
        )
    wait_for_inference(config, reporter, strategy)  # every rank: the attach is collective
    shard = {"dtype": config.dtype, "cpu_offload": config.cpu_offload}
    model = shard_model(
        policy.model, world, activation_checkpointing=config.gradient_checkpointing, **shard
    )
    reference = reference_model(on_cpu)
    if reference is not None:
        reference = shard_model(reference, world, **shard)
    tokenizer = load_tokenizer(config.model_name)
    return Trainer(
        config,
        model,
        tokenizer,
        base=policy.base,
        source=make_source(config, reporter) if world.is_main else None,
        reporter=reporter,
        strategy=strategy,
        reference=reference,
        resume=point,
        world=world,
        consolidator=consolidator,
        recorder=make_recorder(config, tokenizer, reporter, world),
        switch_mode=switch_in_place,
    )


def _trainer(config: TrainerConfig, reporter: Reporter, point: ResumePoint | None) -> Trainer:
    """The single-process trainer: one device, no process group. The GPU's room is checked
    once inference is up (it may start alongside)."""
    policy = build_policy(config, point)
    strategy = make_strategy(config, reporter.link)
    wait_for_inference(config, reporter, strategy)
    problem = gpu_fit_problem(config, policy.model)
    if problem is not None:
        raise GpuDoesNotFit(problem)
    tokenizer = load_tokenizer(config.model_name)
    return Trainer(
        config,
        policy.model,
        tokenizer,
        base=policy.base,
        source=make_source(config, reporter),
        reporter=reporter,
        strategy=strategy,
        reference=reference_model(config),
        resume=point,
        recorder=make_recorder(config, tokenizer, reporter, Dist(device=config.device)),
        switch_mode=switch_in_place,
    )


def run_session(config: TrainerConfig) -> int:
    """Run the trainer; returns the exit status: 0, 1 failure while running, 2 a weight
    sync that cannot start (before the first step), each with one clear line.

    Under torchrun with ``WORLD_SIZE`` > 1 every rank runs this; rank 0 reports.
    """
    world = init_distributed(config.device)
    try:
        return _run(config.model_copy(update={"device": world.device}), world)
    finally:
        shutdown_distributed(world)


def _run(config: TrainerConfig, world: Dist) -> int:
    torch.manual_seed(config.seed)
    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    print(f"torch CPU threads: {torch.get_num_threads()}", file=sys.stderr, flush=True)
    if world.is_main:
        reporter = Reporter.for_run(
            save_path=config.save_path,
            metrics_file=config.metrics_file,
            use_wandb=config.use_wandb,
            wandb_project=config.wandb_project,
            wandb_group=config.wandb_group,
            config=config.model_dump(mode="json"),
        )
    else:
        reporter = Reporter(link=None, metrics_path=None)
    try:
        point = resume_point(config.checkpoint_dir, config.weight_bridge_mode, config.resume)
        if point is not None:
            reporter.event(
                "info",
                f"resuming from {point.checkpoint} at step {point.step}",
                code=RESUMED,
                data={"step": point.step, "checkpoint": str(point.checkpoint)},
            )
        try:
            if world.enabled:
                trainer = _sharded_trainer(config, world, reporter, point)
            else:
                trainer = _trainer(config, reporter, point)
        except (SyncError, GpuDoesNotFit) as exc:
            return _cannot_sync(reporter, exc)
        with stop_on_signals(trainer):
            step = trainer.run()
        reporter.event("info", f"trainer stopped at step {step} of {config.training_steps}")
        return 0
    except (ApiUnreachable, ApiRefused, DataError, SyncLagExceeded, ValueError) as exc:
        reporter.event("error", str(exc))
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        reporter.close()
