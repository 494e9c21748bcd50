"""Profile -> role settings, and the checks across them: each check returns its problems.

:func:`read_settings` validates every role table into :class:`RoleSettings`, problems and
all; :func:`memory_fit` needs a weight-sync mode too, and :func:`read_adjustments` reads
the ``[process.<role process>]`` tables beside them (the cluster's placement checks are
``grpo_tui.plan.topology.cluster_problems``). Every problem names its key, so that
``grpo-tui check`` lists them all in one pass.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.memory_fit import fit_problem, footprint, param_count, read_model_config
from grpo_tui.plan.cluster import (
    Allocation,
    ClusterSettings,
    NodePlacement,
    Placed,
    split_placement,
)
from grpo_tui.plan.placement import trainer_gpus, trainer_ranks
from grpo_tui.plan.process_tables import expand_depends_on
from grpo_tui.plan.profile import Problem, Profile
from grpo_tui.plan.settings import (
    ENV_WIRED,
    TRAINER_WIRED,
    RoleSettings,
    api_settings,
    env_name,
    env_settings,
    inference_settings,
    served_name,
    trainer_config,
)
from grpo_tui.plan.toml_keys import KeyPath

SettingsT = TypeVar("SettingsT", bound=BaseModel)

ROLE_OWNED = ("name", "role", "command")
"""Keys a ``[process.<role process>]`` table cannot change: they come from the role."""


@dataclass(frozen=True)
class Reading(Generic[SettingsT]):
    """One role table as read: its own keys, its cluster placement, its settings, problems."""

    table: dict[str, Any]
    placed: Placed | None = None
    settings: SettingsT | None = None
    problems: list[Problem] = field(default_factory=list)


def read_settings(
    profile: Profile, run_dir: Path, allocation: Allocation | None = None
) -> RoleSettings:
    """Every role table of ``profile`` validated for a run in ``run_dir``, with the problems.

    ``allocation`` gives a cluster profile its real nodes (inside a Slurm job); without it
    they are named ``node1`` ...
    """
    cluster, problems = _cluster(profile)
    seed, token = profile.run.seed, _run_token(profile, cluster)
    api = _read(
        profile,
        cluster,
        "api",
        ("api",),
        profile.table("api"),
        ApiSettings,
        partial(api_settings, cluster=cluster, token=token),
    )
    inference = _read(
        profile,
        cluster,
        "inference",
        ("inference",),
        profile.table("inference"),
        InferenceSettings,
        partial(inference_settings, cluster=cluster, seed=seed),
    )
    served = served_name(inference.settings)
    env_tables = list(profile.table("env") or [])
    env_names = [env_name(index, len(env_tables)) for index in range(len(env_tables))]
    envs = {
        name: _read(
            profile,
            cluster,
            name,
            ("env", index),
            raw,
            EnvSettings,
            partial(env_settings, index=index, seed=seed, served=served),
            wired=ENV_WIRED,
        )
        for index, (name, raw) in enumerate(zip(env_names, env_tables, strict=True))
    }
    trainer, gpus, ranks = _read_trainer(profile, cluster)
    readings: dict[str, Reading[Any]] = {
        "api": api,
        "inference": inference,
        **envs,
        "trainer": trainer,
    }
    settings = RoleSettings(
        profile=profile,
        run_dir=run_dir,
        cluster=cluster,
        allocation=allocation or Allocation.symbolic(cluster.nodes),
        token=token,
        tables={name: reading.table for name, reading in readings.items()},
        api=api.settings,
        inference=inference.settings,
        envs=tuple(reading.settings for reading in envs.values()),
        trainer_gpus=gpus,
        trainer_ranks=ranks,
        placements={n: r.placed for n, r in readings.items() if r.placed is not None},
        problems=(),
    )
    problems += [problem for reading in readings.values() for problem in reading.problems]
    if profile.has_role("trainer"):
        problems += _trainer_problems(settings)
    return replace(settings, problems=tuple(problems))


def _cluster(profile: Profile) -> tuple[ClusterSettings, list[Problem]]:
    try:
        return ClusterSettings.model_validate(profile.table("cluster") or {}), []
    except ValidationError as error:
        return ClusterSettings(), profile.validation_problems(error, ("cluster",), ClusterSettings)


def _run_token(profile: Profile, cluster: ClusterSettings) -> str | None:
    """The run's bearer token on a cluster: ``api.token`` if set, else a fresh one.

    On a cluster the API and the inference server listen beyond loopback, so both require
    it; it reaches the other roles in their environment, never on a command line.
    """
    if not cluster.slurm:
        return None
    api = profile.table("api")
    given = api.get("token") if isinstance(api, dict) else None
    return given if isinstance(given, str) and given else secrets.token_urlsafe(24)


def _read(
    profile: Profile,
    cluster: ClusterSettings,
    name: str,
    where: KeyPath,
    raw: Any,
    model: type[BaseModel],
    validate: Callable[[dict[str, Any]], SettingsT],
    *,
    wired: Mapping[str, str] | None = None,
) -> Reading[SettingsT]:
    """Role process ``name``'s table at ``where`` (``raw``; ``None`` when absent, which
    validates as an empty table) without its placement keys, validated by ``validate``."""
    table, placed, problems = placed_table(profile, cluster, name, where, raw)
    problems += _wired(profile, table, wired or {}, where)
    try:
        settings = validate(table)
    except ValidationError as error:
        problems += profile.validation_problems(error, where, model)
        return Reading(table, placed, None, problems)
    return Reading(table, placed, settings, problems)


def _read_trainer(
    profile: Profile, cluster: ClusterSettings
) -> tuple[Reading[Any], tuple[int, ...], int]:
    """The ``[trainer]`` table, its GPUs and its rank count (its settings are checked once
    the others are read: :func:`_trainer_problems`)."""
    if not profile.has_role("trainer"):
        return Reading({}), (), 1
    table, placed, problems = placed_table(
        profile, cluster, "trainer", ("trainer",), profile.table("trainer")
    )
    problems += _wired(profile, table, TRAINER_WIRED, ("trainer",))
    gpus, found = trainer_gpus(profile, table)
    ranks, more = trainer_ranks(profile, table, gpus)
    return Reading(table, placed, None, [*problems, *found, *more]), gpus, ranks


def placed_table(
    profile: Profile, cluster: ClusterSettings, name: str, where: KeyPath, table: Any
) -> tuple[dict[str, Any], Placed | None, list[Problem]]:
    """A role table without its placement keys, where they place the role, and problems."""
    if not isinstance(table, Mapping):
        return {}, None, []
    own, place = split_placement(table)
    if place and not cluster.slurm:
        message = 'places a role on a cluster: needs [cluster] engine = "slurm"'
        return own, None, [profile.problem((*where, key), message) for key in place]
    try:
        placement = NodePlacement.model_validate(place)
    except ValidationError as error:
        return own, None, profile.validation_problems(error, where, NodePlacement)
    role = "env" if where[0] == "env" else name
    return own, Placed(process=name, role=role, placement=placement, key=where), []


def _wired(
    profile: Profile, table: Mapping[str, Any], keys: Mapping[str, str], where: KeyPath
) -> list[Problem]:
    """Problems for keys of a role table that the role layer sets itself."""
    return [
        profile.problem((*where, key), f"set by the role layer from {source}; remove it")
        for key, source in keys.items()
        if key in table
    ]


def _trainer_problems(settings: RoleSettings) -> list[Problem]:
    """The trainer's settings in the profile's mode, and its step split over its ranks."""
    profile = settings.profile
    try:
        config = trainer_config(settings, profile.run.mode)
    except ValidationError as error:
        return profile.validation_problems(error, ("trainer",), TrainerConfig)
    ranks = settings.trainer_ranks
    if ranks > 1 and config.step_batch_size % ranks:
        message = (
            f"{ranks} ranks do not split a step of {config.step_batch_size} sequences "
            "(batch_size x gradient_accumulation_steps) evenly: make it a multiple "
            f"of {ranks}"
        )
        return [profile.problem(("trainer", "gpus"), message)]
    return []


def memory_fit(settings: RoleSettings, mode: str) -> list[Problem]:
    """The trainer beside vLLM on one GPU, when the profile gives the GPU's size."""
    inference = settings.inference
    if inference is None or not settings.profile.has_role("trainer"):
        return []
    if inference.gpu_memory_gb is None or inference.gpu_memory_utilization is None:
        return []
    tiny = settings.profile.run.tiny_model
    config = None if tiny else read_model_config(settings.model_path)
    if config is None:
        return []
    try:
        params = param_count(config)
    except (KeyError, TypeError, ValueError):  # not a decoder layout we can count
        return []
    trainer = trainer_config(settings, mode)
    need = footprint(
        mode,
        params,
        trainer.dtype,
        trainer.optimizer,
        inference.backend,
        shards=settings.trainer_ranks,
    )
    if need is None:
        return []
    message = fit_problem(
        need, total_gb=inference.gpu_memory_gb, utilization=inference.gpu_memory_utilization
    )
    if message is None:
        return []
    return [settings.profile.problem(("inference", "gpu_memory_utilization"), message)]


def read_adjustments(
    profile: Profile, roles: list[str]
) -> tuple[dict[str, dict[str, Any]], list[Problem]]:
    """``[process.<role process>]`` tables: supervisor keys that adjust a role's spec."""
    found: dict[str, dict[str, Any]] = {}
    problems: list[Problem] = []
    for name, table in (profile.table("process") or {}).items():
        if name not in roles:
            continue
        where: KeyPath = ("process", name)
        if not isinstance(table, dict):
            problems.append(profile.problem(where, "must be a table"))
            continue
        problems += [
            profile.problem((*where, key), f"set by the role; configure the {name} role instead")
            for key in ROLE_OWNED
            if key in table
        ]
        found[name] = expand_depends_on({k: v for k, v in table.items() if k not in ROLE_OWNED})
    return found, problems
