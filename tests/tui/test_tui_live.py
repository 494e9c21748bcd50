"""Pilot tests of the dashboard over a real Supervisor running small real child scripts."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from textual.pilot import Pilot
from textual.widgets import Input, OptionList
from tui_stack import respec_for, stack

from grpo_tui.app import GrpoTuiApp
from grpo_tui.commands import ActionsProvider
from grpo_tui.run_state import LIVE_STATES, RunState
from grpo_tui.screens.logs import LogsScreen
from grpo_tui.screens.mode_switch import ModeSwitchScreen
from grpo_tui.screens.quit_confirm import QuitConfirmScreen
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.events import State
from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor
from grpo_tui.widgets.key_bar import KeyBar
from grpo_tui.widgets.log_pane import LogPane
from grpo_tui.widgets.process_table import ProcessTable

SIZE = (160, 50)
DEADLINE = 20.0


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[Callable[..., GrpoTuiApp]]:
    """Apps over real supervisors; afterwards, any process group still alive is SIGKILLed."""
    apps: list[GrpoTuiApp] = []

    def make(specs: list[ProcessSpec], **kwargs: Any) -> GrpoTuiApp:
        supervisor = Supervisor(specs, tmp_path / f"run{len(apps)}", respec=respec_for(specs))
        app = GrpoTuiApp(
            RunState("test-run", mode="none"),
            stack=GrpoStack(supervisor),
            keymap_path=tmp_path / "no-keymap.toml",
            **kwargs,
        )
        apps.append(app)
        return app

    yield make
    for app in apps:
        assert app.supervisor is not None
        for status in app.supervisor.status().values():
            if status.pid is not None and status.state in LIVE_STATES:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(status.pid, signal.SIGKILL)


async def wait_for(pilot: Pilot[Any], what: str, predicate: Callable[[], bool]) -> None:
    """Poll a real condition (letting the app run) until it holds or the deadline passes."""
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def cell(app: GrpoTuiApp, process: str, column: str) -> str:
    """The text of a cell of the process table as drawn ("" before the row exists)."""
    table = app.screen.query_one(ProcessTable)
    if process not in table.rows:
        return ""
    return table.get_cell(process, column).plain


def state_of(app: GrpoTuiApp, name: str) -> State | None:
    row = app.state.processes.get(name)
    return row.state if row else None


async def select(pilot: Pilot[Any], app: GrpoTuiApp, name: str) -> None:
    table = app.screen.query_one(ProcessTable)
    table.move_cursor(row=table.get_row_index(name))
    await pilot.pause()
    assert app.selected_process == name


async def test_table_follows_start_and_crash_loop(make_app) -> None:
    app = make_app(stack(crasher=True))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, "both ready", lambda: cell(app, "trainer", "state") == "ready")
        assert cell(app, "inference", "state") == "ready"
        assert cell(app, "inference", "pid") == str(app.supervisor.status()["inference"].pid)
        await wait_for(
            pilot, "flaky failed", lambda: cell(app, "flaky", "state").startswith("failed")
        )
        assert "crash loop" in cell(app, "flaky", "state")
        assert cell(app, "flaky", "restarts") == "3"
        assert any(alert.process == "flaky" for alert in app.alerts.values())
        await wait_for(pilot, "charts fed", lambda: "loss" in app.state.metrics.names())
        assert app.state.step() is not None and app.state.step() > 0


async def test_actions_restart_stop_start_kill(make_app) -> None:
    app = make_app(stack())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, "trainer ready", lambda: state_of(app, "trainer") == State.READY)
        old_pid = app.supervisor.status()["inference"].pid
        await pilot.press("i")  # restart inference
        await wait_for(
            pilot,
            "inference restarted",
            lambda: (
                app.supervisor.status()["inference"].pid not in (None, old_pid)
                and state_of(app, "inference") == State.READY
            ),
        )
        assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == "zombie"

        await select(pilot, app, "trainer")
        await pilot.press("x")
        await wait_for(pilot, "trainer stopped", lambda: cell(app, "trainer", "state") == "stopped")
        await pilot.press("s")
        await wait_for(
            pilot, "trainer ready again", lambda: cell(app, "trainer", "state") == "ready"
        )
        trainer_pid = app.supervisor.status()["trainer"].pid
        await pilot.press("K")
        await wait_for(pilot, "trainer killed", lambda: state_of(app, "trainer") == State.STOPPED)
        assert (
            not psutil.pid_exists(trainer_pid) or psutil.Process(trainer_pid).status() == "zombie"
        )
        await pilot.press("r")  # restart the selected (stopped) trainer
        await wait_for(pilot, "trainer restarted", lambda: state_of(app, "trainer") == State.READY)


async def test_logs_screen_follow_filter_full_screen(make_app) -> None:
    app = make_app(stack())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, "trainer ready", lambda: state_of(app, "trainer") == State.READY)
        await select(pilot, app, "inference")
        await pilot.press("l")
        logs = app.screen
        assert isinstance(logs, LogsScreen)
        await wait_for(
            pilot,
            "inference pane",
            lambda: logs.active_pane is not None and logs.active_pane.stream == "inference",
        )
        pane = logs.active_pane
        await wait_for(pilot, "ticks shown", lambda: any("tick" in line for line in pane.text))
        await pilot.press("f")  # pause
        frozen = list(pane.text)
        await wait_for(
            pilot, "more output", lambda: app.state.logs["inference"].total > pane._seen + 20
        )
        assert pane.text == frozen
        await pilot.press("f")  # follow again: catches up
        assert len(pane.text) > len(frozen) or pane.text[-1] != frozen[-1]
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"ready", "enter")
        assert state_of(app, "inference") == State.READY  # "r" went to the field, not a restart
        assert pane.text and all("ready" in line for line in pane.text)
        await pilot.press("z")
        assert logs.maximized is pane
        await pilot.press("escape")
        assert logs.maximized is None
        await pilot.press("d")
        assert not isinstance(app.screen, LogsScreen)


async def test_mode_switch_modal_drives_a_real_switch(make_app) -> None:
    app = make_app(stack())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, "trainer ready", lambda: state_of(app, "trainer") == State.READY)
        old_trainer = app.supervisor.status()["trainer"].pid
        await pilot.press("m")
        modal = app.screen
        assert isinstance(modal, ModeSwitchScreen)
        options = modal.query_one(OptionList)
        options.highlighted = [o.id for o in options.options].index("lora_only")
        await pilot.pause()
        plan = str(modal.query_one("#mode-plan").render())
        assert plan.startswith("By restarts (no plan to ask):") and "lora_only" in plan
        await pilot.click("#mode-confirm")
        await wait_for(pilot, "switch done", lambda: modal.result == "lora_only")
        assert app.state.mode == "lora_only"
        status = app.supervisor.status()
        assert status["trainer"].pid != old_trainer
        assert status["trainer"].state == State.READY
        assert "trainer mode lora_only" in app.supervisor.recent_lines("trainer")
        progress = modal.query_one(LogPane)
        await wait_for(
            pilot,
            "progress shown",
            lambda: any("mode lora_only active" in line for line in progress.text),
        )
        assert any("stopping trainer" in line for line in progress.text)
        await pilot.click("#mode-cancel")
        assert not isinstance(app.screen, ModeSwitchScreen)


async def test_quit_confirms_while_training_and_leaves_nothing_alive(make_app) -> None:
    app = make_app(stack())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, "trainer ready", lambda: state_of(app, "trainer") == State.READY)
        pids = [s.pid for s in app.supervisor.status().values() if s.pid]
        assert len(pids) == 2
        await pilot.press("q")
        assert isinstance(app.screen, QuitConfirmScreen)
        await pilot.press("n")
        assert not isinstance(app.screen, QuitConfirmScreen)
        assert state_of(app, "trainer") == State.READY
        await pilot.press("q")
        await pilot.click("#quit-yes")
        await wait_for(pilot, "app exit", lambda: app.return_code is not None)
    assert all(
        not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie" for pid in pids
    )
    assert {s.state for s in app.supervisor.status().values()} <= {State.STOPPED, State.COMPLETED}


async def test_command_palette_lists_every_action(make_app) -> None:
    app = make_app(stack())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, "trainer ready", lambda: state_of(app, "trainer") == State.READY)
        names = [name for name, _, _ in ActionsProvider(app.screen).commands()]
        for expected in (
            "Restart trainer",
            "Stop inference",
            "Start trainer",
            "Kill inference",
            "Restart inference",
            "Switch weight-sync mode",
            "Quit",
            "Logs: trainer",
        ):
            assert expected in names
        await pilot.press("ctrl+p")
        await pilot.press(*"stop trai")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, "trainer stopped", lambda: state_of(app, "trainer") == State.STOPPED)


async def test_every_key_stays_on_the_key_bar_at_100_columns(make_app) -> None:
    """All of the dashboard's keys (a live run's: the actions too) are on the bar at 100
    columns, with their labels: on two lines there (one label-less line read "r x s K i m
    e d l g t ? q"), on one line when wide."""
    app = make_app(stack())
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, "trainer ready", lambda: state_of(app, "trainer") == State.READY)
        bar = app.screen.query_one(KeyBar)
        lines = bar.render().plain.split("\n")
        assert len(lines) == 2 and bar.size.height == 2
        text = " ".join(lines)
        for shown in (
            " r Restart ",
            " x Stop ",
            " s Start ",
            " K Kill ",
            " i Restart inference ",
            " m Mode ",
            " e Edit ",
            " l Logs ",
            " g Rollouts ",
            " t Timeline ",
            " ? Help ",
            " q Quit ",
        ):
            assert shown in text, (shown, lines)
        assert lines[-1].rstrip().endswith("^p palette") and all(len(x) <= 100 for x in lines)
        await pilot.resize_terminal(200, 30)
        await pilot.pause()
        wide = bar.render().plain
        assert "\n" not in wide and bar.size.height == 1
        assert " i Restart inference " in wide and " t Timeline " in wide
