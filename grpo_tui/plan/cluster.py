"""Where roles run on a Slurm allocation: the ``[cluster]`` table, placements, the plan.

A profile with ``[cluster] engine = "slurm"`` runs inside one allocation of ``nodes``
nodes with ``gpus_per_node`` GPUs each (``grpo-tui sbatch`` asks for exactly that). Each
role table may say where its process goes: ``node`` (the first node it uses, 1-based in
the allocation), ``nodes`` (how many) and ``gpus_per_node``. The supervisor stays on the
allocation's first node; each role becomes one ``srun`` job step there (see
``grpo_tui.plan.launchers``). This module is the pure part: settings, fit checks, node
addresses and the plan a person reads in ``grpo-tui check``. Torch-free.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PLACEMENT_KEYS = ("node", "nodes", "gpus_per_node")
"""Keys of a role table that place the role; the role layer takes them out before the
role's own settings are validated."""

JOB_ENV = "SLURM_JOB_ID"
NODELIST_ENV = "SLURM_JOB_NODELIST"


class ClusterSettings(BaseModel):
    """The ``[cluster]`` table: which engine places the roles and what it allocates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["local", "slurm"] = "local"
    nodes: int = Field(1, ge=1, description="nodes of the allocation (sbatch --nodes)")
    gpus_per_node: int = Field(0, ge=0, description="GPUs of each node (sbatch --gpus-per-node)")
    rdzv_port: int = Field(
        29400, ge=1, le=65535, description="torchrun c10d rendezvous port on the trainer's node"
    )
    control_port: int = Field(
        29401,
        ge=1,
        le=65535,
        description="TCP side of the supervisor's control socket on the first node",
    )
    srun_args: list[str] = Field(
        default_factory=list, description="extra srun options for every role's job step"
    )

    @property
    def slurm(self) -> bool:
        return self.engine == "slurm"


class NodePlacement(BaseModel):
    """Where one role runs: ``nodes`` nodes from node ``node`` (1-based) of the allocation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: int = Field(1, ge=1, description="first node of the allocation it runs on (1-based)")
    nodes: int = Field(1, ge=1, description="how many nodes it spans")
    gpus_per_node: int = Field(0, ge=0, description="GPUs it takes on each of its nodes")

    @property
    def node_numbers(self) -> range:
        """The 1-based node numbers it occupies."""
        return range(self.node, self.node + self.nodes)


