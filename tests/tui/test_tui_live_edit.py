"""``e`` on the dashboard: a live edit through the dialog (Pilot, a real Supervisor with the
real role layer's editor and a stand-in trainer that reads edits as the real one does)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Input, Static

from grpo_tui.app import GrpoTuiApp
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.run_state import SUPERVISOR_LOG, RunState
from grpo_tui.screens.live_edit import LiveEditScreen
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.spec import LogLineProbe, ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[2]
CHILD = REPO / "tests" / "cli" / "edits_child.py"


async def wait_for(pilot: Pilot[Any], what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


async def test_e_edits_a_running_trainer_and_shows_a_refusal(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    plan = build_plan(load_profile(REPO / "profiles" / "quickstart.toml"), run_dir)
    trainer = ProcessSpec(
        name="trainer",
        role="trainer",
        command=[sys.executable, str(CHILD)],
        readiness=LogLineProbe(pattern="grpo-trainer ready", period=0.05),
    )
    supervisor = Supervisor([trainer], run_dir)
    app = GrpoTuiApp(
        RunState("edit-run", mode="none"),
        stack=GrpoStack(supervisor, editor=plan.edit),
        keymap_path=tmp_path / "no-keymap.toml",
    )
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, "trainer ready", lambda: supervisor.status()["trainer"].pid)
        await pilot.press("e")
        assert isinstance(app.screen, LiveEditScreen)
        await pilot.press(*"beta=-1", "enter")
        result = app.screen.query_one("#edit-result", Static)
        assert "refused: beta: Input should be greater than or equal to 0" in str(result.render())
        assert isinstance(app.screen, LiveEditScreen)  # still open to correct it

        field = app.screen.query_one(Input)
        field.value = ""
        await pilot.press(*"lr=3e-5 entropy_coef=0.01", "enter")
        assert not isinstance(app.screen, LiveEditScreen)
        log = run_dir / "logs" / "trainer.log"
        took = 'took {"entropy_coef": 0.01, "lr": 3e-05}'
        await wait_for(pilot, "the trainer took it", lambda: took in log.read_text())
        events = app.state.logs[SUPERVISOR_LOG]
        await wait_for(
            pilot,
            "the edit in the event log",
            lambda: any("live edit: lr=3e-05, entropy_coef=0.01" in line for line in events.lines),
        )
        await pilot.press("e")
        keys = str(app.screen.query_one("#edit-keys", Static).render())
        assert "edited so far: lr=3e-05  entropy_coef=0.01" in keys
        await pilot.press("escape")
        assert not isinstance(app.screen, LiveEditScreen)
