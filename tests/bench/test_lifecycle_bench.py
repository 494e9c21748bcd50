"""benchmarks/lifecycle_gpu.py without a GPU: the arms' profiles, lanes, and one real pass
of the whole plumbing on CPU (the built-in server): start-up timeline, a restart through a
standby, a restart in the ``before`` arm, a switch through the control socket, the tables."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import lifecycle_gpu  # noqa: E402
import tomli_w  # noqa: E402

from grpo_tui.plan.profile import load_profile  # noqa: E402
from grpo_tui.plan.roles import build_plan  # noqa: E402
from grpo_tui.supervisor.spec import Condition  # noqa: E402
from grpo_tui.supervisor.standby import STANDBY_ADOPTED  # noqa: E402


def test_lanes_read_phases_of_cells_and_switch_routes() -> None:
    gpus, phases = lifecycle_gpu.parse_lane(
        "0+1=after/shared_vllm;before/none,after/switch:shared_vllm>lora_only>none"
    )
    assert gpus == [0, 1]
    assert [[c.name for c in phase] for phase in phases] == [
        ["after/shared_vllm"], ["before/none", "after/switch"]
    ]  # fmt: skip
    switch = phases[1][1]
    assert (switch.mode, switch.hops) == ("shared_vllm", ["lora_only", "none"])
    with pytest.raises(ValueError, match="arm must be one of"):
        lifecycle_gpu.parse_lane("0=later/none")
    for lane in lifecycle_gpu.LANES:  # the device call's lanes parse
        lifecycle_gpu.parse_lane(lane)


@pytest.mark.parametrize("arm", lifecycle_gpu.ARMS)
def test_each_arm_is_a_profile_that_plans_its_start(arm: str, tmp_path: Path) -> None:
    args = lifecycle_gpu.argparse.Namespace(
        cpu=False, work=tmp_path, before_set=["inference.max_lora_rank=32"]
    )
    cell = lifecycle_gpu.Cell(arm=arm, mode="lora_restart", gpus=[1])
    body = lifecycle_gpu.arm_profile(cell, [8300, 8301], tmp_path / "runs", args)
    body["inference"]["vllm_executable"] = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(body))
    specs = {s.name: s for s in build_plan(load_profile(path), tmp_path / "run").specs}
    inference, trainer = specs["inference"], specs["trainer"]
    assert ("--enforce-eager" in inference.command) is (arm == "after")
    before = arm == "before"
    assert inference.prestart is inference.standby is (not before)
    assert (inference.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn") is before
    waits = trainer.depends_on["inference"].condition
    assert waits == (Condition.HEALTHY if before else Condition.STARTED)
    rank = inference.command[inference.command.index("--max-lora-rank") + 1]
    assert rank == ("32" if before else "16")  # --before-set reaches the before arm only


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_cpu_pass_measures_start_up_restarts_and_a_switch(tmp_path: Path) -> None:
    # two runs: the switch cell starts cold (start-up by phase), then a restart from the
    # warm cache; the before arm's settings are the unit test's above
    lane = "0=after/switch:shared_vllm>lora_only;after/lora_restart"
    code = lifecycle_gpu.main(
        ["--out", str(tmp_path), "--cpu", "--target", "0", "--cap", "150",
         "--min-cell", "5", "--budget", "560", "--restarts", "1", "--lane", lane]
    )  # fmt: skip
    raw = json.loads((tmp_path / "lifecycle_gpu.json").read_text())
    cells = {f"{c['arm']}/{'switch' if c['hops'] else c['mode']}": c for c in raw["cells"]}
    assert code == 0, {name: (c["status"], c["reason"]) for name, c in cells.items()}
    first = cells["after/switch"]
    assert first["cache"] == "cold"
    ready = first["ready"]
    steps = first["run"]["step_times"]
    assert 0 < ready["inference started"] < ready["inference ready"] <= steps[0]
    assert ready["trainer ready"] <= steps[0]
    cell = cells["after/lora_restart"]
    assert cell["status"] == "restarted", cell
    assert cell["run"]["sync_times"][0] > 0 and cell["restarts"], cell
    assert cell["cache"] == "warm"
    switch = cells["after/switch"]
    assert [(s["from"], s["to"]) for s in switch["switches"]] == [("shared_vllm", "lora_only")]
    assert switch["switches"][0]["seconds"] > 0 and switch["steps_continuous"] is True
    assert all(not c["leftovers"] for c in cells.values())
    runs = tmp_path.glob("work-lifecycle/*-after-lora_restart/runs/*/events.jsonl")
    events = [json.loads(line) for path in runs for line in path.read_text().splitlines()]
    adopted = [e for e in events if e.get("code") == STANDBY_ADOPTED]
    assert adopted, "the after arm's restart used its standby"
    table = (tmp_path / "lifecycle_gpu.md").read_text()
    assert "| lora_restart, one restart (trainer's sync_time, each in order) |" in table
    # asked once HOP_STEPS steps were read (a loaded machine may read one more first)
    row = re.search(r"\| after/switch \| shared_vllm -> lora_only \| (\d+) \|", table)
    assert row is not None and int(row.group(1)) >= lifecycle_gpu.HOP_STEPS, table
