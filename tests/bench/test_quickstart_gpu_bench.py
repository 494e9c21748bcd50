"""benchmarks/quickstart_gpu.py without a GPU: the per-mode copies of the profile check,
differ from it only where running modes side by side needs, and the target is judged on
5-step means."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import quickstart_gpu  # noqa: E402

from grpo_tui.plan.profile import load_profile  # noqa: E402
from grpo_tui.plan.roles import build_plan  # noqa: E402


@pytest.mark.parametrize("mode", quickstart_gpu.MODES)
def test_copy_changes_only_mode_ports_gpu_and_output(tmp_path: Path, mode: str) -> None:
    body = quickstart_gpu.profile_copy(mode, [1], [8200, 8201], tmp_path / "runs")
    shipped = tomllib.loads(quickstart_gpu.PROFILE.read_text())
    assert body["trainer"] | {"gpus": [0]} == shipped["trainer"]
    assert body["env"] == shipped["env"] and body["run"]["tiny"] == shipped["run"]["tiny"]
    path = tmp_path / "p.toml"
    path.write_text(quickstart_gpu.tomli_w.dumps(body))
    specs = {s.name: s for s in build_plan(load_profile(path), tmp_path / "run").specs}
    assert specs["trainer"].env["CUDA_VISIBLE_DEVICES"] == "1"
    assert specs["inference"].env["CUDA_VISIBLE_DEVICES"] == "1"
    trainer = " ".join(specs["trainer"].command)
    if mode == "none":  # the trainer's default mode: its command leaves the flag out
        assert "--weight-bridge-mode" not in trainer
    else:
        assert f"--weight-bridge-mode {mode}" in trainer


def test_target_is_the_first_five_step_mean_to_reach_it(tmp_path: Path) -> None:
    rewards = [0.1, 0.1, 0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]  # 5-step means .42 .58 .74 .9 .9
    run_dir = tmp_path / "runs" / "quickstart-gpu-x"
    run_dir.mkdir(parents=True)
    lines = [
        {"type": "metrics", "process": "trainer", "step": i + 1, "t": 100.0 + 2 * i,
         "data": {"reward/mean": r, "step_time": 0.1, "alignment/diff_abs_mean": 0.01 * i}
         | ({"alignment/diff_abs_mean_lag0": 0.004 + 0.001 * i} if i % 2 else {})
         | ({"sync_time": 0.1 * i} if i % 4 == 3 else {})}
        for i, r in enumerate(rewards)
    ] + [
        {"type": "metrics", "process": "supervisor", "step": None, "t": t,
         "data": {"inference/tokens_per_s": rate}}
        for t, rate in ((99.0, 5.0), (101.0, 1000.0), (115.0, 3000.0), (117.0, 7.0))
    ]  # fmt: skip  # syncs at steps 4 and 8; server rates outside the steps' span left out
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = quickstart_gpu.ModeRun("shared_vllm", [0])
    quickstart_gpu.read(run, tmp_path, began=90.0, target=0.8)
    assert run.rewards == rewards
    assert (run.target_step, run.target_s) == (8, 100.0 + 2 * 7 - 90.0)
    args = quickstart_gpu.argparse.Namespace(
        gpus=[0], target=0.8, cpu=False, backend="vllm", profile=quickstart_gpu.PROFILE
    )
    text = quickstart_gpu.markdown([run], {}, args)
    assert (run.sync_times, run.inference_tok_s) == ([0.1 * 3, 0.1 * 7], [1000.0, 3000.0])
    assert "| shared_vllm | 0 | not run | 9 | 0.420 | 0.900 | 8 | 24 | 0.5 / 0.7 (2) |" in text
    assert "| 2,000 / 3,000 | 0.04 / 0.08 |" in text
    assert "| 0.008 / 0.011 (4) |" in text
    assert (
        "- shared_vllm (0): 5: 0.42 (18 s)" in text
    )  # steps 1-5 at t 100..108, began 90  # lag-0 at steps 2, 4, 6, 8: .005 .007 .009 .011


def test_colocate_gets_a_gpu_of_its_own() -> None:
    runs = quickstart_gpu.place(list(quickstart_gpu.MODES), [0, 1])
    assert {r.mode: r.gpus for r in runs} == {
        "shared_vllm": [0], "lora_only": [0], "none": [0], "lora_restart": [0], "colocate": [1]
    }  # fmt: skip
    assert [r.gpus for r in quickstart_gpu.place(["shared_vllm", "colocate"], [3])] == [[3], [3]]


def test_colocate_on_two_gpus_gets_both_and_the_others_the_rest() -> None:
    runs = quickstart_gpu.place(["shared_vllm", "colocate"], [0, 2, 3], colocate_ranks=2)
    assert {r.mode: r.gpus for r in runs} == {"shared_vllm": [0], "colocate": [2, 3]}


def test_two_gpu_colocate_copy_runs_two_ranks_and_two_vllm_replicas(tmp_path: Path) -> None:
    body = quickstart_gpu.profile_copy("colocate", [2, 3], [8200, 8201], tmp_path / "runs")
    shipped = tomllib.loads(quickstart_gpu.PROFILE.read_text())
    assert body["trainer"] | {"gpus": [0]} == shipped["trainer"]  # the recipe as shipped
    assert body["inference"]["data_parallel_size"] == 2
    path = tmp_path / "p.toml"
    path.write_text(quickstart_gpu.tomli_w.dumps(body))
    plan = build_plan(load_profile(path), tmp_path / "run")
    specs = {s.name: s for s in plan.specs}
    assert specs["trainer"].env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert specs["inference"].env["CUDA_VISIBLE_DEVICES"] == "2,3"
    trainer, served = " ".join(specs["trainer"].command), " ".join(specs["inference"].command)
    assert "--nproc-per-node 2" in trainer and "--weight-bridge-mode colocate" in trainer
    assert "--data-parallel-size 2" in served and "--enable-sleep-mode" in served


def test_cpu_copy_runs_gloo_ranks_and_builtin_replicas(tmp_path: Path) -> None:
    body = quickstart_gpu.profile_copy(
        "colocate", [0, 1], [8200, 8201], tmp_path / "runs", cpu=True
    )
    path = tmp_path / "p.toml"
    path.write_text(quickstart_gpu.tomli_w.dumps(body))
    specs = {s.name: s for s in build_plan(load_profile(path), tmp_path / "run").specs}
    trainer, served = " ".join(specs["trainer"].command), " ".join(specs["inference"].command)
    assert "--nproc-per-node 2" in trainer and "--lr 0.001" in trainer
    assert "grpo_trainer.serve" in served and "--data-parallel-size 2" in served
    assert "--device cpu" in served


def test_the_7b_profile_runs_as_placed_and_checks(tmp_path: Path) -> None:
    """Issue 29's run: the 4-GPU profile keeps its placement (3 ranks on 0-2, vLLM on 3);
    only ports, output dir, mode and, with --eager, vLLM's compile change."""
    profile = quickstart_gpu.REPO / "profiles/qwen2.5-7b-4gpu.toml"
    body = quickstart_gpu.profile_copy(
        "shared_vllm", [], [8300, 8301], tmp_path / "runs", profile=profile, eager=True
    )
    shipped = tomllib.loads(profile.read_text())
    assert body["trainer"]["gpus"] == [0, 1, 2] and body["inference"]["gpus"] == [3]
    assert body["inference"]["enforce_eager"] is True
    assert body["run"]["tiny"] == shipped["run"]["tiny"]
    path = tmp_path / "p.toml"
    path.write_text(quickstart_gpu.tomli_w.dumps(body))
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "check", str(path)],
        capture_output=True, text=True, cwd=quickstart_gpu.REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trainer [0, 1, 2] (3 ranks, torchrun); inference [3]" in done.stdout
    assert "--enforce-eager" in done.stdout