def split_placement(table: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A role table as (its own settings, its placement keys)."""
    own = {k: v for k, v in table.items() if k not in PLACEMENT_KEYS}
    place = {k: v for k, v in table.items() if k in PLACEMENT_KEYS}
    return own, place


@dataclass(frozen=True)
class Allocation:
    """The nodes a run has: their Slurm names and the addresses others reach them at."""

    names: tuple[str, ...]
    addresses: tuple[str, ...]
    job_id: str | None = None

    @classmethod
    def symbolic(cls, count: int) -> Allocation:
        """Placeholders ``node1`` ... for plans printed outside an allocation."""
        names = tuple(f"node{i}" for i in range(1, count + 1))
        return cls(names=names, addresses=names)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Allocation | None:
        """The current Slurm job's nodes (``scontrol``/``sinfo``), or None outside a job."""
        env = os.environ if env is None else env
        job, nodelist = env.get(JOB_ENV), env.get(NODELIST_ENV)
        if not job or not nodelist:
            return None
        names = _run(["scontrol", "show", "hostnames", nodelist]).split()
        columns = "NodeList:200,NodeAddr:200"
        table = _run(["sinfo", "-h", "-N", "-n", ",".join(names), "-O", columns])
        addr = dict(line.split()[:2] for line in table.splitlines() if len(line.split()) >= 2)
        return cls(names=tuple(names), addresses=tuple(addr.get(n, n) for n in names), job_id=job)

    def __len__(self) -> int:
        return len(self.names)

    def address(self, node: int) -> str:
        """Address of 1-based node ``node`` (a node beyond the allocation is an error)."""
        return self.addresses[node - 1]

    def name(self, node: int) -> str:
        return self.names[node - 1]


def _run(command: Sequence[str]) -> str:
    done = subprocess.run(list(command), capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


@dataclass(frozen=True)
class Placed:
    """One role process placed on the allocation (for the plan and its checks)."""

    process: str
    role: str
    placement: NodePlacement
    key: tuple[str | int, ...]
    """Key path of its table in the profile (``("trainer",)``, ``("env", 0)``)."""


def fit_problems(
    cluster: ClusterSettings, placed: Sequence[Placed]
) -> list[tuple[tuple[str | int, ...], str]]:
    """Where the placements do not fit the allocation: (key path, message) pairs.

    A role must lie within ``cluster.nodes``, take no more GPUs per node than a node has,
    and the roles sharing a node must not need more GPUs than it has together.
    """
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for item in placed:
        place = item.placement
        last = place.node + place.nodes - 1
        if last > cluster.nodes:
            key = "node" if place.node > cluster.nodes else "nodes"
            problems.append(
                (
                    (*item.key, key),
                    f"{item.process} needs nodes {place.node}..{last} but the allocation has "
                    f"{cluster.nodes} (cluster.nodes)",
                )
            )
        if place.gpus_per_node > cluster.gpus_per_node:
            problems.append(
                (
                    (*item.key, "gpus_per_node"),
                    f"{item.process} asks for {place.gpus_per_node} GPUs per node but each node "
                    f"has {cluster.gpus_per_node} (cluster.gpus_per_node)",
                )
            )
    for node in range(1, cluster.nodes + 1):
        here = [p for p in placed if node in p.placement.node_numbers]
        used = sum(p.placement.gpus_per_node for p in here)
        if used > cluster.gpus_per_node and all(
            p.placement.gpus_per_node <= cluster.gpus_per_node for p in here
        ):
            last = next(p for p in reversed(here) if p.placement.gpus_per_node)
            shares = ", ".join(f"{p.process} {p.placement.gpus_per_node}" for p in here)
            problems.append(
                (
                    (*last.key, "gpus_per_node"),
                    f"node {node} would need {used} GPUs ({shares}) but has "
                    f"{cluster.gpus_per_node} (cluster.gpus_per_node)",
                )
            )
    return problems


def plan_lines(
    cluster: ClusterSettings, placed: Sequence[Placed], allocation: Allocation, local: Sequence[str]
) -> list[str]:
    """The placement plan in words: per node, which processes and GPUs it runs."""
    gpus = f" x {cluster.gpus_per_node} GPUs" if cluster.gpus_per_node else " (no GPUs)"
    job = f", job {allocation.job_id}" if allocation.job_id else ""
    lines = [f"cluster   slurm, {cluster.nodes} nodes{gpus}{job}", "placement:"]
    for node in range(1, cluster.nodes + 1):
        here = [p for p in placed if node in p.placement.node_numbers]
        parts = []
        for item in here:
            share = item.placement.gpus_per_node
            span = item.placement.nodes
            what = item.process + (f" {share} GPU{'s' if share != 1 else ''}" if share else "")
            if span > 1:
                what += f" (node {node - item.placement.node + 1} of {span})"
            parts.append(what)
        if node == 1:
            parts = [f"supervisor{', ' if local else ''}{', '.join(local)}", *parts]
        used = sum(p.placement.gpus_per_node for p in here)
        free = f"  [{used}/{cluster.gpus_per_node} GPUs]" if cluster.gpus_per_node else ""
        where = f"{allocation.name(node)} ({allocation.address(node)})"
        if allocation.name(node) == allocation.address(node):
            where = allocation.name(node)
        lines.append(f"  node {node} {where}: {', '.join(parts) or '-'}{free}")
    return lines
