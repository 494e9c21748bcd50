"""CPU check of benchmarks/gpu_holders.py: the plan next to NVML's holders, from run files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from grpo_tui.supervisor.events import GpuSample

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_holders.py"


def run_dir_with(tmp_path: Path, holders: dict[int, tuple[str, ...]]) -> Path:
    run = tmp_path / "run"
    run.mkdir(parents=True)
    shutil.copy(REPO / "profiles" / "qwen2.5-7b-8gpu.toml", run / "profile.toml")
    samples = [
        GpuSample(
            index=index,
            name="H100",
            memory_used_bytes=(index + 1) * 10**9,
            memory_total_bytes=80 * 10**9,
            utilization_percent=90.0,
            holders=names,
        )
        for index, names in holders.items()
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(s.to_json()) + "\n" for s in samples))
    return run


def holders_check(run: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True, cwd=REPO
    )


def test_holders_matching_the_plan_pass_and_a_stray_one_fails(tmp_path: Path) -> None:
    good = {i: ("trainer",) for i in range(4)} | {i: ("inference",) for i in range(4, 8)}
    result = holders_check(run_dir_with(tmp_path / "a", good))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| 0 (H100) | trainer | trainer | 1.0 | 90 | yes |" in result.stdout
    assert "| 7 (H100) | inference | inference | 8.0 | 90 | yes |" in result.stdout
    stray = {**good, 3: ("inference", "trainer")}  # vLLM memory on a trainer GPU
    result = holders_check(run_dir_with(tmp_path / "b", stray))
    assert result.returncode == 1
    assert "| 3 (H100) | trainer | inference, trainer | 4.0 | 90 | NO |" in result.stdout


def test_a_run_without_gpu_samples_says_so(tmp_path: Path) -> None:
    result = holders_check(run_dir_with(tmp_path, {}))
    assert result.returncode == 2
    assert "no GpuSample events" in result.stdout
