"""Cell states of Slurm cells from the journal (the records the runner writes for a job)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from grpo_tui.sweep.grid import expand, parse_set
from grpo_tui.sweep.slurm_jobs import JobEnd
from grpo_tui.sweep.store import SweepDir


def slurm_sweep(tmp_path: Path) -> SweepDir:
    profile = tmp_path / "p.toml"
    profile.write_text('[run]\nname = "p"\n')
    axes = [parse_set("trainer.lr=1,2,3,4")]
    sweep = SweepDir(tmp_path / "sweep")
    sweep.create_or_match(profile, axes, expand(axes, zipped=False), zipped=False)
    return sweep


def test_a_job_is_pending_then_running_and_ends_as_slurm_says(tmp_path: Path) -> None:
    sweep = slurm_sweep(tmp_path)
    a, b, c, d = (cell.id for cell in sweep.read().cells)
    me = psutil.Process(os.getpid())
    sweep.append("sweep_start", pid=me.pid, create_time=me.create_time())
    for cell, job in ((a, "11"), (b, "12"), (c, "13"), (d, "14")):
        sweep.append("cell_submit", cell=cell, attempt=1, job=job, ports={"api.port": 8000})
    sweep.append("cell_start", cell=b, attempt=1, job="12")
    sweep.append("cell_start", cell=c, attempt=1, job="13")
    sweep.append("cell_end", cell=c, attempt=1, job="13", exit_code=0, slurm_state="CANCELLED")
    sweep.append("cell_start", cell=d, attempt=1, job="14")
    sweep.append("cell_end", cell=d, attempt=1, job="14", exit_code=0, slurm_state="TIMEOUT")
    states = sweep.statuses()
    assert {k: s.state for k, s in states.items()} == {
        a: "pending",
        b: "running",
        c: "interrupted",  # cancelled, whatever its exit code
        d: "failed",  # only COMPLETED with exit 0 is done
    }
    assert states[a].started_at is None and states[b].started_at is not None
    assert [states[k].job for k in (a, b, c, d)] == ["11", "12", "13", "14"]
    assert all(s.attempts == 1 for s in states.values())  # a start is not a new attempt

    sweep.append("sweep_start", pid=me.pid, create_time=0.0)  # a pid reused: that sweep died
    left = sweep.statuses()
    assert left[a].state == left[b].state == "detached"  # the jobs may still run
    assert left[c].state == "interrupted"


def test_only_completed_with_exit_zero_is_done() -> None:
    assert JobEnd("COMPLETED", 0).completed
    assert not JobEnd("COMPLETED", 1).completed and not JobEnd("FAILED", 0).completed
    assert JobEnd("NODE_FAIL", 1).final and JobEnd("UNKNOWN", -1).final
    assert not JobEnd("PENDING", 0).final
