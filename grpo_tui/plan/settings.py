"""Role settings: each role's table from a profile, validated, as one immutable value.

:class:`RoleSettings` holds the raw role tables (placement keys taken out), the settings
models they validate into, where each role process sits on a cluster, and the problems
found reading them (``grpo_tui.plan.checks.read_settings`` builds it). What follows from
the settings alone lives here too: the role processes, the model path, the addresses the
roles reach each other at, and the trainer's settings wired to the others. A restart or a
live edit never changes a value: :func:`with_keys` returns new settings. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.serve.capabilities import restarts_inference
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.train.config import TrainerConfig
from grpo_tui.plan.cluster import Allocation, ClusterSettings, Placed
from grpo_tui.plan.profile import Problem, Profile
from grpo_tui.supervisor.control import ControlEndpoint

ValueT = TypeVar("ValueT")

RESTART_SYNC_EVERY = 4
"""Sync cadence of the modes whose every sync restarts the inference server (unless the
profile sets ``sync_every``); inference then serves weights up to ``RESTART_SYNC_EVERY - 1``
steps old (``max_sync_lag``)."""

ANY_ADDRESS = "0.0.0.0"

TRAINER_WIRED = {
    "model_name": "run.model",
    "atropos_url": "[api]",
    "api_token": "api.token (in the trainer's environment, GRPO_API_TOKEN)",
    "inference_url": "[inference]",
    "served_model_name": "inference.served_model_name",
    "inference_backend": "inference.backend",
    "none_reload": "inference.none_reload",
    "weight_bridge_mode": "run.mode (or --mode)",
    "save_path": "the run directory (RUN/checkpoints)",
}
"""Trainer keys the role layer derives from other tables (key -> source); not for profiles."""

TRAINER_ROLE_KEYS = ("gpus", "ranks")
"""Keys of the ``[trainer]`` table that the role layer reads and the trainer never sees."""

ENV_WIRED = {"model_name": "inference.served_model_name", "prompt_copies": "inference.backend"}
"""``[[env]]`` keys the role layer sets from the inference settings; not for profiles."""


@dataclass(frozen=True)
class RoleSettings:
    """Every role's validated settings and raw table, read from one profile for one run.

    ``tables`` maps each role process (``api``, ``inference``, ``trainer``, ``env`` or
    ``env-N``) to its table without the placement keys; a settings model is ``None`` where
    its table did not validate (``problems`` says why, and no plan is built then).
    """

    profile: Profile
    run_dir: Path
    cluster: ClusterSettings
    allocation: Allocation
    token: str | None
    """The run's bearer token on a cluster (``api.token`` or a fresh one), else None."""
    tables: Mapping[str, Mapping[str, Any]]
    api: ApiSettings | None
    inference: InferenceSettings | None
    envs: tuple[EnvSettings | None, ...]
    trainer_gpus: tuple[int, ...]
    trainer_ranks: int
    placements: Mapping[str, Placed]
    """Where each role process sits on the cluster's allocation (only those the table places)."""
    problems: tuple[Problem, ...]

    @property
    def seed(self) -> int:
        return self.profile.run.seed

    @property
    def model_path(self) -> str:
        """The base model: ``RUN/model`` for the tiny model, else the hub id or path."""
        if self.profile.run.tiny_model:
            return str(self.run_dir / "model")
        return self.profile.run.model

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def roles(self) -> list[str]:
        """Role processes this profile defines, in start order."""
        profile = self.profile
        names = [r for r in ("api", "inference", "trainer") if profile.has_role(r)]
        names += [env_name(i, len(self.envs)) for i in range(len(self.envs))]
        if profile.run.tiny_model and any(
            profile.has_role(r) for r in ("inference", "trainer", "env")
        ):
            names.insert(0, "model")
        return names

    def node_of(self, name: str) -> int:
        """1-based node of the allocation where process ``name`` starts (1: supervisor's)."""
        placed = self.placements.get(name)
        return placed.placement.node if placed is not None else 1

    def address(self, name: str) -> str:
        """The address of the node process ``name`` runs on."""
        return self.allocation.address(self.node_of(name))

    def _url(self, role: str, port: int, local: str) -> str:
        """How the others reach ``role``: by its node's address on a cluster."""
        if not self.cluster.slurm:
            return local
        return f"http://{self.address(role)}:{port}"

    @property
    def api_url(self) -> str:
        api = self.api or ApiSettings()
        return self._url("api", api.port, api.url)

    @property
    def inference_url(self) -> str:
        inference = self.inference or InferenceSettings()
        if inference.url is not None:  # a server the run attaches to, wherever it is
            return inference.url
        return self._url("inference", inference.port, inference.base_url)

    @property
    def control_endpoint(self) -> ControlEndpoint | None:
        """On a cluster: the control socket's TCP side on the first node, for the steps."""
        if not self.cluster.slurm or self.token is None:
            return None
        return ControlEndpoint(
            address=self.allocation.address(1), port=self.cluster.control_port, token=self.token
        )


