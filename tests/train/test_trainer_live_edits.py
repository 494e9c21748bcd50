"""Live edits reach the real trainer at its next step boundary and survive a restart.

The trainer reads ``<run dir>/live_edits.json`` (``grpo_trainer.live_edits``) before each
step and at start. Its batches come from a file it waits on, so the test decides where
each step boundary falls: 3 steps, then an edit, 2 more steps, then SIGKILL and a resume
with the profile's original command line (what a crash restart without the role layer
would start), which must still train with the edited values.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_trainer_resume import wait_for
from train_helpers import REPO, make_groups, tiny_model, trainer_command, trainer_env, write_groups

from grpo_trainer.live_edits import record_edit

ARGS = ("--training-steps", "6", "--batch-size", "2", "--gradient-accumulation-steps", "2")
EDIT = {"lr": 5e-4, "clip_eps": 0.1, "clip_eps_high": 0.3, "entropy_coef": 0.01, "tis_cap": 2.0}


def records(path: Path) -> dict[int, dict[str, float]]:
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r["data"] for r in lines}


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen]]:
    """Trainers a test starts; each is killed with its process group at teardown."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_an_edit_applies_from_the_next_step_and_survives_a_restart(
    tmp_path: Path, spawned: list[subprocess.Popen]
) -> None:
    model = tiny_model(tmp_path / "model")
    groups = make_groups(model, count=12, group_size=2, seed=5)
    data = write_groups(tmp_path / "data.jsonl", groups[:6])
    metrics = tmp_path / "metrics.jsonl"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    command = trainer_command(
        model, tmp_path / "save", data, *ARGS, "--checkpoint-interval", "1",
        "--metrics-file", str(metrics), "--resume", "auto",
    )  # fmt: skip
    env = trainer_env(GRPO_TUI_RUN_DIR=str(run_dir))

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(
            command, env=env, cwd=REPO, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        spawned.append(proc)
        return proc

    first = start()
    wait_for(lambda: 3 in records(metrics), 120, "step 3", first)
    record_edit(run_dir, EDIT)
    write_groups(data, groups[6:10], mode="a")
    wait_for(lambda: 5 in records(metrics), 120, "step 5", first)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)

    write_groups(data, groups[10:], mode="a")
    second = start()
    _, stderr = second.communicate(timeout=120)
    assert second.returncode == 0, stderr

    steps = records(metrics)
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    for step in (1, 2, 3):
        assert steps[step]["hparam/lr"] == 1e-3 and steps[step]["lr"] == 1e-3
        assert steps[step]["hparam/clip_eps"] == 0.2
        assert "hparam/tis_cap" not in steps[step]
    for step in (4, 5, 6):  # 6: after SIGKILL, resumed from step 5 with the old command line
        assert steps[step]["lr"] == EDIT["lr"]
        assert {k: steps[step][f"hparam/{k}"] for k in EDIT} == EDIT
