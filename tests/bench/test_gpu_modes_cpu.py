"""CPU smoke of benchmarks/gpu_modes.py: the plumbing the device run depends on.

The GPU run gets very few attempts, so what can run here does: every cell's profile goes
through the real ``grpo-tui check`` (vLLM command lines included), and one real cell runs
the whole supervised stack on CPU with the no-orphan check (SIGKILL of the supervisor).
Each test has its own ports: a check finds a port in use when the real cell, in the other
xdist worker, holds it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_modes.py"


def gpu_modes(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


@pytest.mark.slow
def test_every_cell_profile_passes_check_with_the_vllm_flags(tmp_path: Path) -> None:
    backends = ("--backends", "vllm", "builtin", "sglang", "--port-base", "22000")
    done = gpu_modes(tmp_path / "out", "--dry-run", "--quick", *backends, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    plans = {
        block.split(":", 1)[0]: block
        for block in done.stdout.split("== ")[1:]
        if "check exit 0" in block
    }
    names = [f"{b}-{m}" for b in ("vllm", "builtin") for m in ("none", "lora_only")]
    names += [f"{b}-{m}" for b in ("vllm", "builtin") for m in ("lora_restart", "shared_vllm")]
    names += ["sglang-none", "sglang-lora_only", "sglang-lora_restart"]  # shared_vllm refused
    assert sorted(plans) == sorted(names)
    for mode in ("none", "lora_only", "lora_restart", "shared_vllm"):
        plan = plans[f"vllm-{mode}"]
        # vLLM's CLI pre-imported by our launcher, then served in-process at the gate.
        assert "-m grpo_trainer.serve.vllm_launch serve" in plan
        assert "--enforce-eager --" in plan and "--kv-cache-memory-bytes 536870912" in plan
        assert "--logprobs-mode processed_logprobs" in plan
        assert "--device cuda" in plan and "--dtype bfloat16" in plan  # the trainer's
        # LoRA slots in every mode; sleep mode only in colocate's (CUDA IPC cannot share
        # what its allocator holds) and never in a restart mode's server.
        assert "--enable-lora" in plan and "--enable-sleep-mode" not in plan
        if mode != "lora_restart":  # one server for the in-place modes
            assert "SharedWeightsExtension" in plan and "VLLM_SERVER_DEV_MODE=1" in plan
    # none reloads in place every step; lora_restart restarts inference, every 4 steps.
    assert "--sync-every" not in plans["vllm-none"]
    assert "--sync-every 4" in plans["vllm-lora_restart"]
    builtin_shared = plans["builtin-shared_vllm"]
    # The built-in shared mode shares the server's GPU weights through CUDA IPC.
    assert "--device cpu" not in builtin_shared
    assert "--device cuda" in builtin_shared and "--shared-weights" in builtin_shared
    for mode in ("none", "lora_only", "lora_restart"):  # SGLang: nothing to JIT-compile
        plan = plans[f"sglang-{mode}"]
        assert "-m sglang.launch_server --model-path" in plan
        assert "--attention-backend triton --sampling-backend pytorch" in plan
        assert ("--lora-backend triton" in plan) == mode.startswith("lora")
        assert "--inference-backend sglang" in plan  # the trainer picks the SGLang strategies


def test_colocate_cell_pins_both_roles_to_one_gpu_and_sleeps(tmp_path: Path) -> None:
    """The device script's toy stage: vLLM in sleep mode and the trainer on GPU 0 only."""
    args = ("--backends", "vllm", "--modes", "colocate", "--pin-gpu", "0", "--port-base", "23100")
    done = gpu_modes(tmp_path / "out", "--dry-run", "--quick", *args, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    plan = done.stdout.split("== ")[1]
    assert plan.startswith("vllm-colocate: check exit 0")
    assert "--enable-sleep-mode --worker-extension-cls" in plan
    assert "--weight-bridge-mode colocate --max-sync-lag 0" in plan
    assert plan.count("CUDA_VISIBLE_DEVICES=0") == 2  # inference and trainer, nothing else
    assert "--port 23100" in plan


def test_colocate_layout_puts_a_rank_and_a_vllm_replica_on_each_gpu(tmp_path: Path) -> None:
    """``--layout colocate``: 2 ranks and 2 vLLM replicas, one of each on GPUs 0 and 1."""
    args = ("--backends", "vllm", "--modes", "colocate", "--layout", "colocate")
    args += ("--port-base", "22200")
    done = gpu_modes(tmp_path / "out", "--dry-run", "--quick", *args, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    plan = done.stdout.split("== ")[1]
    assert plan.startswith("vllm-colocate: check exit 0")
    assert "--data-parallel-size 2" in plan and "--enable-sleep-mode" in plan
    assert "--worker-extension-cls" in plan
    assert "--nproc-per-node 2" in plan and "--weight-bridge-mode colocate" in plan
    assert plan.count("CUDA_VISIBLE_DEVICES=0,1") == 2  # inference and trainer


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_one_real_cell_and_the_orphan_check_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = gpu_modes(
        out,
        *("--quick", "--device", "cpu", "--backends", "builtin", "--modes", "shared_vllm"),
        *("--steps", "3", "--orphan-backend", "builtin", "--budget", "360"),
        *("--port-base", "22300"),
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    raw = json.loads((out / "gpu_modes.json").read_text())
    (cell,) = raw["cells"]
    assert cell["status"] == "ok" and cell["steps_done"] == 3
    assert len(cell["sync_times"]) == 3 and all(t >= 0 for t in cell["sync_times"])
    assert len(cell["rewards"]) == 3 and cell["alignment"][0] < 1e-4  # float32, same weights
    # Inference tokens/s needs two scrapes of /metrics a few seconds apart, which a 3-step
    # run may not last; its rate computation is tested in tests/supervisor, its values on the
    # GPU (benchmarks/results/gpu_modes.md).
    assert cell["trainer_tok_s"]
    assert cell["leftovers"] == []
    orphan = raw["orphan_check"]
    assert orphan["passed"] is True, orphan
    assert {"api", "inference", "trainer"} <= {
        entry["process"].split("[")[1].split("]")[0] for entry in orphan["before"]
    }
    assert orphan["left"] == [] and orphan["steps_seen"] >= 1
    table = (out / "gpu_modes.md").read_text()
    assert "| builtin | shared_vllm | cpu, float32, lr 0.003" in table and "| ok | 3/3 |" in table
    assert "No-orphan check" in table and "PASSED (builtin backend)" in table
    for name in ("gpu_diagnostics.md", "gpu_runs.tar.gz"):
        assert (out / name).stat().st_size > 0