def env_name(index: int, count: int) -> str:
    """The process name of ``[[env]]`` table ``index`` of ``count``: ``env`` when alone."""
    return "env" if count == 1 else f"env-{index}"


def env_index(name: str) -> int:
    """The ``[[env]]`` index of env process ``name``."""
    return 0 if name == "env" else int(name.removeprefix("env-"))


def require(settings: ValueT | None) -> ValueT:
    """Settings that validated (a plan is built only when every role's did)."""
    if settings is None:
        raise ValueError("settings did not validate")
    return settings


def api_settings(
    table: Mapping[str, Any], cluster: ClusterSettings, token: str | None
) -> ApiSettings:
    """``[api]`` validated: on a cluster it listens beyond loopback, with the run's token."""
    defaults: dict[str, Any] = {"host": ANY_ADDRESS} if cluster.slurm else {}
    if token is not None:
        defaults["token"] = token
    return ApiSettings.model_validate({**defaults, **table})


def inference_settings(
    table: Mapping[str, Any], cluster: ClusterSettings, seed: int
) -> InferenceSettings:
    """``[inference]`` validated, seeded by the run (and beyond loopback on a cluster)."""
    defaults: dict[str, Any] = {"seed": seed}
    if cluster.slurm:
        defaults["host"] = ANY_ADDRESS
    return InferenceSettings.model_validate({**defaults, **table})


def env_settings(table: Mapping[str, Any], index: int, seed: int, served: str) -> EnvSettings:
    """``[[env]]`` table ``index`` validated: its own seed, asking for the served model."""
    return EnvSettings.model_validate({"seed": seed + index, **table, "model_name": served})


def served_name(inference: InferenceSettings | None) -> str:
    return inference.served_model_name if inference else "policy"


def trainer_config(settings: RoleSettings, mode: str) -> TrainerConfig:
    """The trainer's settings in ``mode``: the ``[trainer]`` table plus the wiring to the
    others. Raises pydantic's ``ValidationError``."""
    inference = settings.inference or InferenceSettings()
    group_sizes = {env.group_size for env in settings.envs if env is not None}
    defaults: dict[str, Any] = {"seed": settings.seed, "resume": "auto"}
    if restarts_inference(mode, inference.none_reload):
        # Each sync restarts the inference server (seconds on a CPU, a minute for vLLM):
        # sync every few steps unless the profile says otherwise.
        defaults.update(sync_every=RESTART_SYNC_EVERY, max_sync_lag=RESTART_SYNC_EVERY - 1)
    if len(group_sizes) == 1:
        defaults["group_size"] = group_sizes.pop()
    placed = settings.placements.get("trainer")
    if settings.trainer_gpus or (placed and placed.placement.gpus_per_node):
        defaults["device"] = "cuda"  # each rank sees only its GPUs
    wiring: dict[str, Any] = {
        "model_name": settings.model_path,
        "atropos_url": settings.api_url,
        "inference_url": settings.inference_url,
        "served_model_name": inference.served_model_name,
        "inference_backend": inference.backend,
        "none_reload": inference.none_reload,
        "weight_bridge_mode": mode,
        "save_path": str(settings.checkpoint_dir),
    }
    skip = {*TRAINER_WIRED, *TRAINER_ROLE_KEYS}
    table = {k: v for k, v in settings.tables["trainer"].items() if k not in skip}
    if mode == "colocate":
        # The engine sleeps through every step: it must wake on fresh weights each time.
        table.update(sync_every=1, max_sync_lag=0)
    return TrainerConfig.model_validate({**defaults, **table, **wiring})


def with_keys(
    settings: RoleSettings, keys: Mapping[str, Mapping[str, Any]], mode: str
) -> RoleSettings:
    """``settings`` with ``keys`` (role process -> keys) over the tables, validated as the
    profile's are (the trainer's in ``mode``). Raises pydantic's ``ValidationError``."""
    if not keys:
        return settings
    tables = {name: {**table, **keys.get(name, {})} for name, table in settings.tables.items()}
    api, inference = settings.api, settings.inference
    if "api" in keys:
        api = api_settings(tables["api"], settings.cluster, settings.token)
    if "inference" in keys:
        inference = inference_settings(tables["inference"], settings.cluster, settings.seed)
    updated = replace(settings, tables=tables, api=api, inference=inference)
    if "trainer" in keys:
        trainer_config(updated, mode)
    count = len(settings.envs)
    envs = tuple(
        env_settings(tables[env_name(i, count)], i, settings.seed, served_name(inference))
        if env_name(i, count) in keys
        else env
        for i, env in enumerate(settings.envs)
    )
    return replace(updated, envs=envs)
