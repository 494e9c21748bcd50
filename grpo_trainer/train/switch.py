"""A weight-sync mode switch inside the running trainer, at a step boundary.

The supervisor's stack asks for it (``mode_switch.json``, ``grpo_tui/stack/modes.py``) when
inference keeps running through the switch and the trainer is one local process. The step
count, the API registration and its leased batches, and (between the full modes) the
optimizer state are kept:

1. the last step is synced in the old mode, so inference serves exactly the weights the
   new mode starts from;
2. the old strategy is closed (inference woken, generation resumed), and parameters that
   were views of the server's memory become the trainer's own;
3. full <-> LoRA (the trained parameter set changes): a checkpoint of the step, then a
   fresh adapter on the current weights (they are its base: ``step_N``, on disk before the
   adapter exists, so that a restarted server serves them under it) or the adapter
   merged in; a fresh optimizer, and the KL reference of the new mode. Measured on CPU
   against a restart of the trainer with its imports done: ``benchmarks/mode_switch.py``;
4. the new strategy attaches (shares, pushes or loads the weights), and after a change of
   the parameter set syncs once; the API learns the served version and name.

The trainer answers the stack with a ``mode_switched`` control request (``ModeSwitched``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from torch import nn

from grpo_trainer.control import ControlError
from grpo_trainer.run_notices import ModeSwitch, ModeSwitched
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.loss import LossSettings
from grpo_trainer.train.optim import build_optimizer
from grpo_trainer.train.policy import add_fresh_adapter, reference_model
from grpo_trainer.train.resume import resolve_resume, served_at_start
from grpo_trainer.train.strategy import make_strategy

if TYPE_CHECKING:
    from grpo_trainer.train.loop import Trainer

SWITCHED_IN_PLACE = "mode_switched_in_place"
"""``code`` of the trainer's event once it switched (``data``: ``old`` and ``new`` mode, the
``step``)."""
SWITCHED = ("weight_bridge_mode", "sync_every", "max_sync_lag", "none_reload")
"""The trainer settings a mode switch changes (the rest of the new command line is the
same run's)."""


def switched_config(config: TrainerConfig, argv: list[str]) -> TrainerConfig:
    """``config`` with the mode's settings of the trainer's command line in the new mode."""
    new = TrainerConfig.from_argv(argv)
    return TrainerConfig.model_validate(
        {**config.model_dump(), **{key: getattr(new, key) for key in SWITCHED}}
    )


def own_weights(model: nn.Module) -> None:
    """Parameters that are views of a server's memory (shared modes) become the trainer's:
    the next mode shares, pushes or loads them its own way."""
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()


def switch_in_place(trainer: Trainer, notice: ModeSwitch) -> None:
    """Switch ``trainer`` to ``notice.mode`` (see the module docstring); answers the stack."""
    started = time.perf_counter()
    old = trainer.config
    error = None
    try:
        if trainer.world.enabled:
            raise ValueError("a multi-rank trainer switches modes by restarting")
        _switch(trainer, switched_config(old, notice.argv))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        _answer(trainer, notice, time.perf_counter() - started, error)
    trainer.reporter.event(
        "info",
        f"weight-sync mode {old.weight_bridge_mode} -> {notice.mode} in place at step "
        f"{trainer.step} ({time.perf_counter() - started:.2f} s)",
        code=SWITCHED_IN_PLACE,
        data={"old": old.weight_bridge_mode, "new": notice.mode, "step": trainer.step},
    )


def _switch(trainer: Trainer, config: TrainerConfig) -> None:
    old = trainer.config
    if trainer.strategy is not None and trainer.last_synced_step < trainer.step:
        trainer.path.sync_now("weight sync before a mode switch")
    reshaped = old.is_lora != config.is_lora
    if reshaped:
        trainer.checkpoint()
    if trainer.strategy is not None:
        trainer.strategy.close()
    model = trainer.model
    if trainer.strategy is not None and trainer.strategy.shares_weights:
        own_weights(model)
    if reshaped and config.is_lora:
        # the adapter's base: the full weights at the switch, just checkpointed; found by
        # the rule every later start of inference loads by (docs/inference.md)
        point = resolve_resume(config.checkpoint_dir, config.weight_bridge_mode)
        base = served_at_start(point, config.weight_bridge_mode).model
        if base is None:
            raise RuntimeError(f"the switch's checkpoint is not in {config.checkpoint_dir}")
        trainer.base = base
        model = add_fresh_adapter(model, config, base)
        if config.gradient_checkpointing:
            model.enable_input_require_grads()
    elif reshaped:
        model = model.merge_and_unload()
        model.requires_grad_(True)
    trainer.config = config
    trainer.strategy = make_strategy(config, trainer.reporter.link)
    if trainer.strategy is not None:
        model = trainer.strategy.attach(model)
    trainer.model = model
    trainer.loss_settings = LossSettings.of(config)
    if reshaped:
        trainer.optimizer = build_optimizer(
            model, config.optimizer, config.base_lr, config.weight_decay
        )
        trainer.reference = reference_model(config)
        trainer.reporter.event(
            "info",
            f"fresh optimizer state from step {trainer.step + 1} (the trained parameter set "
            f"changed with the weight-sync mode)",
        )
        if trainer.strategy is not None:
            trainer.path.sync_now("weight sync after a mode switch")
    trainer.path.report()


def _answer(trainer: Trainer, notice: ModeSwitch, seconds: float, error: str | None) -> None:
    """The ``mode_switched`` request the stack waits for (best effort: no supervisor, no
    answer; a refusal is logged)."""
    link = trainer.reporter.link
    if link is None:
        return
    answer = ModeSwitched(
        serial=notice.serial, mode=notice.mode, step=trainer.step, seconds=seconds, error=error
    )
    try:
        link.request("mode_switched", args=answer.model_dump(), timeout=30.0)
    except ControlError as exc:
        trainer.reporter.event("warning", f"the supervisor did not take the switch's answer: {exc}")
