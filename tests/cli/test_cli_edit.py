"""``grpo-tui edit RUN_DIR key=value`` on a running, headless supervisor (no dashboard).

The supervisor runs with the real role layer's editor (the quickstart profile's plan) and
a stand-in trainer that reads the run's edits the way the real one does; the edit goes
through the real CLI, the real control socket, validation, the run directory and the
journal that ``grpo-tui view`` reads.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.run_files import load_run
from grpo_tui.run_state import SUPERVISOR_LOG
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.spec import LogLineProbe, ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("edits_child.py")


async def grpo_tui_edit(run_dir: Path, *assignments: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grpo_tui", "edit", str(run_dir), *assignments,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def until(what: str, predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_edit_over_the_control_socket(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    plan = build_plan(load_profile(REPO / "profiles" / "quickstart.toml"), run_dir)
    trainer = ProcessSpec(
        name="trainer",
        role="trainer",
        command=[sys.executable, str(CHILD)],
        readiness=LogLineProbe(pattern="grpo-trainer ready", period=0.05),
    )
    supervisor = GrpoStack(Supervisor([trainer], run_dir), editor=plan.edit).supervisor
    run = asyncio.create_task(supervisor.run())
    log = run_dir / "logs" / "trainer.log"
    try:
        await until("trainer ready", lambda: supervisor.status()["trainer"].state == "ready")

        code, out, err = await grpo_tui_edit(run_dir, "lr=2e-5", "clip_eps_high=0.28")
        assert code == 0, err
        assert out.strip() == "edited lr=2e-05 clip_eps_high=0.28 -> trainer (from their next step)"
        took = 'took {"clip_eps_high": 0.28, "lr": 2e-05}'
        await until("the trainer took the edit", lambda: took in log.read_text())

        code, _, err = await grpo_tui_edit(run_dir, "lr=-1")
        assert code == 2 and "lr: Input should be greater than 0 (got -1)" in err
        code, _, err = await grpo_tui_edit(run_dir, "clip_low=0.1")
        assert code == 2 and "not editable: clip_low; editable: lr, lora_lr" in err
        code, _, err = await grpo_tui_edit(run_dir, "lr")
        assert code == 2 and "expected key=value, got 'lr'" in err

        # kept for a restart: the trainer's spec now carries the edited value
        command = supervisor.spec("trainer").command
        assert command[command.index("--lr") + 1] == "2e-05"
        edits = json.loads((run_dir / "live_edits.json").read_text())
        assert edits["values"] == {"lr": 2e-05, "clip_eps_high": 0.28}
        assert [h["values"] for h in edits["history"]] == [edits["values"]]  # refusals: none
    finally:
        await supervisor.shutdown("test finished")
        async with asyncio.timeout(60):
            await run

    state, _ = load_run(run_dir)  # what grpo-tui view shows
    lines = list(state.logs[SUPERVISOR_LOG].lines)
    assert any("live edit: lr=2e-05, clip_eps_high=0.28 -> trainer" in line for line in lines)


async def test_edit_reaches_a_run_whose_directory_is_too_long_for_a_socket(
    tmp_path: Path,
) -> None:
    """A Unix socket path holds ~100 bytes: the supervisor of a run in a longer directory
    serves its socket from the temp dir, and ``grpo-tui edit`` (and ``attach``) found no
    socket in the run directory ("not running?") until it was linked there."""
    run_dir = tmp_path / ("a-long-folder-name-" * 6) / "run"
    plan = build_plan(load_profile(REPO / "profiles" / "quickstart.toml"), run_dir)
    trainer = ProcessSpec(
        name="trainer",
        role="trainer",
        command=[sys.executable, str(CHILD)],
        readiness=LogLineProbe(pattern="grpo-trainer ready", period=0.05),
    )
    supervisor = GrpoStack(Supervisor([trainer], run_dir), editor=plan.edit).supervisor
    run = asyncio.create_task(supervisor.run())
    try:
        await until("trainer ready", lambda: supervisor.status()["trainer"].state == "ready")
        assert len(str(run_dir / "control.sock")) > 100
        code, out, err = await grpo_tui_edit(run_dir, "lr=2e-5")
        assert code == 0, err
        assert out.strip() == "edited lr=2e-05 -> trainer (from their next step)"
    finally:
        await supervisor.shutdown("test finished")
        async with asyncio.timeout(60):
            await run
    assert not (run_dir / "control.sock").is_symlink(), "the link outlived the run"
