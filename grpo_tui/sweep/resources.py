"""Ports and GPUs for cells that run at the same time, handed out so that no two clash.

Ports: every port a profile configures (``api.port``, ``inference.port``,
``process.<name>.port``) is moved up to the first port that no running cell holds and no
other process listens on. GPUs: a profile that names GPUs (``inference.device`` or
``trainer.device`` ``cuda:N``, ``inference.cuda_visible_devices``) needs ``max(N) + 1`` of
them; a cell gets that many from the pool and sees them as ``0..n-1`` through
``CUDA_VISIBLE_DEVICES`` (the inference server's own ``cuda_visible_devices`` is mapped
onto the physical ids).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.serve.settings import InferenceSettings
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
    return ports


def gpus_needed(data: Mapping[str, Any]) -> int:
    """How many GPUs one cell of this profile uses (0 for a CPU profile)."""
    ids: list[int] = []
    for role in ("inference", "trainer"):
        device = str((data.get(role) or {}).get("device", "cpu"))
        found = _CUDA.match(device)
        if found:
            ids.append(int(found.group(1) or 0))
    visible = (data.get("inference") or {}).get("cuda_visible_devices")
    if visible:
        ids += [int(part) for part in str(visible).split(",") if part.strip().isdigit()]
    return max(ids) + 1 if ids else 0


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
    """The cell's profile with its leased ports, and its GPU ids mapped onto the lease."""
    out = copy.deepcopy(dict(data))
    for key, port in lease.ports.items():
        table: Any = out
        *parents, last = key.split(".")
        for part in parents:
            table = table.setdefault(part, {})
        table[last] = port
    inference = out.get("inference")
    if lease.gpus and isinstance(inference, dict) and inference.get("cuda_visible_devices"):
        ids = [int(p) for p in str(inference["cuda_visible_devices"]).split(",") if p.strip()]
        inference["cuda_visible_devices"] = ",".join(lease.gpus[i] for i in ids)
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
