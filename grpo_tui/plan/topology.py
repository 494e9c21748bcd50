"""Role settings -> topology: which GPUs each role holds and how its command is launched.

On one host the roles' ``gpus`` keys become one :class:`~grpo_tui.plan.launchers.Placement`
per role (``grpo_tui.plan.placement``), and a role of several ranks runs under torchrun. On
a Slurm cluster Slurm hands each job step its GPUs, so nothing is pinned here: each role
runs as its own ``srun`` step on the nodes its table names, a trainer of several GPUs or
nodes as torchrun on each; :func:`cluster_problems` checks that the placements fit the
allocation. The topology depends on the weight-sync mode (which layouts a mode can use),
so a mode switch plans it anew. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from grpo_tui.plan.cluster import Allocation, ClusterSettings, Placed, fit_problems
from grpo_tui.plan.launchers import Launch, Placement, Srun, TorchrunNodes, launcher_for, step_name
from grpo_tui.plan.placement import GpuPlan, plan_gpus
from grpo_tui.plan.profile import Problem, Profile
from grpo_tui.plan.settings import ANY_ADDRESS, RoleSettings
from grpo_tui.plan.toml_keys import KeyPath


@dataclass(frozen=True)
class Topology:
    """Where every role process runs in one mode, and how it is launched there."""

    gpu_plan: GpuPlan
    cluster: ClusterSettings
    allocation: Allocation
    placements: Mapping[str, Placed]
    run_dir: Path

    def placement(self, name: str) -> Placement:
        """Where role process ``name`` runs (no GPUs pinned for the CPU-only roles)."""
        return self.gpu_plan.placements.get(name, Placement())

    def ranks_dir(self, name: str) -> Path:
        """Where torchrun keeps the per-rank logs of role process ``name``."""
        return self.run_dir / "logs" / f"{name}-ranks"

    def launch(
        self, name: str, command: Launch, *, shutdown_timeout: float, ranks_per_gpu: bool = False
    ) -> tuple[Launch, str | None]:
        """``command`` at ``name``'s placement: as it is, or under torchrun for several ranks
        (given ``shutdown_timeout`` seconds to stop); then as its Slurm job step
        (:meth:`step`)."""
        placement = self.placement(name)
        launcher = launcher_for(
            placement, log_dir=self.ranks_dir(name), shutdown_timeout=shutdown_timeout
        )
        return self.step(
            name,
            launcher.wrap(command, placement),
            ranks_per_gpu=ranks_per_gpu,
            shutdown_timeout=shutdown_timeout,
        )

    def step(
        self, name: str, launch: Launch, *, ranks_per_gpu: bool = False, shutdown_timeout: float = 0
    ) -> tuple[Launch, str | None]:
        """The launch as its Slurm job step (and the step's name), or as it is off a cluster.

        A role of ``ranks_per_gpu`` spanning nodes or GPUs runs as torchrun on each of its
        nodes, meeting at its first node's ``cluster.rdzv_port``.
        """
        placed = self.placements.get(name)
        if not self.cluster.slurm or placed is None:
            return launch, None
        place = placed.placement
        if ranks_per_gpu and (place.nodes > 1 or place.gpus_per_node > 1):
            torchrun = TorchrunNodes(
                nodes=place.nodes,
                endpoint=f"{self.allocation.address(place.node)}:{self.cluster.rdzv_port}",
                rdzv_id=self.run_dir.name,
                log_dir=self.ranks_dir(name),
                shutdown_timeout=shutdown_timeout,
            )
            ranks = Placement(ranks=max(place.gpus_per_node, 1), on_gpu=place.gpus_per_node > 0)
            launch = torchrun.wrap(launch, ranks)
        step = step_name(self.run_dir.name, name)
        srun = Srun(step=step, place=place, extra=tuple(self.cluster.srun_args))
        return srun.wrap(launch, Placement()), step


def plan_topology(settings: RoleSettings, mode: str) -> Topology:
    """The roles' topology in ``mode``; ``gpu_plan.problems`` name the keys that do not fit.

    On a Slurm cluster Slurm hands each step its GPUs (``gpus_per_node``): nothing is
    pinned here, and the placement checks are the cluster's own (:func:`cluster_problems`).
    """
    profile = settings.profile
    gpu_plan = GpuPlan()
    if not settings.cluster.slurm:
        gpus = settings.trainer_gpus
        device = settings.tables["trainer"].get("device", "cuda" if gpus else "cpu")
        gpu_plan = plan_gpus(
            profile,
            mode=mode,
            trainer=gpus if profile.has_role("trainer") else None,
            trainer_device=str(device),
            inference=settings.inference if profile.has_role("inference") else None,
            ranks=settings.trainer_ranks,
        )
    return Topology(
        gpu_plan=gpu_plan,
        cluster=settings.cluster,
        allocation=settings.allocation,
        placements=settings.placements,
        run_dir=settings.run_dir,
    )


def cluster_problems(settings: RoleSettings, mode: str) -> list[Problem]:
    """Placements that do not fit the allocation, or that the roles cannot work with."""
    profile, placements = settings.profile, settings.placements
    problems = [
        profile.problem(key, message)
        for key, message in fit_problems(settings.cluster, list(placements.values()))
    ]
    inference, trainer = placements.get("inference"), placements.get("trainer")
    served = settings.inference
    if inference is not None and inference.placement.nodes > 1:
        problems.append(
            profile.problem(
                ("inference", "nodes"),
                "one inference server spans one node (vLLM across nodes needs Ray); "
                "use nodes = 1 and its GPUs on that node",
            )
        )
    if (
        inference is not None
        and trainer is not None
        and mode == "shared_vllm"
        and served is not None
        and inference.placement.node_numbers != trainer.placement.node_numbers
        and not (served.backend == "vllm" and served.weight_transfer == "nccl")
    ):
        problems.append(
            profile.problem(
                ("run", "mode"),
                "shared_vllm with inference and trainer on different nodes needs "
                'backend = "vllm" and weight_transfer = "nccl" (or mode lora_only / none)',
            )
        )
    if inference is not None and served is not None and served.backend == "vllm":
        workers = served.tensor_parallel_size * served.data_parallel_size
        if inference.placement.gpus_per_node and workers != inference.placement.gpus_per_node:
            problems.append(
                profile.problem(
                    ("inference", "gpus_per_node"),
                    f"vLLM runs tensor_parallel_size x data_parallel_size = {workers} "
                    f"workers, one per GPU: set gpus_per_node = {workers}",
                )
            )
    if settings.tables["trainer"].get("gpus") is not None:
        problems.append(_slurm_gpus(profile, ("trainer", "gpus")))
    if served is not None and served.gpus is not None:
        problems.append(_slurm_gpus(profile, ("inference", "gpus")))
    for role, role_settings in (("api", settings.api), ("inference", served)):
        if role_settings is None or role not in placements or role_settings.host != "127.0.0.1":
            continue
        home = placements[role].placement.node
        away = [p.process for p in placements.values() if p.placement.node != home]
        if away:
            problems.append(
                profile.problem(
                    (role, "host"),
                    f"bound to loopback but {', '.join(away)} run on other nodes; "
                    f'use host = "{ANY_ADDRESS}" (the run\'s token protects it)',
                )
            )
    return problems


def _slurm_gpus(profile: Profile, key: KeyPath) -> Problem:
    return profile.problem(
        key,
        "on a Slurm cluster each job step gets its GPUs from Slurm: "
        "set gpus_per_node (and node / nodes) instead",
    )
