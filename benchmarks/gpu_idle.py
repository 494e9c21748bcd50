"""The GPU as a benchmark finds it and as it runs: an empty-GPU check, and NVML samples.

Issue 39: a run that follows another on the same GPU must not share it with the last one's
leftovers (an engine core, a compile worker), and TRL's step times vary from 9.9 to 17.9 s
within a run on one H200, so each run samples the GPU's clocks and power to explain that.

- :func:`wait_empty`: wait, bounded, until the GPUs show no compute process and at most
  ``max_used_mib`` of memory in use; returns what it saw (:class:`EmptyCheck`), for the
  run's row. It never kills anything: a process found there is named, not touched.
- :class:`GpuSampler`: a thread sampling memory used, SM and memory clocks, power,
  temperature, utilisation and NVML's clock-event reasons (power cap, thermal slowdown...)
  every ``period`` seconds while a ``with`` block runs; :func:`per_step` cuts the samples
  at a run's step boundaries.

Every NVML call goes through :class:`Nvml` (``nvidia-ml-py``, in the GPU image); on a
machine without NVML both report that and return at once. NVML is read only: no CUDA
context is created, so the checking process itself never holds GPU memory.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

MIB = 1024 * 1024
EMPTY_MIB = 1024
"""Memory in use (MiB) below which a GPU with no compute process counts as empty."""
REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
"""NVML clock-event reasons that lower the clocks under load (``nvmlClocksEventReason*``;
idle, sync boost and application-clock settings are left out)."""


class NvmlSource(Protocol):
    """What the checks read from NVML (a test gives a stand-in: no GPU there)."""

    def used_mib(self, index: int) -> float: ...

    def processes(self, index: int) -> list[tuple[int, float]]: ...

    def sample(self, index: int) -> dict[str, float]: ...


class Nvml:
    """``nvidia-ml-py`` (``pynvml``), physical GPU indices as nvidia-smi numbers them."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nv = pynvml
        self._handles: dict[int, Any] = {}

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self.nv.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def used_mib(self, index: int) -> float:
        return float(self.nv.nvmlDeviceGetMemoryInfo(self._handle(index)).used) / MIB

    def processes(self, index: int) -> list[tuple[int, float]]:
        """(pid, MiB) of every compute process on the GPU (MiB 0 where NVML hides it)."""
        found = self.nv.nvmlDeviceGetComputeRunningProcesses(self._handle(index))
        return [(int(p.pid), float(p.usedGpuMemory or 0) / MIB) for p in found]

    def sample(self, index: int) -> dict[str, float]:
        """Clocks (MHz), power (W), temperature (C), utilisation (%), used MiB, reasons."""
        nv, handle = self.nv, self._handle(index)
        out = {
            "used_mib": self.used_mib(index),
            "sm_mhz": float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)),
            "mem_mhz": float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM)),
            "power_w": nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "temp_c": float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)),
            "util": float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
        }
        with contextlib.suppress(Exception):  # the newer name first, then the older one
            reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            reasons = reasons or nv.nvmlDeviceGetCurrentClocksThrottleReasons
            out["reasons"] = float(reasons(handle))
        return out


def open_nvml() -> NvmlSource | None:
    """NVML, or None where there is none (no driver, no GPU, no package)."""
    try:
        return Nvml()
    except Exception:
        return None


def process_name(pid: int) -> str:
    """``name`` of a pid, ``?`` where it cannot be read (another container's process)."""
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:
        return "?"


