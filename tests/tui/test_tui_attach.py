"""``grpo-tui attach``: the dashboard of a run whose supervisor is another process.

A real supervisor runs the stand-in stack in its own process (``attached_supervisor.py``);
the dashboard follows its run directory and acts over its control socket (Pilot): restart
inference, stop, start and kill the trainer, a refused and an accepted live edit, a mode
switch; ``q`` leaves the run running. Once the supervisor has ended, attaching again is
read-only and says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_tui_live import SIZE, select, wait_for
from textual.widgets import OptionList, Static

from grpo_trainer.control import SupervisorLink
from grpo_tui.app import GrpoTuiApp
from grpo_tui.attach import AttachedControl, supervisor_status
from grpo_tui.launch import attach_app
from grpo_tui.screens.live_edit import LiveEditScreen
from grpo_tui.screens.mode_switch import ModeSwitchScreen
from grpo_tui.screens.run_viewer import RunViewerScreen
from grpo_tui.supervisor.events import State

SUPERVISOR = Path(__file__).with_name("attached_supervisor.py")


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The supervisor process and its run directory, once both processes are ready."""
    run_dir = tmp_path / "run"
    with (tmp_path / "supervisor.log").open("wb") as out:
        supervisor = subprocess.Popen(
            [sys.executable, str(SUPERVISOR), str(run_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        link = SupervisorLink(str(run_dir / "control.sock"), process="test")
        try:
            deadline = time.monotonic() + 30
            while link.request("status", timeout=30)["processes"] != {
                "inference": "ready",
                "trainer": "ready",
            }:
                assert supervisor.poll() is None, (tmp_path / "supervisor.log").read_text()
                assert time.monotonic() < deadline, "the stack never became ready"
                time.sleep(0.05)
        finally:
            link.close()
        yield supervisor, run_dir
    finally:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            try:
                supervisor.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(supervisor.pid, signal.SIGKILL)


@contextlib.contextmanager
def attached(run_dir: Path, tmp_path: Path) -> Iterator[GrpoTuiApp]:
    """The app ``grpo-tui attach`` opens; its control-socket link closed afterwards."""
    app = attach_app(run_dir, keymap_path=tmp_path / "no-keymap.toml")
    try:
        yield app
    finally:
        if isinstance(app.control, AttachedControl):
            app.control.close()


def pid_of(app: GrpoTuiApp, name: str) -> int | None:
    row = app.state.processes.get(name)
    return row.pid if row else None


def state_is(app: GrpoTuiApp, name: str, state: State) -> Callable[[], bool]:
    return lambda: name in app.state.processes and app.state.processes[name].state == state


async def test_attached_dashboard_acts_then_reads_only_once_the_run_ended(
    running: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    supervisor, run_dir = running
    with attached(run_dir, tmp_path) as app:
        assert app.control is not None and not app.read_only
        await act(app, run_dir)
    assert supervisor.poll() is None
    assert supervisor_status(run_dir) == {"inference": "ready", "trainer": "ready"}

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0
    with attached(run_dir, tmp_path) as ended:
        assert ended.read_only and "read-only: no control socket" in ended.notice
        async with ended.run_test(size=SIZE) as pilot:
            assert isinstance(ended.screen, RunViewerScreen)
            summary = str(ended.screen.query_one("#viewer-summary", Static).render())
            assert "the run has ended" in summary
            assert not ended.check_action("stop_process", ())
            await pilot.press("e")
            assert not isinstance(ended.screen, LiveEditScreen)


async def act(app: GrpoTuiApp, run_dir: Path) -> None:
    """Every action of the dashboard, on the attached supervisor; then detach with q."""
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, "trainer ready", state_is(app, "trainer", State.READY))
        old = pid_of(app, "inference")
        await pilot.press("i")  # restart inference, through the control socket
        await wait_for(
            pilot,
            "inference restarted",
            lambda: (
                pid_of(app, "inference") not in (None, old)
                and state_is(app, "inference", State.READY)()
            ),
        )
        await select(pilot, app, "trainer")
        await pilot.press("x")
        await wait_for(pilot, "trainer stopped", state_is(app, "trainer", State.STOPPED))
        assert supervisor_status(run_dir)["trainer"] == "stopped"
        await pilot.press("s")
        await wait_for(pilot, "trainer ready again", state_is(app, "trainer", State.READY))
        await pilot.press("K")
        await wait_for(pilot, "trainer killed", state_is(app, "trainer", State.STOPPED))
        await pilot.press("s")
        await wait_for(pilot, "trainer ready once more", state_is(app, "trainer", State.READY))

        await pilot.press("e")
        assert isinstance(app.screen, LiveEditScreen)
        await pilot.press(*"lr=-1", "enter")
        refused = str(app.screen.query_one("#edit-result", Static).render())
        assert "refused: lr: Input should be greater than 0" in refused
        app.screen.query_one("#edit-input").value = ""
        await pilot.press(*"lr=3e-5", "enter")
        assert not isinstance(app.screen, LiveEditScreen)
        edits = json.loads((run_dir / "live_edits.json").read_text())
        assert edits["values"] == {"lr": 3e-05}

        trainer = pid_of(app, "trainer")
        await pilot.press("m")
        modal = app.screen
        assert isinstance(modal, ModeSwitchScreen)
        options = modal.query_one(OptionList)
        options.highlighted = [o.id for o in options.options].index("lora_only")
        await pilot.pause()
        await pilot.click("#mode-confirm")
        await wait_for(pilot, "switch done", lambda: modal.result == "lora_only")
        assert app.state.mode == "lora_only"
        await wait_for(
            pilot,
            "the trainer's log in lora_only",
            lambda: "trainer mode lora_only" in (run_dir / "logs/trainer.log").read_text(),
        )
        await wait_for(pilot, "the new trainer's pid", lambda: pid_of(app, "trainer") != trainer)
        await pilot.click("#mode-cancel")

        await pilot.press("q")  # detach: the run goes on
        await wait_for(pilot, "app exit", lambda: app.return_code is not None)
