"""Overrides: what a run changed since its profile, and the rules for changing it.

The supervisor asks for a role's spec rebuilt with new arguments (``respec``: a crash
restart, a mode switch, a restart with settings changed) or for a live edit. Either
becomes a new :class:`Overrides` value (:func:`respecified`, :func:`edited`) that the spec
builders read; the request is checked first and nothing is changed in place, so a refused
request leaves the run's overrides as they were.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.live_edits import EDITABLE, unknown_keys
from grpo_trainer.serve.settings import LORA_MODES, InferenceSettings, Mode
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.resume import ServedWeights, resume_point, served_at_start
from grpo_trainer.weight_dirs.layout import read_checkpoint
from grpo_tui.plan.settings import TRAINER_WIRED, RoleSettings, require, trainer_config

MODES: tuple[str, ...] = get_args(Mode)

KEYED: dict[str, type[BaseModel]] = {
    "api": ApiSettings,
    "inference": InferenceSettings,
    "trainer": TrainerConfig,
}
"""Roles whose restart arguments must be keys of their settings (an env's are checked by
validation alone)."""


@dataclass(frozen=True)
class Overrides:
    """The weight-sync mode, what inference serves, and settings changed since the profile.

    Never changed in place: each accepted request makes a new value.
    """

    mode: str
    inference_model: str | None = None
    """The model a restart asked inference to serve (a full checkpoint); None with no
    ``adapter`` either: what ``served_on_start`` finds when the spec is built."""
    adapter: str | None = None
    """The LoRA adapter a restart asked inference to serve on ``inference_model``."""
    keys: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Settings given at restarts and in live edits, by role process (``trainer``,
    ``env-1``): they win over the process's table in the profile."""


def respecified(
    settings: RoleSettings, overrides: Overrides, name: str, args: Mapping[str, Any]
) -> Overrides:
    """``overrides`` with a restart's ``args`` for role process ``name`` applied.

    ``mode`` switches the weight-sync mode (taken by inference and the trainer); inference
    also takes ``model`` (a full checkpoint to serve) and ``lora_path`` / ``adapter``
    (served on the base it was trained on). Without an explicit model or adapter, inference
    serves what ``served_on_start`` finds when its spec is built: the weights under the
    trainer's adapter, which a crash restart, a restart by key and a mode switch need.
    Any other key must be a field of the role's settings
    (e.g. ``lr`` for the trainer); its value is validated when the spec is built. Raises
    ``ValueError`` naming a bad key.
    """
    if name not in settings.roles:
        raise ValueError(f"{name!r} is not a role process")
    args = dict(args)
    mode = args.pop("mode", overrides.mode)
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    if name == "inference":
        model = args.pop("model", None)
        adapter = args.pop("lora_path", None) or args.pop("adapter", None)
        keys = _with_args(overrides.keys, name, args)
        if model is None and adapter is not None:
            model = adapter_base(adapter) or overrides.inference_model
        return replace(overrides, mode=mode, inference_model=model, adapter=adapter, keys=keys)
    keys = _with_args(overrides.keys, name, args)
    if name == "trainer":
        return replace(overrides, mode=mode, keys=keys)
    return replace(overrides, keys=keys)


def _with_args(
    keys: Mapping[str, Mapping[str, Any]], name: str, args: Mapping[str, Any]
) -> dict[str, Mapping[str, Any]]:
    """``keys`` with ``args`` added for role process ``name``; raises ``ValueError`` for a
    key its settings do not have."""
    if not args:
        return dict(keys)
    role = role_of(name)
    if role == "model":
        raise ValueError(f"{name} takes no restart arguments, got {sorted(args)}")
    if role in KEYED:
        known = set(KEYED[role].model_fields) - set(TRAINER_WIRED if role == "trainer" else ())
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"unknown {role} argument(s): {', '.join(unknown)}")
    return {**keys, name: {**keys.get(name, {}), **args}}


