"""Background measurements: CPU/RSS per process tree, GPU memory (NVML), generated tokens/s,
and the rollout API's queue gauges.

Samplers return plain events and metric values; the supervisor publishes them. NVML is
optional: without the library, a driver or a GPU, the GPU part is absent, and one notice
says why, at level ``debug``: in ``events.jsonl`` for whoever looks, not on the console nor
in the dashboard's events (every CPU run would print it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from grpo_tui.supervisor.events import Event, GpuSample, Notice, ResourceSample
from grpo_tui.supervisor.process import Child

TOKENS_COUNTERS = ("vllm:generation_tokens_total", "sglang:generation_tokens_total")
"""Generated-token counters of vLLM and SGLang (``--enable-metrics``); a server has one."""
GAUGES = {
    "grpo_api_queue_groups": "queue_groups",
    "grpo_api_time_in_queue_seconds": "time_in_queue_s",
    "grpo_api_served_version": "served_version",
    "grpo_api_served_incarnation": "served_incarnation",
}
"""Unlabelled gauges a scraped endpoint may have (the rollout API's), recorded as
``<name>/<short name>``: queue depth, time in queue, the served policy version."""
SCRAPE_TIMEOUT = 2.0
"""Seconds a ``/metrics`` scrape may take: a busy server answers late, not never."""


@dataclass(frozen=True)
class Scrape:
    """A Prometheus endpoint to scrape: one instance (pid) of its process, and when that
    instance became ready (its counters started from zero before then)."""

    url: str
    instance: int
    ready_at: float


class TreeSampler:
    """CPU % and RSS summed over each child's live process tree.

    ``psutil.Process`` objects are kept between samples because ``cpu_percent`` measures the
    time since the previous call on the same object.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def sample(
        self, children: Mapping[str, Child]
    ) -> dict[str, tuple[float, int, set[int]]]:
        """``name -> (cpu %, rss bytes, pids)``."""
        seen: dict[int, psutil.Process] = {}
        result = {}
        for name, child in children.items():
            cpu, rss, pids = 0.0, 0, set()
            for proc in [self._proc(child.pid), *child.refresh_tree()]:
                if proc is None:
                    continue
                proc = self._procs.get(proc.pid, proc)
                try:
                    with proc.oneshot():
                        cpu += proc.cpu_percent(None)
                        rss += proc.memory_info().rss
                except psutil.Error:
                    continue
                seen[proc.pid] = proc
                pids.add(proc.pid)
            result[name] = (cpu, rss, pids)
        self._procs = seen
        return result

    def _proc(self, pid: int) -> psutil.Process | None:
        if pid in self._procs:
            return self._procs[pid]
        try:
            return psutil.Process(pid)
        except psutil.Error:
            return None


def pinned_gpus(env: Mapping[str, str]) -> tuple[int, ...]:
    """The GPU indices a ``CUDA_VISIBLE_DEVICES`` value names (UUIDs and MIG ids skipped)."""
    listed = env.get("CUDA_VISIBLE_DEVICES", "")
    return tuple(int(part) for part in listed.split(",") if part.strip().isdigit())


def gpu_holders(
    on_gpu: Mapping[int, Mapping[int, int]],
    trees: Mapping[str, set[int]],
    pinned: Mapping[str, tuple[int, ...]],
) -> dict[int, tuple[str, ...]]:
    """``GPU index -> processes holding it``: pinned there, or a pid of its tree has memory.

    ``on_gpu`` maps each GPU to ``pid -> bytes`` (NVML's compute processes); ``trees`` each
    supervised process to the pids of its tree; ``pinned`` each to its listed GPUs.
    """
    holders: dict[int, set[str]] = {index: set() for index in on_gpu}
    for name, gpus in pinned.items():
        for index in gpus:
            holders.setdefault(index, set()).add(name)
    for index, pids in on_gpu.items():
        holders[index] |= {name for name, tree in trees.items() if tree & set(pids)}
    return {index: tuple(sorted(names)) for index, names in sorted(holders.items())}


class GpuSampler:
    """Per-GPU memory/utilisation and per-GPU, per-pid memory through NVML, when it works."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self.unavailable: str | None = None
        """Why NVML cannot be used here (None when it can)."""
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # no library, no driver, no GPU: CPU-only sampling
            self.unavailable = f"{type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def sample(self) -> tuple[list[GpuSample], dict[int, dict[int, int]]]:
        """(one sample per GPU, ``GPU index -> pid -> memory bytes``)."""
        nvml = self._nvml
        if nvml is None:
            return [], {}
        gpus: list[GpuSample] = []
        per_gpu: dict[int, dict[int, int]] = {}
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                name = nvml.nvmlDeviceGetName(handle)
                gpus.append(
                    GpuSample(
                        index=index,
                        name=name.decode() if isinstance(name, bytes) else str(name),
                        memory_used_bytes=int(memory.used),
                        memory_total_bytes=int(memory.total),
                        utilization_percent=float(util.gpu),
                    )
                )
                per_pid = per_gpu.setdefault(index, {})
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    per_pid[proc.pid] = per_pid.get(proc.pid, 0) + int(proc.usedGpuMemory or 0)
        except nvml.NVMLError:
            return gpus, per_gpu
        return gpus, per_gpu


def gauges(text: str) -> dict[str, float]:
    """The :data:`GAUGES` found in Prometheus text, by short name."""
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        short = GAUGES.get(name)
        if short is not None:
            with contextlib.suppress(ValueError):
                found[short] = float(value)
    return found


def counter_total(text: str, names: Sequence[str]) -> float | None:
    """Sum of the counters ``names`` over their label sets in Prometheus text (None when
    none is there)."""
    total, found = 0.0, False
    for line in text.splitlines():
        counter = next((c for c in names if line.startswith(c)), None)
        if counter is not None and line[len(counter) : len(counter) + 1] in (" ", "{"):
            with contextlib.suppress(ValueError, IndexError):
                total += float(line.rsplit(maxsplit=1)[-1])
                found = True
    return total if found else None


def generation_tokens(text: str) -> float | None:
    """Sum of the generated-token counter over its label sets in Prometheus text."""
    return counter_total(text, TOKENS_COUNTERS)


class TokenRate:
    """Tokens/s of one server from successive scrapes of its Prometheus counter.

    Each server instance (a pid) has its own counter, from zero: a rate never spans two
    instances, and a new instance's first scrape already gives one (tokens since it became
    ready), so a server restarted every few steps is still measured between its restarts.
    """

    def __init__(self) -> None:
        self._instance: int | None = None
        self._last: tuple[float, float] | None = None

    def update(
        self, t: float, total: float, instance: int | None = None, ready_at: float | None = None
    ) -> float | None:
        if instance != self._instance:
            self._instance = instance
            self._last = None if ready_at is None else (ready_at, 0.0)
        last, self._last = self._last, (t, total)
        if last is None or t <= last[0] or total < last[1]:
            return None
        return (total - last[1]) / (t - last[0])


class Samplers:
    """All samplers behind one call, made every couple of seconds by the supervisor."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client
        self._trees = TreeSampler()
        self._gpus = GpuSampler()
        self._rates: dict[str, TokenRate] = {}
        self._told_no_gpu = False

    async def sample(
        self,
        children: Mapping[str, Child],
        scrape: Mapping[str, Scrape],
    ) -> tuple[list[Event], dict[str, float]]:
        """(events to publish, metric values); ``scrape`` maps name -> its endpoint."""
        events: list[Event] = []
        values: dict[str, float] = {}
        if self._gpus.unavailable is not None and not self._told_no_gpu:
            self._told_no_gpu = True
            message = f"GPU memory is not sampled: NVML is unavailable ({self._gpus.unavailable})"
            events.append(Notice(level="debug", message=message))
        gpus, per_gpu = self._gpus.sample()
        trees = self._trees.sample(children)
        holders = gpu_holders(
            per_gpu,
            {name: pids for name, (_, _, pids) in trees.items()},
            {name: pinned_gpus(child.spec.env) for name, child in children.items()},
        )
        for gpu in gpus:
            events.append(dataclasses.replace(gpu, holders=holders.get(gpu.index, ())))
            values[f"gpu/{gpu.index}/memory_used_bytes"] = gpu.memory_used_bytes
            values[f"gpu/{gpu.index}/utilization_percent"] = gpu.utilization_percent
        gpu_by_pid: dict[int, int] = {}
        for per_pid in per_gpu.values():
            for pid, used in per_pid.items():
                gpu_by_pid[pid] = gpu_by_pid.get(pid, 0) + used
        for name, (cpu, rss, pids) in trees.items():
            gpu_memory = sum(gpu_by_pid.get(pid, 0) for pid in pids) if gpus else None
            events.append(
                ResourceSample(
                    process=name, cpu_percent=cpu, rss_bytes=rss, gpu_memory_bytes=gpu_memory
                )
            )
            values[f"process/{name}/cpu_percent"] = cpu
            values[f"process/{name}/rss_bytes"] = rss
            if gpu_memory is not None:
                values[f"process/{name}/gpu_memory_bytes"] = gpu_memory
        scraped = await asyncio.gather(*(self._scrape(name, at) for name, at in scrape.items()))
        for name, found in zip(scrape, scraped, strict=True):
            values |= {f"{name}/{short}": value for short, value in found.items()}
        return events, values

    async def _scrape(self, name: str, at: Scrape) -> dict[str, float]:
        """``tokens_per_s`` (between this scrape and the last) and the :data:`GAUGES`."""
        try:
            response = await self._client.get(at.url, timeout=SCRAPE_TIMEOUT)
        except httpx.HTTPError:
            return {}
        if response.status_code != 200:
            return {}
        found = gauges(response.text)
        total = generation_tokens(response.text)
        if total is not None:
            rate = self._rates.setdefault(name, TokenRate())
            tokens = rate.update(time.time(), total, at.instance, at.ready_at)
            if tokens is not None:
                found["tokens_per_s"] = tokens
        return found
