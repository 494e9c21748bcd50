"""benchmarks/seven_b_1gpu.py without a GPU: the profile copies it runs, the sync phases it
reads off the trainer's timeline, and the report of a run cut short.

The whole script runs on CPU with ``--cpu`` (``GPU_CPU_CHECK=1 bash
benchmarks/seven_b_1gpu_device.sh``, docs/gpu.md): minutes, so not in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import seven_b_1gpu  # noqa: E402

from grpo_tui.plan.profile import load_profile  # noqa: E402
from grpo_tui.plan.roles import build_plan  # noqa: E402


def specs_of(body: dict, tmp_path: Path) -> dict:
    path = tmp_path / "p.toml"
    path.write_text(seven_b_1gpu.tomli_w.dumps(body))
    return {s.name: s for s in build_plan(load_profile(path), tmp_path / "run").specs}


def test_device_copies_change_only_mode_ports_and_output(tmp_path: Path) -> None:
    body = seven_b_1gpu.profile_body("colocate", [8300, 8301], tmp_path / "runs", cpu=False)
    specs = specs_of(body, tmp_path)
    assert (
        seven_b_1gpu.tomllib.loads(seven_b_1gpu.PROFILE.read_text())["run"]["tiny"]
        == (body["run"]["tiny"])
    )
    assert "--port" in specs["inference"].command and "8301" in specs["inference"].command
    assert "--weight-bridge-mode" in specs["trainer"].command
    assert specs["trainer"].env["CUDA_VISIBLE_DEVICES"] == "0"


def test_cpu_copies_run_the_built_in_server_and_a_tiny_shape(tmp_path: Path) -> None:
    body = seven_b_1gpu.profile_body("lora_only", [8310, 8311], tmp_path / "runs", cpu=True)
    specs = specs_of(body, tmp_path)
    build = specs["model"].command
    assert "--hidden-size" not in build and "--dtype" not in build  # the builder's defaults
    assert "grpo_trainer.serve" in " ".join(specs["inference"].command)
    trainer = specs["trainer"].command
    assert "cuda" not in " ".join(trainer) and "--dtype" not in trainer  # float32 on CPU
    assert "CUDA_VISIBLE_DEVICES" not in specs["trainer"].env


def spans(*items: tuple[str, float, float]) -> list[tuple[str, float, float]]:
    return list(items)


def test_sync_phases_of_a_zero_copy_step_and_a_colocate_step() -> None:
    shared = spans(("wait", 0.0, 1.0), ("forward_backward", 1.0, 1.5), ("optimizer", 1.5, 1.52),
                   ("pause", 1.52, 1.60), ("optimizer", 1.60, 1.75), ("resume", 1.75, 1.80),
                   ("transfer", 1.85, 1.90))  # fmt: skip
    got = seven_b_1gpu.step_phases(shared, "shared_vllm")
    assert got == {"pause": 0.08, "write": 0.15, "resume": 0.05, "reset": 0.05, "total": 0.38}
    colocate = spans(("wait", 0.0, 1.0), ("sleep", 1.0, 1.3), ("forward_backward", 1.3, 2.0),
                     ("optimizer", 2.0, 2.1), ("pause", 2.1, 2.1), ("optimizer", 2.1, 2.2),
                     ("resume", 2.2, 2.2), ("wake", 2.3, 2.5), ("transfer", 2.5, 2.6))  # fmt: skip
    got = seven_b_1gpu.step_phases(colocate, "colocate")
    assert got == {"sleep": 0.3, "wake": 0.2, "reset": 0.1, "total": 0.6}


def test_a_cut_run_reports_its_curve_phases_and_peaks(tmp_path: Path) -> None:
    """The run so far: its 5-step means, the step that reached the target, the process
    peaks (torch and NVML) and the phases, in the table the call returns."""
    run_dir = tmp_path / "run"
    (run_dir / "timeline").mkdir(parents=True)
    rewards = [0.05, 0.1, 0.1, 0.15, 0.1, 0.5, 0.9, 0.95, 0.95, 0.95, 0.95]
    began = 1000.0
    lines = [
        {"type": "metrics", "process": "trainer", "step": i + 1, "t": 1090.0 + i,
         "data": {"reward/mean": r, "step_time": 0.5, "peak_memory_gb": 40.0 + i,
                  "alignment/diff_abs_mean_lag0": 0.004, "alignment/diff_abs_mean": 0.004,
                  "sync_time": 0.02}}
        for i, r in enumerate(rewards)
    ] + [{"type": "metrics", "process": "supervisor", "step": None, "t": 1095.0,
          "data": {"process/inference/gpu_memory_bytes": 21e9,
                   "process/trainer/gpu_memory_bytes": 55e9}}]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    step = {"step": 1, "role": "trainer", "spans": [["pause", 1.0, 1.1], ["optimizer", 1.1, 1.2],
            ["resume", 1.2, 1.25], ["transfer", 1.25, 1.3]]}  # fmt: skip
    (run_dir / "timeline" / "trainer.000000.jsonl").write_text(json.dumps(step) + "\n")
    result = seven_b_1gpu.ModeResult("shared_vllm", began=began)
    seven_b_1gpu.read_run(result, run_dir, target=0.8)
    result.phases = seven_b_1gpu.sync_phases(run_dir, "shared_vllm")
    result.status = "reached"
    assert (result.target_step, result.target_s) == (10, 99.0)  # mean of steps 6-10 = 0.85
    assert result.peaks_gb == {"trainer torch": 50.0, "inference NVML": 21.0,
                               "trainer NVML": 55.0}  # fmt: skip
    assert result.first_step_s == 90.0 and result.step_s == 1.0
    args = argparse.Namespace(cpu=False, target=0.8, call="c1", lr=None)
    build = {"seconds": 61.0, "bytes": 13.1e9, "exit": 0}
    text = seven_b_1gpu.markdown([result, seven_b_1gpu.ModeResult("colocate")], build, {}, args)
    assert "61.0 s, 13.10 GB of files, exit 0" in text
    assert "- full fine-tuning lr 5e-05 (the profile's)" in text
    args.lr = 2e-5  # a second try's --lr is said as not the profile's
    again = seven_b_1gpu.markdown([seven_b_1gpu.ModeResult("colocate")], build, {}, args)
    assert "- full fine-tuning lr 2e-05 (--lr, not the profile's)" in again
    assert "| shared_vllm | reached | 11 | 0.100 | 0.940 | 10 | 99 | 90.0 | 1.00 | " in text
    assert "inference NVML 21.0, trainer NVML 55.0, trainer torch 50.0 |" in text
    assert "| colocate | not run | 0 |" in text
    assert "| shared_vllm | 0.100 / 0.100 (1) | 0.100 / 0.100 (1) | 0.050 / 0.050 (1) | " \
        "0.050 / 0.050 (1) | 0.300 / 0.300 (1) |" in text  # fmt: skip
    assert "- shared_vllm: 5: 0.10 (94 s), 10: 0.85 (99 s)" in text
