"""The role layer: a profile's role tables become process specs for the supervisor.

Roles run in the order api -> inference -> trainer -> env(s), each with a readiness probe,
a restart policy and a shutdown timeout that suit it. With ``model = "tiny"`` a one-shot
``model`` process builds the tiny model into ``RUN/model`` first. The layer also keeps the
current overrides (weight-sync mode, the model and adapter inference serves, settings
changed at a restart) so that ``respec`` rebuilds a spec for the supervisor's restarts and
mode switches. Torch-free: ``grpo-tui check`` goes through here.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from grpo_trainer.api.settings import TOKEN_ENV, ApiSettings
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.serve.settings import (
    InferenceSettings,
    inference_command,
    request_model_name,
)
from grpo_trainer.sync.restart import restarts_inference
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.memory_fit import fit_problem, footprint, param_count, read_model_config
from grpo_tui.plan.cluster import (
    Allocation,
    ClusterSettings,
    NodePlacement,
    Placed,
    fit_problems,
    split_placement,
)
from grpo_tui.plan.launchers import Launch, Placement, Srun, TorchrunNodes, launcher_for, step_name
from grpo_tui.plan.placement import GpuPlan, plan_gpus, trainer_gpus, trainer_ranks
from grpo_tui.plan.profile import (
    KeyPath,
    Problem,
    Profile,
    ProfileError,
    check_graph,
    expand_depends_on,
    validate_process_tables,
)
from grpo_tui.plan.role_overrides import TRAINER_WIRED, RoleOverrides
from grpo_tui.supervisor.control import ControlEndpoint
from grpo_tui.supervisor.spec import (
    Condition,
    Dependency,
    HttpProbe,
    LogLineProbe,
    ProcessSpec,
    RestartPolicy,
    Shutdown,
)

SettingsT = TypeVar("SettingsT", bound=BaseModel)

RESTART_SYNC_EVERY = 4
TRAINER_READY = r"grpo-trainer ready"
ENV_READY = r"grpo-env registered"
INFERENCE_KEY_ENV = "VLLM_API_KEY"
"""The inference server's bearer token: vLLM's own variable, read by the built-in server
and by our clients too, so one name serves both backends."""
ANY_ADDRESS = "0.0.0.0"
TRANSFER_ADDRESS_ENV = "GRPO_WEIGHT_TRANSFER_ADDRESS"
"""Read by ``grpo_trainer.sync.vllm_shared`` (not imported here: it needs torch)."""

TRAINER_ROLE_KEYS = ("gpus", "ranks")
"""Keys of the ``[trainer]`` table that the role layer reads and the trainer never sees."""

TRAINER_SHUTDOWN = 120.0
"""Seconds a stopping trainer (every rank) has to finish its step and checkpoint."""
# vLLM 0.24 never ends its HTTP shutdown while requests are in flight (it aborts the engine,
# then waits for the open connections with no timeout), so every restart-mode sync waited
# out the whole grace before the SIGKILL: 30 of the 65 s of each restart on an H200
# (2026-11-24). Inference holds nothing to save, so its grace is short.
INFERENCE_SHUTDOWN = 8.0

ENV_WIRED = {"model_name": "inference.served_model_name", "prompt_copies": "inference.backend"}

ROLE_OWNED = ("name", "role", "command")
"""Keys a ``[process.<role process>]`` table cannot change: they come from the role."""

HEALTHY = Dependency(condition=Condition.HEALTHY)
BUILT = Dependency(condition=Condition.COMPLETED)


def run_dir_for(profile: Profile, now: datetime | None = None) -> Path:
    """A new absolute ``<output_dir>/<name>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... if taken).

    Absolute so that every process finds it whatever its ``cwd``.
    """
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = (Path(profile.run.output_dir) / f"{profile.run.name}-{stamp}").resolve()
    run_dir, suffix = base, 1
    while run_dir.exists():
        suffix += 1
        run_dir = base.with_name(f"{base.name}-{suffix}")
    return run_dir


def _wired(
    profile: Profile, table: Mapping[str, Any], keys: Mapping[str, str], where: KeyPath
) -> list[Problem]:
    """Problems for keys of a role table that the role layer sets itself."""
    return [
        profile.problem((*where, key), f"set by the role layer from {source}; remove it")
        for key, source in keys.items()
        if key in table
    ]


class RoleLayer(RoleOverrides):
    """Builds role specs from a profile and rebuilds them on restarts and mode switches."""

    def __init__(
        self, profile: Profile, run_dir: Path, allocation: Allocation | None = None
    ) -> None:
        self.profile = profile
        self.run_dir = run_dir
        self.mode: str = profile.run.mode
        self.inference_model: str | None = None
        self.adapter: str | None = None
        self.problems: list[Problem] = []
        self._tables: dict[str, dict[str, Any]] = {}
        self.placements: dict[str, Placed] = {}
        self.cluster = self._cluster_settings()
        self.allocation = allocation or Allocation.symbolic(self.cluster.nodes)
        self.token = self._run_token()
        cluster_defaults: dict[str, Any] = {}
        if self.cluster.slurm:
            cluster_defaults = {"host": ANY_ADDRESS}
        api_defaults = dict(cluster_defaults)
        if self.token is not None:
            api_defaults["token"] = self.token
        self.api = self._settings("api", ApiSettings, api_defaults)
        self.inference = self._settings(
            "inference", InferenceSettings, {"seed": self.seed, **cluster_defaults}
        )
        self.envs = [
            self._env(index, table) for index, table in enumerate(profile.table("env") or [])
        ]
        self.trainer_gpus: tuple[int, ...] = ()
        self.trainer_ranks = 1
        self._check_trainer_table()
        self.gpu_plan = self._place()
        self.problems += self.gpu_plan.problems
        self.problems += self._memory_fit()
        self._adjust = self._adjustments()
        self.placements = {k: v for k, v in self.placements.items() if k in self.roles}
        if self.cluster.slurm and not self.problems:
            self.problems += self._placement_problems()

    def _memory_fit(self) -> list[Problem]:
        """The trainer beside vLLM on one GPU, when the profile gives the GPU's size."""
        inference = self.inference
        if self.problems or inference is None or not self.profile.has_role("trainer"):
            return []
        if inference.gpu_memory_gb is None or inference.gpu_memory_utilization is None:
            return []
        config = None if self.profile.run.tiny_model else read_model_config(self.model_path)
        if config is None:
            return []
        try:
            params = param_count(config)
        except (KeyError, TypeError, ValueError):  # not a decoder layout we can count
            return []
        trainer = self.trainer_config()
        need = footprint(
            self.mode,
            params,
            trainer.dtype,
            trainer.optimizer,
            inference.backend,
            shards=self.trainer_ranks,
        )
        if need is None:
            return []
        message = fit_problem(
            need,
            total_gb=inference.gpu_memory_gb,
            utilization=inference.gpu_memory_utilization,
        )
        if message is None:
            return []
        return [self.profile.problem(("inference", "gpu_memory_utilization"), message)]

    def _place(self) -> GpuPlan:
        """The roles' GPUs in the current mode (problems name the keys).

        On a Slurm cluster Slurm hands each step its GPUs (``gpus_per_node``): nothing is
        pinned here, and the placement checks are the cluster's own.
        """
        if self.cluster.slurm:
            return GpuPlan()
        has_trainer = self.profile.has_role("trainer")
        device = self._tables["trainer"].get("device", "cuda" if self.trainer_gpus else "cpu")
        return plan_gpus(
            self.profile,
            mode=self.mode,
            trainer=self.trainer_gpus if has_trainer else None,
            trainer_device=str(device),
            inference=self.inference if self.profile.has_role("inference") else None,
            ranks=self.trainer_ranks,
        )

    def placement(self, name: str) -> Placement:
        """Where role process ``name`` runs (no GPUs pinned for the CPU-only roles)."""
        return self.gpu_plan.placements.get(name, Placement())

    def _adjustments(self) -> dict[str, dict[str, Any]]:
        """``[process.<role process>]`` tables: supervisor keys that adjust a role's spec."""
        found: dict[str, dict[str, Any]] = {}
        for name, table in (self.profile.table("process") or {}).items():
            if name not in self.roles:
                continue
            where: KeyPath = ("process", name)
            if not isinstance(table, dict):
                self.problems.append(self.profile.problem(where, "must be a table"))
                continue
            for key in ROLE_OWNED:
                if key in table:
                    self.problems.append(
                        self.profile.problem(
                            (*where, key), f"set by the role; configure the {name} role instead"
                        )
                    )
            found[name] = expand_depends_on({k: v for k, v in table.items() if k not in ROLE_OWNED})
        return found

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
        names = [r for r in ("api", "inference", "trainer") if self.profile.has_role(r)]
        names += [self._env_name(i) for i in range(len(self.envs))]
        if self.profile.run.tiny_model and any(
            self.profile.has_role(r) for r in ("inference", "trainer", "env")
        ):
            names.insert(0, "model")
        return names

    def _env_name(self, index: int, count: int | None = None) -> str:
        count = len(self.envs) if count is None else count
        return "env" if count == 1 else f"env-{index}"

    def _env_tables(self) -> list[Any]:
        return list(self.profile.table("env") or [])

    # ------------------------------------------------------------------ placement

    def _cluster_settings(self) -> ClusterSettings:
        try:
            return ClusterSettings.model_validate(self.profile.table("cluster") or {})
        except ValidationError as error:
            self.problems += self.profile.validation_problems(error, ("cluster",), ClusterSettings)
            return ClusterSettings()

    def _run_token(self) -> str | None:
        """The run's bearer token on a cluster: ``api.token`` if set, else a fresh one.

        On a cluster the API and the inference server listen beyond loopback, so both
        require it; it reaches the other roles in their environment, never on a command line.
        """
        if not self.cluster.slurm:
            return None
        api = self.profile.table("api")
        given = api.get("token") if isinstance(api, dict) else None
        return given if isinstance(given, str) and given else secrets.token_urlsafe(24)

    def _take_placement(
        self, name: str, where: KeyPath, table: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The table without its placement keys; the placement is recorded under ``name``."""
        if not isinstance(table, Mapping):
            return {}
        own, place = split_placement(table)
        if place and not self.cluster.slurm:
            for key in place:
                self.problems.append(
                    self.profile.problem(
                        (*where, key),
                        'places a role on a cluster: needs [cluster] engine = "slurm"',
                    )
                )
            return own
        try:
            placement = NodePlacement.model_validate(place)
        except ValidationError as error:
            self.problems += self.profile.validation_problems(error, where, NodePlacement)
            return own
        role = "env" if where[0] == "env" else name
        self.placements[name] = Placed(process=name, role=role, placement=placement, key=where)
        return own

    def _placement_problems(self) -> list[Problem]:
        """Placements that do not fit the allocation, or that the roles cannot work with."""
        problems = [
            self.profile.problem(key, message)
            for key, message in fit_problems(self.cluster, list(self.placements.values()))
        ]
        inference = self.placements.get("inference")
        trainer = self.placements.get("trainer")
        if inference is not None and inference.placement.nodes > 1:
            problems.append(
                self.profile.problem(
                    ("inference", "nodes"),
                    "one inference server spans one node (vLLM across nodes needs Ray); "
                    "use nodes = 1 and its GPUs on that node",
                )
            )
        if (
            inference is not None
            and trainer is not None
            and self.mode == "shared_vllm"
            and self.inference is not None
            and inference.placement.node_numbers != trainer.placement.node_numbers
            and not (self.inference.backend == "vllm" and self.inference.weight_transfer == "nccl")
        ):
            problems.append(
                self.profile.problem(
                    ("run", "mode"),
                    "shared_vllm with inference and trainer on different nodes needs "
                    'backend = "vllm" and weight_transfer = "nccl" (or mode lora_only / none)',
                )
            )
        settings = self.inference
        if inference is not None and settings is not None and settings.backend == "vllm":
            workers = settings.tensor_parallel_size * settings.data_parallel_size
            if inference.placement.gpus_per_node and workers != inference.placement.gpus_per_node:
                problems.append(
                    self.profile.problem(
                        ("inference", "gpus_per_node"),
                        f"vLLM runs tensor_parallel_size x data_parallel_size = {workers} "
                        f"workers, one per GPU: set gpus_per_node = {workers}",
                    )
                )
        if self._tables.get("trainer", {}).get("gpus") is not None:
            problems.append(self._slurm_gpus(("trainer", "gpus")))
        if self.inference is not None and self.inference.gpus is not None:
            problems.append(self._slurm_gpus(("inference", "gpus")))
        for role, settings in (("api", self.api), ("inference", self.inference)):
            if settings is None or role not in self.placements or settings.host != "127.0.0.1":
                continue
            home = self.placements[role].placement.node
            away = [p.process for p in self.placements.values() if p.placement.node != home]
            if away:
                problems.append(
                    self.profile.problem(
                        (role, "host"),
                        f"bound to loopback but {', '.join(away)} run on other nodes; "
                        f'use host = "{ANY_ADDRESS}" (the run\'s token protects it)',
                    )
                )
        return problems

    def _slurm_gpus(self, key: KeyPath) -> Problem:
        return self.profile.problem(
            key,
            "on a Slurm cluster each job step gets its GPUs from Slurm: "
            "set gpus_per_node (and node / nodes) instead",
        )

    @property
    def control_endpoint(self) -> ControlEndpoint | None:
        """On a cluster: the control socket's TCP side on the first node, for the steps."""
        if not self.cluster.slurm or self.token is None:
            return None
        return ControlEndpoint(
            address=self.allocation.address(1), port=self.cluster.control_port, token=self.token
        )

    def node_of(self, name: str) -> int:
        """1-based node of the allocation where process ``name`` starts (1: supervisor's)."""
        placed = self.placements.get(name)
        return placed.placement.node if placed is not None else 1

    def _url(self, role: str, port: int, local: str) -> str:
        """How the others reach ``role``: by its node's address on a cluster."""
        if not self.cluster.slurm:
            return local
        return f"http://{self.allocation.address(self.node_of(role))}:{port}"

    @property
    def api_url(self) -> str:
        api = self.api or ApiSettings()
        return self._url("api", api.port, api.url)

    @property
    def inference_url(self) -> str:
        inference = self.inference or InferenceSettings()
        return self._url("inference", inference.port, inference.base_url)

    def _launched(self, name: str, launch: Launch) -> tuple[Launch, str | None]:
        """The role's launch as its Slurm job step (and the step's name), or as it is.

        A trainer spanning nodes or GPUs runs as torchrun on each of its nodes, meeting at
        its first node's ``cluster.rdzv_port``.
        """
        placed = self.placements.get(name)
        if not self.cluster.slurm or placed is None:
            return launch, None
        place = placed.placement
        if name == "trainer" and (place.nodes > 1 or place.gpus_per_node > 1):
            torchrun = TorchrunNodes(
                nodes=place.nodes,
                endpoint=f"{self.allocation.address(place.node)}:{self.cluster.rdzv_port}",
                rdzv_id=self.run_dir.name,
                log_dir=self.run_dir / "logs" / "trainer-ranks",
                shutdown_timeout=TRAINER_SHUTDOWN,
            )
            ranks = Placement(ranks=max(place.gpus_per_node, 1), on_gpu=place.gpus_per_node > 0)
            launch = torchrun.wrap(launch, ranks)
        step = step_name(self.run_dir.name, name)
        srun = Srun(step=step, place=place, extra=tuple(self.cluster.srun_args))
        return srun.wrap(launch, Placement()), step

    def _settings(
        self, role: str, model: type[SettingsT], defaults: Mapping[str, Any]
    ) -> SettingsT | None:
        table = self.profile.table(role) or {}
        if not self.profile.has_role(role):
            table = {}
        table = self._take_placement(role, (role,), table)
        self._tables[role] = dict(table)
        try:
            return model.model_validate({**defaults, **table})
        except ValidationError as error:
            self.problems += self.profile.validation_problems(error, (role,), model)
            return None

    def _env(self, index: int, table: Mapping[str, Any]) -> EnvSettings | None:
        where: KeyPath = ("env", index)
        table = self._take_placement(self._env_name(index, len(self._env_tables())), where, table)
        self.problems += _wired(self.profile, table, ENV_WIRED, where)
        served = self.inference.served_model_name if self.inference else "policy"
        try:
            return EnvSettings.model_validate(
                {"seed": self.seed + index, **table, "model_name": served}
            )
        except ValidationError as error:
            self.problems += self.profile.validation_problems(error, where, EnvSettings)
            return None

    def _check_trainer_table(self) -> None:
        table = self.profile.table("trainer") or {}
        if self.profile.has_role("trainer"):
            table = self._take_placement("trainer", ("trainer",), table)
        self._tables["trainer"] = dict(table)
        if not self.profile.has_role("trainer"):
            return
        self.problems += _wired(self.profile, table, TRAINER_WIRED, ("trainer",))
        self.trainer_gpus, problems = trainer_gpus(self.profile, table)
        self.problems += problems
        self.trainer_ranks, problems = trainer_ranks(self.profile, table, self.trainer_gpus)
        self.problems += problems
        try:
            config = self.trainer_config()
        except ValidationError as error:
            self.problems += self.profile.validation_problems(error, ("trainer",), TrainerConfig)
            return
        ranks = self.trainer_ranks
        if ranks > 1 and config.step_batch_size % ranks:
            self.problems.append(
                self.profile.problem(
                    ("trainer", "gpus"),
                    f"{ranks} ranks do not split a step of {config.step_batch_size} sequences "
                    "(batch_size x gradient_accumulation_steps) evenly: make it a multiple "
                    f"of {ranks}",
                )
            )

    def trainer_config(self) -> TrainerConfig:
        """The trainer's settings: the ``[trainer]`` table plus the wiring to the others."""
        inference = self.inference or InferenceSettings()
        group_sizes = {env.group_size for env in self.envs if env is not None}
        defaults: dict[str, Any] = {"seed": self.seed, "resume": "auto"}
        if restarts_inference(self.mode, inference.backend):
            # Each sync restarts the inference server (seconds on a CPU, a minute for vLLM):
            # sync every few steps unless the profile says otherwise.
            defaults.update(sync_every=RESTART_SYNC_EVERY, max_sync_lag=RESTART_SYNC_EVERY - 1)
        if len(group_sizes) == 1:
            defaults["group_size"] = group_sizes.pop()
        trainer_place = self.placements.get("trainer")
        if self.trainer_gpus or (trainer_place and trainer_place.placement.gpus_per_node):
            defaults["device"] = "cuda"  # each rank sees only its GPUs
        wiring: dict[str, Any] = {
            "model_name": self.model_path,
            "atropos_url": self.api_url,
            "inference_url": self.inference_url,
            "served_model_name": inference.served_model_name,
            "inference_backend": inference.backend,
            "weight_bridge_mode": self.mode,
            "save_path": str(self.checkpoint_dir),
        }
        skip = {*TRAINER_WIRED, *TRAINER_ROLE_KEYS}
        table = {k: v for k, v in self._tables["trainer"].items() if k not in skip}
        if self.mode == "colocate":
            # The engine sleeps through every step: it must wake on fresh weights each time.
            table.update(sync_every=1, max_sync_lag=0)
        return TrainerConfig.model_validate({**defaults, **table, **wiring})

    def specs(self) -> tuple[list[ProcessSpec], dict[str, KeyPath]]:
        """Every role process's spec and its key path in the profile; raises ProfileError."""
        if self.problems:
            raise ProfileError(self.problems)
        specs: list[ProcessSpec] = []
        sources: dict[str, KeyPath] = {}
        problems: list[Problem] = []
        for name in self.roles:
            try:
                base = self._role_spec(name)
            except (ValueError, ValidationError) as error:
                problems.append(self.profile.problem(self._source(name), str(error)))
                continue
            try:
                specs.append(self._adjusted(name, base))
            except ValidationError as error:
                where = ("process", name)
                problems += self.profile.validation_problems(error, where, ProcessSpec)
                continue
            sources[name] = self._source(name)
        if problems:
            raise ProfileError(problems)
        return specs, sources

    def _adjusted(self, name: str, spec: ProcessSpec) -> ProcessSpec:
        """``spec`` with its ``[process.<name>]`` table applied (env and depends_on merge)."""
        adjust = self._adjust.get(name)
        if not adjust:
            return spec
        merged = spec.model_dump()
        for key, value in adjust.items():
            if key in ("env", "depends_on") and isinstance(value, dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return ProcessSpec.model_validate(merged)

    def _source(self, name: str) -> KeyPath:
        if set(self._adjust.get(name, ())) & {"depends_on", "port"}:
            return ("process", name)
        if name == "model":
            return ("run", "model")
        if name.startswith("env"):
            index = 0 if name == "env" else int(name.removeprefix("env-"))
            return ("env", index)
        return (name,)

    def spec(self, name: str) -> ProcessSpec:
        """The current spec of role process ``name`` (with the overrides kept so far)."""
        return self._adjusted(name, self._role_spec(name))

    def _role_spec(self, name: str) -> ProcessSpec:
        if name == "model":
            return self._model_spec()
        if name == "api":
            return self._api_spec()
        if name == "inference":
            return self._inference_spec()
        if name == "trainer":
            return self._trainer_spec()
        index = 0 if name == "env" else int(name.removeprefix("env-"))
        return self._env_spec(name, index)

    def _model_deps(self) -> dict[str, Dependency]:
        return {"model": BUILT} if "model" in self.roles else {}

    def _model_spec(self) -> ProcessSpec:
        build = [sys.executable, "-m", "grpo_trainer.tiny_model", "build", self.model_path]
        return ProcessSpec(
            name="model",
            role="model",
            command=[*build, "--seed", str(self.seed), *self.profile.run.tiny.flags()],
            shutdown=Shutdown(timeout=10),
        )

    def _api_spec(self) -> ProcessSpec:
        api = self._require(self.api)
        launch, step = self._launched(
            "api", Launch(argv=api.model_copy(update={"token": None}).argv(run_dir=self.run_dir))
        )
        health = f"{self.api_url}/health"
        return ProcessSpec(
            name="api",
            role="api",
            command=launch.argv,
            slurm_step=step,
            env=self._token_env(),
            port=api.port,
            readiness=HttpProbe(url=health, period=0.2, timeout=2.0),
            liveness=HttpProbe(
                url=health, initial_delay=5, period=10, timeout=5, failure_threshold=3
            ),
            restart=RestartPolicy(policy="always", backoff_base=0.5, max_restarts=5),
            shutdown=Shutdown(timeout=15),
        )

    def _inference_spec(self) -> ProcessSpec:
        settings = self._require(self.inference)
        launch = inference_command(
            settings,
            mode=self.mode,
            model=self.inference_model or self.model_path,
            adapter=self.adapter,
            shared_dir=str(self.run_dir / "shared_weights"),
        )
        health = f"{self.inference_url}/health"
        placed, step = self._launched(
            "inference",
            launcher_for(
                self.placement("inference"),
                log_dir=self.run_dir / "logs",
                shutdown_timeout=INFERENCE_SHUTDOWN,
            ).wrap(Launch(argv=launch.argv, env=launch.env), self.placement("inference")),
        )
        return ProcessSpec(
            name="inference",
            role="inference",
            command=placed.argv,
            slurm_step=step,
            env={**placed.env, **self._token_env()},
            port=settings.port,
            metrics_url=f"{self.inference_url}/metrics",
            depends_on=self._model_deps(),
            prestart=settings.backend == "builtin" and placed.argv == launch.argv,
            readiness=HttpProbe(url=health, period=0.25, timeout=2.0),
            liveness=HttpProbe(
                url=health, initial_delay=10, period=15, timeout=10, failure_threshold=4
            ),
            restart=RestartPolicy(policy="always", backoff_base=1.0, max_restarts=5),
            shutdown=Shutdown(timeout=INFERENCE_SHUTDOWN),
        )

    def _trainer_spec(self) -> ProcessSpec:
        depends = self._model_deps()
        depends.update({r: HEALTHY for r in ("api", "inference") if r in self.roles})
        placement = self.placement("trainer")
        launcher = launcher_for(
            placement,
            log_dir=self.run_dir / "logs" / "trainer-ranks",
            shutdown_timeout=TRAINER_SHUTDOWN,
        )
        argv = self.trainer_config().argv()
        launch, step = self._launched("trainer", launcher.wrap(Launch(argv=argv), placement))
        return ProcessSpec(
            name="trainer",
            role="trainer",
            command=launch.argv,
            slurm_step=step,
            env={**launch.env, **self._token_env(), **self._transfer_env()},
            depends_on=depends,
            prestart=launch.argv == argv,  # one local process: it reads the start gate
            readiness=LogLineProbe(pattern=TRAINER_READY, period=0.2),
            restart=RestartPolicy(policy="on_failure", backoff_base=1.0, max_restarts=5),
            shutdown=Shutdown(timeout=TRAINER_SHUTDOWN),
        )

    def _env_spec(self, name: str, index: int) -> ProcessSpec:
        env = self._require(self.envs[index])
        if self.inference is not None:  # the adapter's request name depends on the mode
            env = env.model_copy(
                update={
                    "model_name": request_model_name(self.inference, self.mode),
                    "prompt_copies": self.inference.backend == "sglang",
                }
            )
        depends = self._model_deps()
        depends.update({r: HEALTHY for r in ("api", "inference", "trainer") if r in self.roles})
        command = env.command(
            api_url=self.api_url, inference_url=self.inference_url, tokenizer=self.model_path
        )
        launch, step = self._launched(name, Launch(argv=command))
        return ProcessSpec(
            name=name,
            role="env",
            command=launch.argv,
            slurm_step=step,
            env=self._token_env(),
            depends_on=depends,
            prestart=launch.argv == command,  # every task runs grpo_trainer.envs.cli.main
            readiness=LogLineProbe(pattern=ENV_READY, period=0.2),
            restart=RestartPolicy(policy="on_failure", backoff_base=1.0, max_restarts=5),
            shutdown=Shutdown(timeout=10),
        )

    def _transfer_env(self) -> dict[str, str]:
        """On a cluster: the trainer node's address, where vLLM joins the NCCL weight group."""
        if not self.cluster.slurm:
            return {}
        return {TRANSFER_ADDRESS_ENV: self.allocation.address(self.node_of("trainer"))}

    def _token_env(self) -> dict[str, str]:
        """The API token (and on a cluster the inference server's, the same run token) as
        environment variables: kept out of ``ps`` and of the plan."""
        env = {}
        if self.api is not None and self.api.token is not None:
            env[TOKEN_ENV] = self.api.token.get_secret_value()
        if self.token is not None:
            env[INFERENCE_KEY_ENV] = self.token
        return env


@dataclass
class Plan:
    """Everything a run needs: specs in start order, the exit process, the role layer."""

    profile: Profile
    run_dir: Path
    specs: list[ProcessSpec]
    exit_with: str | None
    roles: RoleLayer

    def respec(self, name: str, args: Mapping[str, Any]) -> ProcessSpec:
        """The supervisor's ``respec`` callback: roles rebuild, other processes update."""
        if name in self.roles.roles:
            return self.roles.respec(name, args)
        current = next((s for s in self.specs if s.name == name), None)
        if current is None:
            raise ValueError(f"no process named {name!r}")
        if not args:
            return current
        spec = ProcessSpec.model_validate({**current.model_dump(), **args})
        self.specs = [spec if s.name == name else s for s in self.specs]
        return spec

    def edit(self, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, ProcessSpec]]:
        """The supervisor's ``edit`` callback: a live edit validated, kept and written
        (:meth:`RoleLayer.edit`); returns the values and the rebuilt specs it reaches."""
        parsed, names = self.roles.edit(values)
        return parsed, {name: self.roles.spec(name) for name in names}


def build_plan(
    profile: Profile, run_dir: Path | None = None, allocation: Allocation | None = None
) -> Plan:
    """Expand roles and processes into a checked plan; raises ProfileError with every problem.

    ``allocation`` gives a cluster profile its real nodes (inside a Slurm job); without it
    the plan names them ``node1`` ...
    """
    run_dir = run_dir or run_dir_for(profile)
    roles = RoleLayer(profile, run_dir, allocation)
    problems = list(roles.problems)
    role_specs: list[ProcessSpec] = []
    sources: dict[str, KeyPath] = {}
    if not problems:
        try:
            role_specs, sources = roles.specs()
        except ProfileError as error:
            problems += error.problems
    extra, extra_sources, extra_problems = validate_process_tables(profile, roles.roles)
    problems += extra_problems
    sources.update(extra_sources)
    specs = [*role_specs, *extra]
    names = [*roles.roles, *(profile.table("process") or {})]
    order, graph_problems = check_graph(profile, specs, sources, names)
    problems += graph_problems
    exit_with = profile.run.exit_with
    if exit_with is None and "trainer" in roles.roles:
        exit_with = "trainer"
    if exit_with is not None and exit_with not in names:
        problems.append(
            profile.problem(
                ("run", "exit_with"), f"names no process (processes: {', '.join(names)})"
            )
        )
    if problems:
        raise ProfileError(problems)
    return Plan(profile=profile, run_dir=run_dir, specs=order, exit_with=exit_with, roles=roles)
