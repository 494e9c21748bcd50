"""``grpo-tui view``: a run directory written by a real Supervisor, opened read-only."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import get_args

import pytest
from tui_recorded_run import recorded_state
from tui_stack import stack

from grpo_trainer.serve.settings import Mode
from grpo_tui.app import GrpoTuiApp, binding_ids
from grpo_tui.keymap import KeymapError, read_keymap
from grpo_tui.run_files import load_run
from grpo_tui.screens.logs import LogsScreen
from grpo_tui.screens.mode_switch import MODE_SUMMARIES
from grpo_tui.screens.run_viewer import RunViewerScreen
from grpo_tui.supervisor.events import State
from grpo_tui.supervisor.supervisor import Supervisor
from grpo_tui.widgets.process_table import ProcessTable


async def record_run(run_dir: Path) -> None:
    """Run the stand-in stack until the trainer sent a few steps, then shut down in order."""
    supervisor = Supervisor(stack(), run_dir)
    runner = asyncio.create_task(supervisor.run())
    try:
        deadline = time.monotonic() + 20
        while (supervisor.metrics.series("loss") or [(0, 0, 0)])[-1][1] < 5:
            assert time.monotonic() < deadline, "no trainer metrics"
            await asyncio.sleep(0.05)
    finally:
        await supervisor.shutdown("test done")
        await runner


async def test_viewer_shows_a_finished_run_read_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    await record_run(run_dir)
    (run_dir / "events.jsonl").open("a").write("{not json\n")

    state, bad = load_run(run_dir)
    assert bad == 1
    assert state.processes["trainer"].state == State.STOPPED
    assert state.step() is not None and state.step() >= 5
    assert any(line.startswith("step ") for line in state.logs["trainer"].lines)

    app = GrpoTuiApp(state, keymap_path=tmp_path / "none.toml")
    async with app.run_test(size=(160, 48)) as pilot:
        assert isinstance(app.screen, RunViewerScreen)
        table = app.screen.query_one(ProcessTable)
        assert table.get_cell("trainer", "state").plain == "stopped"
        assert not app.check_action("restart_process", ())
        await pilot.press("r")  # read-only: nothing to restart, nothing happens
        assert not app._notifications
        await pilot.press("l")
        assert isinstance(app.screen, LogsScreen)
        pane = app.screen.active_pane
        assert pane is not None
        await pilot.press("q")
    assert app.return_code == 0


async def test_user_keymap_remaps_a_binding_by_id(tmp_path: Path) -> None:
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('[keymap]\nshow-logs = "g"\n')
    app = GrpoTuiApp(recorded_state(), keymap_path=keymap)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")  # no longer bound
        assert not isinstance(app.screen, LogsScreen)
        await pilot.press("g")
        assert isinstance(app.screen, LogsScreen)


def test_mode_switch_lists_exactly_the_profile_modes() -> None:
    assert tuple(MODE_SUMMARIES) == get_args(Mode)


def test_bad_keymap_is_refused_with_the_id(tmp_path: Path) -> None:
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('restart-inferense = "ctrl+r"\n')
    with pytest.raises(KeymapError, match="restart-inferense: unknown binding id"):
        read_keymap(keymap, binding_ids())
    keymap.write_text("not toml [\n")
    with pytest.raises(KeymapError, match=str(keymap)):
        read_keymap(keymap, binding_ids())
    assert read_keymap(tmp_path / "absent.toml", binding_ids()) == {}
