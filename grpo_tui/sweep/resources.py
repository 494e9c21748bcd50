"""Ports and GPUs for cells that run at the same time, handed out so that no two clash.

Ports: every port a profile configures (``api.port``, ``inference.port``,
``process.<name>.port``; on Slurm ``cluster.control_port`` and ``cluster.rdzv_port`` too,
since two cells' jobs may share a node) is moved up to the first port that no running
cell holds and no other process listens on. GPUs: a profile that names GPUs
(``[inference]`` / ``[trainer]`` ``gpus = [...]`` or ``device = "cuda:N"``) needs as many
as it names; a cell gets that many from the pool, its ``gpus`` lists mapped onto them and
``CUDA_VISIBLE_DEVICES`` set to them (so ``cuda:N`` devices index into its share).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.serve.settings import InferenceSettings
from grpo_tui.plan.cluster import ClusterSettings
from grpo_tui.supervisor.ports import find_port_holder

_CUDA = re.compile(r"^cuda(?::(\d+))?$")


def port_keys(data: Mapping[str, Any]) -> dict[str, int]:
    """Each configured port by its key (``api.port``: 8000), defaults included."""
    ports: dict[str, int] = {}
    if "api" in data:
        ports["api.port"] = int(data["api"].get("port", ApiSettings.model_fields["port"].default))
    if "inference" in data:
        default = InferenceSettings.model_fields["port"].default
        ports["inference.port"] = int(data["inference"].get("port", default))
    for name, table in (data.get("process") or {}).items():
        if isinstance(table, dict) and isinstance(table.get("port"), int):
            ports[f"process.{name}.port"] = table["port"]
    cluster = data.get("cluster") or {}
    if cluster.get("engine") == "slurm":
        for key in ("control_port", "rdzv_port"):
            ports[f"cluster.{key}"] = int(
                cluster.get(key, ClusterSettings.model_fields[key].default)
            )
    return ports


def profile_gpus(data: Mapping[str, Any]) -> list[int]:
    """The GPU ids a profile names (``[role] gpus`` lists, ``device = "cuda:N"``), sorted."""
    ids: set[int] = set()
    for role in ("inference", "trainer"):
        table = data.get(role) or {}
        ids.update(int(g) for g in table.get("gpus") or [])
        found = _CUDA.match(str(table.get("device", "cpu")))
        if found and not table.get("gpus"):
            ids.add(int(found.group(1) or 0))
    return sorted(ids)


def gpus_needed(data: Mapping[str, Any]) -> int:
    """How many GPUs one cell of this profile uses (0 for a CPU profile)."""
    return len(profile_gpus(data))


@dataclass
class Lease:
    """What one running cell holds."""

    ports: dict[str, int] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)


@dataclass
class Resources:
    """The sweep's pool: ports held by running cells, free GPUs."""

    gpus: list[str] = field(default_factory=list)
    held_ports: set[int] = field(default_factory=set)

    def can_lease(self, gpus: int) -> bool:
        return gpus <= len(self.gpus)

    def lease(self, data: Mapping[str, Any], gpus: int) -> Lease:
        """Take ports for every configured port and ``gpus`` GPUs from the pool."""
        lease = Lease(gpus=self.gpus[:gpus])
        del self.gpus[:gpus]
        for key, wanted in port_keys(data).items():
            port = wanted
            while port in self.held_ports or find_port_holder(port) is not None:
                port += 1
            self.held_ports.add(port)
            lease.ports[key] = port
        return lease

    def release(self, lease: Lease) -> None:
        self.held_ports -= set(lease.ports.values())
        self.gpus.extend(lease.gpus)


def leased_profile(data: Mapping[str, Any], lease: Lease) -> dict[str, Any]:
    """The cell's profile with its leased ports, and its GPU ids mapped onto the lease.

    The profile's i-th GPU id (in sorted order) becomes the lease's i-th GPU: in ``gpus``
    lists as the physical id, in ``device = "cuda:N"`` as ``cuda:i`` (the cell sees only
    its lease through ``CUDA_VISIBLE_DEVICES``).
    """
    out = copy.deepcopy(dict(data))
    for key, port in lease.ports.items():
        table: Any = out
        *parents, last = key.split(".")
        for part in parents:
            table = table.setdefault(part, {})
        table[last] = port
    if not lease.gpus:
        return out
    order = {gpu: index for index, gpu in enumerate(profile_gpus(data))}
    for role in ("inference", "trainer"):
        table = out.get(role)
        if not isinstance(table, dict):
            continue
        if table.get("gpus"):
            table["gpus"] = [int(lease.gpus[order[int(g)]]) for g in table["gpus"]]
        else:
            found = _CUDA.match(str(table.get("device", "cpu")))
            if found:
                table["device"] = f"cuda:{order[int(found.group(1) or 0)]}"
    return out


def gpu_pool(option: str | None, environment: Mapping[str, str]) -> list[str]:
    """GPUs to share: ``--gpus 0,1,2`` or else ``CUDA_VISIBLE_DEVICES`` (empty: none given)."""
    text = option if option is not None else environment.get("CUDA_VISIBLE_DEVICES", "")
    return [part.strip() for part in text.split(",") if part.strip()]


def parallel_limit(parallel: int, per_cell: int, pool: Iterable[str]) -> int:
    """Cells that can run at once: ``parallel``, fewer when GPUs run out."""
    if per_cell == 0:
        return parallel
    return min(parallel, len(list(pool)) // per_cell)
