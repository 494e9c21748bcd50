"""benchmarks/gpu_idle.py without a GPU: the empty-GPU check and the clock samples.

NVML cannot run here (no driver), so a stand-in plays the GPU's NVML answers; the process
that "holds" the GPU is a real one we start, to show the check names it and leaves it be.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_idle  # noqa: E402
import workload_startup  # noqa: E402


class FakeNvml:
    """A GPU whose compute processes leave after ``busy_for`` seconds (never: None)."""

    def __init__(self, pid: int, busy_for: float | None, used_busy: float = 9000.0) -> None:
        self.pid, self.busy_for, self.used_busy = pid, busy_for, used_busy
        self.began = time.monotonic()
        self.reads = 0

    def _busy(self) -> bool:
        return self.busy_for is None or time.monotonic() - self.began < self.busy_for

    def used_mib(self, index: int) -> float:
        return self.used_busy if self._busy() else 600.0

    def processes(self, index: int) -> list[tuple[int, float]]:
        return [(self.pid, self.used_busy - 500)] if self._busy() else []

    def sample(self, index: int) -> dict[str, float]:
        self.reads += 1
        slow = self.reads % 2 == 0  # every other sample: a power-capped clock
        return {"used_mib": 1000.0 + self.reads, "sm_mhz": 1500.0 if slow else 1980.0,
                "mem_mhz": 3201.0, "power_w": 700.0 if slow else 450.0, "temp_c": 50.0,
                "util": 100.0, "reasons": 0x4 if slow else 0.0}  # fmt: skip


def test_waits_until_the_leftovers_are_gone() -> None:
    check = gpu_idle.wait_empty([0], timeout=30, nvml=FakeNvml(4242, busy_for=1.0), period=0.1)
    assert check.status == "empty" and check.empty
    assert 0.9 <= check.waited_s < 30 and check.used_mib == {0: 600.0} and not check.processes
    assert check.describe().startswith("empty (0.6 GiB used, waited ")


def test_a_busy_gpu_is_named_after_the_bounded_wait_and_nothing_is_killed() -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        check = gpu_idle.wait_empty([0], timeout=0.5, nvml=FakeNvml(holder.pid, None), period=0.1)
        assert check.status == "not empty" and not check.empty and check.waited_s >= 0.5
        (seen,) = check.processes
        assert seen.startswith(f"GPU 0 pid {holder.pid} python") and seen.endswith("8500 MiB")
        assert holder.poll() is None  # found there, left alone
    finally:
        holder.kill()
        holder.wait()


def test_memory_alone_keeps_a_gpu_busy() -> None:
    """No process listed (another container's, hidden) but 9 GiB in use: not empty."""

    class Hidden(FakeNvml):
        def processes(self, index: int) -> list[tuple[int, float]]:
            return []

    check = gpu_idle.wait_empty([0], timeout=0.2, nvml=Hidden(1, None), period=0.05)
    assert check.status == "not empty" and check.used_mib == {0: 9000.0}


def test_without_nvml_nothing_is_checked_and_the_row_says_so() -> None:
    check = gpu_idle.wait_empty([], timeout=30)
    assert check.status == "no NVML" and check.describe() == "not checked (no NVML)"


def test_samples_are_cut_at_step_ends_and_correlated_with_step_times() -> None:
    nvml = FakeNvml(1, None)
    with gpu_idle.GpuSampler([0], period=0.05, nvml=nvml) as sampler:
        time.sleep(0.6)
    rows = sampler.compact()
    assert len(rows) >= 5 and sampler.peak_mib == max(r[7] for r in rows)
    assert dict(zip(gpu_idle.COLUMNS, rows[0], strict=True))["mem_mhz"] == 3201.0
    start = rows[0][0]
    # step 1 covers the first sample only (full clock), step 2 the rest (half capped)
    steps = gpu_idle.per_step(rows, [start - 0.01, start + 0.01, rows[-1][0] + 0.01])
    assert steps[0]["sm_mhz"] == 1980.0 and steps[0]["reasons"] == []
    assert steps[1]["samples"] == len(rows) - 1 and "sw_power_cap" in steps[1]["reasons"]
    assert gpu_idle.correlation([10.0, 12.0, 15.0], [1980.0, 1700.0, 1400.0]) < -0.9
    assert gpu_idle.correlation([10.0, 10.0, 10.0], [1.0, 2.0, 3.0]) is None


def test_startup_breakdown_of_a_run_folder(tmp_path: Path) -> None:
    """The supervisor's state changes and vLLM's log lines give each part of a start-up."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    began = 1000.0
    events = [("model", "completed", 1012.0), ("inference", "starting", 1012.5),
              ("trainer", "starting", 1013.0), ("trainer", "ready", 1040.0),
              ("inference", "ready", 1090.0)]  # fmt: skip
    (run / "events.jsonl").write_text("".join(
        json.dumps({"type": "StateChanged", "process": p, "old": "pending", "new": n, "t": t})
        + "\n" for p, n, t in events
    ))  # fmt: skip
    (run / "metrics.jsonl").write_text(
        '{"type": "metrics", "process": "trainer", "step": 1, "t": 1125.0, '
        '"data": {"step_time": 3.0}}\n'
    )
    (run / "logs" / "inference.log").write_text(
        "vllm_launch: vLLM imported in 22.4 s\n"
        "Loading weights took 1.50 seconds\n"
        "Dynamo bytecode transform time: 2.40 s\n"
        "Compiling a graph for compile range (1, 8192) takes 14.00 s\n"
        "Compiling a graph for compile range (1, 512) takes 2.00 s\n"
        "Graph capturing finished in 16 secs, took 0.30 GiB\n"
        "init engine (profile, create kv cache, warmup model) took 42.80 seconds\n"
    )
    got = workload_startup.run_startup(run, began)
    assert got == {
        "model_built": 12.0, "inference_spawned": 12.5, "inference_ready": 90.0,
        "trainer_spawned": 13.0, "trainer_ready": 40.0, "first_step": 125.0,
        "weights_s": 1.5, "dynamo_s": 2.4, "inductor_s": 16.0, "graph_capture_s": 16.0,
        "engine_init_s": 42.8, "vllm_import_s": 22.4,
    }  # fmt: skip
    trl = workload_startup.trl_startup(
        {"import_s": 9.0, "init_s": 60.2, "first_step_end": 1080.0},
        "Loading weights took 0.90 seconds\n", began,
    )  # fmt: skip
    assert trl == {"import_s": 9.0, "init_s": 60.2, "first_step": 80.0, "weights_s": 0.9}
    table = workload_startup.table([("sync #0", got), ("trl-best #0", trl)])
    assert table[0].startswith("| run | model built | vLLM spawned | vLLM import s |")
    assert "| trl-best #0 | - | - | - | 0.9 |" in table[3] and table[3].endswith("| 80.0 |")