@dataclass
class EmptyCheck:
    """What :func:`wait_empty` saw: whether the GPUs were empty, and after how long."""

    gpus: list[int]
    status: str = "no NVML"
    """``empty``, ``not empty`` (the wait ran out) or ``no NVML`` (nothing checked)."""
    waited_s: float = 0.0
    used_mib: dict[int, float] = field(default_factory=dict)
    """Per GPU: memory in use at the end of the wait."""
    processes: list[str] = field(default_factory=list)
    """``GPU pid name MiB`` of every compute process seen at the end of the wait."""
    max_used_mib: float = EMPTY_MIB
    """The most memory in use that counted as empty."""

    @property
    def empty(self) -> bool:
        return self.status == "empty"

    def describe(self) -> str:
        """One cell: ``empty (0.6 GiB used, waited 0.0 s)`` or what was there."""
        used = ", ".join(f"{u / 1024:.1f}" for u in self.used_mib.values())
        if self.status == "no NVML":
            return "not checked (no NVML)"
        what = f"{self.status} ({used} GiB used, waited {self.waited_s:.1f} s"
        if self.processes:
            what += "; " + "; ".join(self.processes)
        return what + ")"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def wait_empty(
    gpus: list[int],
    timeout: float = 90.0,
    *,
    max_used_mib: float = EMPTY_MIB,
    nvml: NvmlSource | None = None,
    period: float = 0.5,
) -> EmptyCheck:
    """Wait up to ``timeout`` s until every GPU of ``gpus`` has no compute process and at
    most ``max_used_mib`` in use. Never kills: what is there is named in the result."""
    check = EmptyCheck(list(gpus), max_used_mib=max_used_mib)
    source = nvml if nvml is not None else open_nvml()
    if source is None or not gpus:
        return check
    began = time.monotonic()
    while True:
        check.used_mib = {i: round(source.used_mib(i), 1) for i in gpus}
        found = [(i, pid, mib) for i in gpus for pid, mib in source.processes(i)]
        check.processes = [f"GPU {i} pid {pid} {process_name(pid)} {mib:.0f} MiB"
                           for i, pid, mib in found]  # fmt: skip
        check.waited_s = round(time.monotonic() - began, 2)
        if not found and all(u <= max_used_mib for u in check.used_mib.values()):
            check.status = "empty"
            return check
        if check.waited_s >= timeout:
            check.status = "not empty"
            return check
        time.sleep(period)


class GpuSampler:
    """NVML samples of some GPUs every ``period`` s while the ``with`` block runs:
    ``samples`` holds ``[time.time(), gpu, {sm_mhz, power_w, ...}]``; ``peak_mib`` the most
    memory in use on any of them."""

    def __init__(
        self, gpus: list[int] | None, period: float = 0.5, nvml: NvmlSource | None = None
    ) -> None:
        self.gpus = list(gpus or [])
        self.period = period
        self.samples: list[tuple[float, int, dict[str, float]]] = []
        self.peak_mib: float | None = None
        self._nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if not self.gpus:
            return self
        source = self._nvml if self._nvml is not None else open_nvml()
        if source is None:
            return self

        def run() -> None:
            while not self._stop.is_set():
                now = time.time()
                for gpu in self.gpus:
                    with contextlib.suppress(Exception):  # one bad read loses one sample
                        values = source.sample(gpu)
                        self.samples.append((now, gpu, values))
                        self.peak_mib = max(self.peak_mib or 0.0, values["used_mib"])
                self._stop.wait(self.period)

        self._thread = threading.Thread(target=run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def compact(self) -> list[list[float]]:
        """The samples as rows for a run's JSON: ``[t, gpu, sm_mhz, mem_mhz, power_w,
        temp_c, util, used_mib, reasons]`` (``-1`` where a value was not read)."""
        keys = ("sm_mhz", "mem_mhz", "power_w", "temp_c", "util", "used_mib", "reasons")
        return [
            [round(t, 2), gpu, *(round(v.get(k, -1.0), 1) for k in keys)]
            for t, gpu, v in self.samples
        ]


COLUMNS = ("t", "gpu", "sm_mhz", "mem_mhz", "power_w", "temp_c", "util", "used_mib", "reasons")
"""The order of :meth:`GpuSampler.compact`'s rows."""


def reason_names(mask: float) -> list[str]:
    """The load-related clock-event reasons set in an NVML mask."""
    if mask < 0:
        return []
    return [name for bit, name in REASONS.items() if int(mask) & bit]


def per_step(rows: list[list[float]], ends: list[float]) -> list[dict[str, Any]]:
    """Per step (the interval between consecutive ``ends``, wall-clock): the samples'
    median SM clock, median power, mean utilisation, and the reasons seen, for the rows of
    :meth:`GpuSampler.compact` (every GPU of the run together)."""
    rows = sorted(rows, key=lambda r: r[0])
    times = [r[0] for r in rows]
    out = []
    for start, end in itertools.pairwise(ends):
        inside = rows[bisect.bisect_left(times, start) : bisect.bisect_right(times, end)]
        step: dict[str, Any] = {"seconds": round(end - start, 3), "samples": len(inside)}
        if inside:
            step["sm_mhz"] = statistics.median(r[2] for r in inside)
            step["power_w"] = statistics.median(r[4] for r in inside)
            step["util"] = statistics.fmean(r[6] for r in inside)
            step["reasons"] = sorted({n for r in inside for n in reason_names(r[8])})
        out.append(step)
    return out


def correlation(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r of two equally long series (None when either is constant or short)."""
    if len(xs) < 3 or len(xs) != len(ys):
        return None
    with contextlib.suppress(statistics.StatisticsError):
        return statistics.correlation(xs, ys)
    return None
