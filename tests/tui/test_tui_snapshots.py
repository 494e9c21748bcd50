"""Snapshot tests (pytest-textual-snapshot, Textual pinned in pyproject) on recorded data.

The app is fed a recorded run (fixed event times, a fixed clock) and recorded rollouts and
timeline (``tests/recorded_rollouts.py``), so every screen draws the same thing on every
machine: dashboard, logs, mode switch, help, rollout inspector and timeline, at 160x48 and
at the smallest (100x30) and a large (200x50) terminal.
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


# Every screen at 100x30 (the smallest terminal it must be usable in) and 200x50.
SMALL, LARGE = (100, 30), (200, 50)


@pytest.fixture
def rollouts_dir(recorded_rollouts_dir: Path) -> Path:
    return recorded_rollouts_dir


def recorded_app_with_records(run_dir: Path) -> GrpoTuiApp:
    app = recorded_app()
    app.state.run_dir = run_dir
    return app


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["100x30", "200x50"])
def test_dashboard_sizes_snapshot(snap_compare, size: tuple[int, int]) -> None:
    async def show_dashboard(pilot: Pilot[int]) -> None:
        await pilot.app.push_screen(DashboardScreen())
        await pilot.pause()

    assert snap_compare(recorded_app(), terminal_size=size, run_before=show_dashboard)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["100x30", "200x50"])
def test_inspector_snapshot(snap_compare, rollouts_dir: Path, size: tuple[int, int]) -> None:
    app = recorded_app_with_records(rollouts_dir)
    assert snap_compare(app, terminal_size=size, press=["g", "down", "right", "_"])


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["100x30", "200x50"])
def test_timeline_snapshot(snap_compare, rollouts_dir: Path, size: tuple[int, int]) -> None:
    app = recorded_app_with_records(rollouts_dir)
    assert snap_compare(app, terminal_size=size, press=["t", "left", "_"])


def test_logs_small_snapshot(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=SMALL, press=["l", "_"])


def test_help_small_snapshot(snap_compare) -> None:
    assert snap_compare(recorded_app(), terminal_size=SMALL, press=["question_mark", "_"])