def edited(
    settings: RoleSettings, overrides: Overrides, values: Mapping[str, Any]
) -> tuple[Overrides, list[str]]:
    """``overrides`` with a live edit's values, and the role processes they reach.

    Checks what can be checked before validation: the keys are editable, the values
    numbers, the run has the roles, the mode uses the values. Raises ``ValueError`` naming
    the key and the reason.
    """
    if not values:
        raise ValueError(f"nothing to edit; editable: {', '.join(EDITABLE)}")
    unknown = unknown_keys(values)
    if unknown:
        raise ValueError(f"not editable: {', '.join(unknown)}; editable: {', '.join(EDITABLE)}")
    by_role: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"{key}: expected a finite number, got {value!r}")
        by_role.setdefault(EDITABLE[key], {})[key] = value
    names = [n for n in settings.roles if role_of(n) in by_role]
    missing = sorted(set(by_role) - {role_of(n) for n in names})
    if missing:
        raise ValueError(f"this run has no {' or '.join(missing)} to edit")
    if "trainer" in by_role:
        _check_beta(settings, overrides.mode, by_role["trainer"])
        _check_lr(settings, overrides.mode, by_role["trainer"])
    keys: Mapping[str, Mapping[str, Any]] = overrides.keys
    for name in names:
        keys = _with_args(keys, name, by_role[role_of(name)])
    return replace(overrides, keys=keys), names


def _check_beta(settings: RoleSettings, mode: str, args: Mapping[str, Any]) -> None:
    """The KL reference model is loaded only by a trainer that starts with beta > 0."""
    if "beta" not in args or mode in LORA_MODES:
        return
    try:
        beta = float(args["beta"])
    except (TypeError, ValueError):
        return  # the settings model names the bad value
    if beta > 0 and trainer_config(settings, mode).beta == 0:
        raise ValueError(
            f"beta: cannot go from 0 to {beta:g} while the trainer runs in mode {mode} "
            "(its KL reference model is loaded only when it starts with beta > 0): "
            "set [trainer] beta in the profile"
        )


def _check_lr(settings: RoleSettings, mode: str, args: Mapping[str, Any]) -> None:
    """An ``lr`` edit that the current mode would not use is refused, not ignored."""
    if "lr" not in args or "lora_lr" in args or mode not in LORA_MODES:
        return
    lora_lr = trainer_config(settings, mode).lora_lr
    if lora_lr is not None:
        raise ValueError(f"lr: mode {mode} trains with lora_lr ({lora_lr:g}): edit lora_lr")


def in_force(settings: RoleSettings, mode: str, key: str) -> Any:
    """The value of editable ``key`` in force (as its settings model parsed it)."""
    role = EDITABLE[key]
    if role == "trainer":
        return getattr(trainer_config(settings, mode), key)
    if role == "env":
        return getattr(require(settings.envs[0]), key)
    return getattr(require(settings.api), key)


def edit_reasons(error: ValidationError) -> str:
    """``key: reason (got value)`` for each error, as a refusal names them."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e.get('input')!r})"
        if e["loc"]
        else e["msg"].removeprefix("Value error, ")
        for e in error.errors(include_url=False)
    )


def role_of(name: str) -> str:
    """The role of a role process (``env-1`` is an ``env``)."""
    return "env" if name.startswith("env") else name


def served_on_start(settings: RoleSettings, overrides: Overrides) -> ServedWeights:
    """What inference loads when it starts under ``overrides``: the model and adapter a
    restart asked for, else the rule the trainer starts by (``resume.served_at_start`` at
    ``resume.resume_point``: the run's newest checkpoint, else the trainer's ``resume``
    path; docs/inference.md, "What inference serves"). Raises ``ValueError`` for a
    ``resume`` path that is no checkpoint."""
    if overrides.inference_model is not None or overrides.adapter is not None:
        return ServedWeights(model=overrides.inference_model, adapter=overrides.adapter)
    mode = overrides.mode
    resume = trainer_config(settings, mode).resume if "trainer" in settings.roles else "auto"
    return served_at_start(resume_point(settings.checkpoint_dir, mode, resume), mode)


def adapter_base(adapter: str) -> str | None:
    """The base model an adapter directory was trained on, if it records one.

    Our checkpoints record it in ``trainer_state.json``; any PEFT adapter has
    ``base_model_name_or_path`` in ``adapter_config.json``.
    """
    checkpoint = read_checkpoint(Path(adapter))
    if checkpoint is not None and checkpoint.base:
        return checkpoint.base
    try:
        config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    base = config.get("base_model_name_or_path")
    return base if isinstance(base, str) and base else None
