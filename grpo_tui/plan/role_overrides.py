"""Run-time overrides of the role layer: restart arguments, mode switches and live edits.

The supervisor asks the role layer to rebuild a role's spec with new arguments (``respec``:
a crash restart, a mode switch, a restart with settings changed) or to take a live edit
(``edit``). Either is validated like the profile and applied to the layer's state, which
is snapshotted first and restored on any refusal, so a bad request changes nothing.
Mixed into :class:`grpo_tui.plan.roles.RoleLayer`, whose state and spec builders it uses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.live_edits import EDITABLE, record_edit, unknown_keys
from grpo_trainer.serve.settings import LORA_MODES, InferenceSettings, Mode
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.resume import read_checkpoint, resolve_resume
from grpo_tui.plan.placement import GpuPlan
from grpo_tui.supervisor.spec import ProcessSpec

MODES: tuple[str, ...] = get_args(Mode)
ValueT = TypeVar("ValueT")

TRAINER_WIRED = {
    "model_name": "run.model",
    "atropos_url": "[api]",
    "api_token": "api.token (in the trainer's environment, GRPO_API_TOKEN)",
    "inference_url": "[inference]",
    "served_model_name": "inference.served_model_name",
    "inference_backend": "inference.backend",
    "weight_bridge_mode": "run.mode (or --mode)",
    "save_path": "the run directory (RUN/checkpoints)",
}
"""Trainer keys the role layer derives from other tables (key -> source); not for profiles."""


class RoleOverrides:
    """Restart arguments, mode switches and live edits, applied to the role layer's state."""

    mode: str
    inference_model: str | None
    adapter: str | None
    api: ApiSettings | None
    inference: InferenceSettings | None
    envs: list[EnvSettings | None]
    gpu_plan: GpuPlan
    run_dir: Path
    _tables: dict[str, dict[str, Any]]

    if TYPE_CHECKING:  # provided by RoleLayer

        @property
        def roles(self) -> list[str]: ...

        @property
        def checkpoint_dir(self) -> Path: ...

        def trainer_config(self) -> TrainerConfig: ...

        def spec(self, name: str) -> ProcessSpec: ...

        def _place(self) -> GpuPlan: ...

    @staticmethod
    def _require(settings: ValueT | None) -> ValueT:
        if settings is None:
            raise ValueError("settings did not validate")
        return settings

    def respec(self, name: str, args: Mapping[str, Any]) -> ProcessSpec:
        """Rebuild the spec of role process ``name`` with ``args`` applied and kept.

        ``mode`` switches the weight-sync mode for every role; inference also takes
        ``model`` (a full checkpoint to serve) and ``lora_path`` / ``adapter`` (served on
        the base it was trained on). Without an explicit model or adapter, inference serves
        the newest checkpoint of the mode (``resolve_resume``), which is what a crash
        restart or a mode switch needs. Any other key must be a field of the role's
        settings (e.g. ``lr`` for the trainer). Raises ``ValueError`` (or pydantic's
        ``ValidationError``) naming a bad key or value; nothing is changed then.
        """
        if name not in self.roles:
            raise ValueError(f"{name!r} is not a role process")
        args = dict(args)
        mode = args.pop("mode", self.mode)
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        saved = self._snapshot()
        try:
            self._apply(name, mode, args)
            gpu_plan = self._place()
            if gpu_plan.problems:
                raise ValueError("; ".join(str(p) for p in gpu_plan.problems))
            self.gpu_plan = gpu_plan
            return self.spec(name)
        except (ValueError, ValidationError):
            self._restore(saved)
            raise

    def _apply(self, name: str, mode: str, args: dict[str, Any]) -> None:
        if name == "inference":
            model = args.pop("model", None)
            adapter = args.pop("lora_path", None) or args.pop("adapter", None)
            self._apply_settings("inference", InferenceSettings, args)
            self.mode = mode
            if model is None and adapter is None:
                model, adapter = self._newest_checkpoint()
            elif model is None:
                model = adapter_base(adapter) or self.inference_model
            self.inference_model, self.adapter = model, adapter
        elif name == "trainer":
            self._apply_settings("trainer", TrainerConfig, args)
            self.mode = mode
        elif name.startswith("env"):
            index = 0 if name == "env" else int(name.removeprefix("env-"))
            self._apply_env(index, args)
        elif name == "api":
            self._apply_settings("api", ApiSettings, args)
        elif args:
            raise ValueError(f"{name} takes no restart arguments, got {sorted(args)}")

    def edit(self, values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Validate a live edit like the profile, keep it for every restart and write the
        values in force to the run directory (``grpo_trainer.live_edits``).

        Returns (the values as the settings models parsed them, the processes they reach).
        Raises ``ValueError`` naming the key and the reason; nothing changes then.
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
        names = [n for n in self.roles if _role_of(n) in by_role]
        missing = sorted(set(by_role) - {_role_of(n) for n in names})
        if missing:
            raise ValueError(f"this run has no {' or '.join(missing)} to edit")
        if "trainer" in by_role:
            self._check_beta(by_role["trainer"])
            self._check_lr(by_role["trainer"])
        saved = self._snapshot()
        try:
            for name in names:
                self._apply(name, self.mode, dict(by_role[_role_of(name)]))
            parsed = {key: self._in_force(key) for key in values}
            record_edit(self.run_dir, parsed)
        except ValidationError as error:
            self._restore(saved)
            raise ValueError(_edit_reasons(error)) from None
        except OSError as error:
            self._restore(saved)
            raise ValueError(f"cannot record the edit in {self.run_dir}: {error}") from None
        except ValueError:
            self._restore(saved)
            raise
        return parsed, names

    def _check_beta(self, args: Mapping[str, Any]) -> None:
        """The KL reference model is loaded only by a trainer that starts with beta > 0."""
        if "beta" not in args or self.mode in LORA_MODES:
            return
        try:
            beta = float(args["beta"])
        except (TypeError, ValueError):
            return  # the settings model names the bad value
        if beta > 0 and self.trainer_config().beta == 0:
            raise ValueError(
                f"beta: cannot go from 0 to {beta:g} while the trainer runs in mode {self.mode} "
                "(its KL reference model is loaded only when it starts with beta > 0): "
                "set [trainer] beta in the profile"
            )

    def _check_lr(self, args: Mapping[str, Any]) -> None:
        """An ``lr`` edit that the current mode would not use is refused, not ignored."""
        lora = self.mode in LORA_MODES and self.trainer_config().lora_lr is not None
        if "lr" in args and "lora_lr" not in args and lora:
            raise ValueError(
                f"lr: mode {self.mode} trains with lora_lr "
                f"({self.trainer_config().lora_lr:g}): edit lora_lr"
            )

    def _in_force(self, key: str) -> Any:
        role = EDITABLE[key]
        if role == "trainer":
            return getattr(self.trainer_config(), key)
        if role == "env":
            return getattr(self._require(self.envs[0]), key)
        return getattr(self._require(self.api), key)

    def _snapshot(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "inference_model": self.inference_model,
            "adapter": self.adapter,
            "api": self.api,
            "inference": self.inference,
            "envs": list(self.envs),
            "gpu_plan": self.gpu_plan,
            "_tables": {k: dict(v) for k, v in self._tables.items()},
        }

    def _restore(self, saved: Mapping[str, Any]) -> None:
        for attribute, value in saved.items():
            setattr(self, attribute, value)

    def _apply_settings(self, role: str, model: type[BaseModel], args: Mapping[str, Any]) -> None:
        if not args:
            return
        known = set(model.model_fields) - set(TRAINER_WIRED if role == "trainer" else ())
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"unknown {role} argument(s): {', '.join(unknown)}")
        table = {**self._tables[role], **args}
        if role == "trainer":
            previous = self._tables["trainer"]
            self._tables["trainer"] = table
            try:
                self.trainer_config()
            except ValidationError:
                self._tables["trainer"] = previous
                raise
            return
        settings = model.model_validate(table)
        self._tables[role] = table
        setattr(self, role, settings)

    def _apply_env(self, index: int, args: Mapping[str, Any]) -> None:
        if not args:
            return
        current = self._require(self.envs[index])
        self.envs[index] = EnvSettings.model_validate({**current.model_dump(), **args})

    def _newest_checkpoint(self) -> tuple[str | None, str | None]:
        """Model and adapter of the newest checkpoint usable in the current mode.

        In a full mode a newer adapter is not served (the trainer merges it and inference
        catches up at the first sync); only its base model is.
        """
        point = resolve_resume(self.checkpoint_dir, self.mode)
        if point is None:
            return None, None
        adapter = point.adapter_path if self.mode in LORA_MODES else None
        return point.model_path, adapter


def _role_of(name: str) -> str:
    """The role of a role process (``env-1`` is an ``env``)."""
    return "env" if name.startswith("env") else name


def _edit_reasons(error: ValidationError) -> str:
    """``key: reason (got value)`` for each error, as a refusal names them."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e.get('input')!r})"
        if e["loc"]
        else e["msg"].removeprefix("Value error, ")
        for e in error.errors(include_url=False)
    )


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
