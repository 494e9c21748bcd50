"""Snapshot tests (pytest-textual-snapshot, Textual pinned in pyproject) on recorded data.

The app is fed a recorded run (fixed event times, a fixed clock), so every screen draws the
same thing on every machine: dashboard, logs, mode switch and help.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.pilot import Pilot
from tui_recorded_run import NOW, recorded_state

from grpo_tui.app import GrpoTuiApp
from grpo_tui.screens.dashboard import DashboardScreen
from grpo_tui.screens.mode_switch import ModeSwitchScreen

SIZE = (160, 48)


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Event times are shown in local time: pin it."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


NO_KEYMAP = Path("/nonexistent/grpo-tui/keymap.toml")


def recorded_app() -> GrpoTuiApp:
    return GrpoTuiApp(recorded_state(), clock=lambda: NOW, keymap_path=NO_KEYMAP)


def test_dashboard_snapshot(snap_compare) -> None:
    async def show_dashboard(pilot: Pilot[int]) -> None:
        await pilot.app.push_screen(DashboardScreen())
        await pilot.pause()

    assert snap_compare(recorded_app(), terminal_size=SIZE, run_before=show_dashboard)


def test_viewer_logs_snapshot(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=SIZE, press=["l", "_"])


def test_mode_switch_snapshot(snap_compare) -> None:
    async def open_modal(pilot: Pilot[int]) -> None:
        await pilot.app.push_screen(ModeSwitchScreen("none"))
        await pilot.pause()

    assert snap_compare(recorded_app(), terminal_size=SIZE, run_before=open_modal)


def test_help_snapshot(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=SIZE, press=["question_mark", "_"])
