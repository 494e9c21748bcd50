"""Snapshot tests (pytest-textual-snapshot, Textual pinned in pyproject): every screen at
the smallest terminal it must be usable in (100x30) and a large one (200x50).

The app is fed a recorded run (fixed event times, a fixed clock), recorded rollouts and
timeline (``tests/recorded_rollouts.py``) and a recorded sweep, so every screen draws the
same thing on every machine. Each case gets to its screen in ``run_before`` and then waits
until two frames in a row are the same (:func:`settle`): on a loaded machine a timer may
fire late, and a snapshot taken before it is not the screen a user sees.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import Input
from tui_recorded_run import NOW, recorded_state
from tui_recorded_sweep import recorded_sweep

from grpo_tui.app import GrpoTuiApp
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.screens.inspector import InspectorScreen
from grpo_tui.screens.logs import LogsScreen
from grpo_tui.screens.mode_switch import ModeSwitchScreen
from grpo_tui.screens.quit_confirm import QuitConfirmScreen
from grpo_tui.screens.timeline import TimelineScreen
from grpo_tui.sweep_app import SweepApp

SIZES = {"100x30": (100, 30), "200x50": (200, 50)}
NO_KEYMAP = Path("/nonexistent/grpo-tui/keymap.toml")
QUICKSTART = Path(__file__).resolve().parents[2] / "profiles" / "quickstart.toml"
SETTLE_S = 10.0


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Event times are shown in local time: pin it."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


class RecordedControl:
    """What a live dashboard acts on; here only its run directory is read (live edits)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir


async def settle(pilot: Pilot[object], ready: Callable[[], bool] = lambda: True) -> None:
    """Until ``ready()`` holds and two frames 50 ms apart are the same (bounded).

    Toasts go first (an alert's shows for 8 s: on a loaded machine a snapshot came before
    or after it), and no cursor blinks.
    """
    deadline = time.monotonic() + SETTLE_S
    last = None
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        pilot.app.clear_notifications()
        for field in pilot.app.screen.query(Input):
            field.cursor_blink = False
        frame = pilot.app.export_screenshot()
        if ready() and frame == last:
            return
        last = frame
    raise AssertionError("the screen never settled")


def live_app(run_dir: Path) -> GrpoTuiApp:
    """The dashboard of a running run (its actions on), over the recorded run."""
    state = recorded_state()
    state.run_dir = run_dir
    return GrpoTuiApp(
        state, control=RecordedControl(run_dir), clock=lambda: NOW, keymap_path=NO_KEYMAP
    )


def viewer_app(run_dir: Path) -> GrpoTuiApp:
    """``grpo-tui view``: the recorded run, read-only."""
    state = recorded_state()
    state.run_dir = run_dir
    return GrpoTuiApp(state, clock=lambda: NOW, keymap_path=NO_KEYMAP)


def press(*keys: str, ready: Callable[[Pilot[object]], bool] = lambda _: True) -> Callable:
    async def run(pilot: Pilot[object]) -> None:
        await pilot.pause()
        await pilot.press(*keys)
        await settle(pilot, lambda: ready(pilot))

    return run


async def inference_logs(pilot: Pilot[object]) -> None:
    """The logs screen on inference's output: its long error folded at the pane's width."""
    await pilot.pause()
    await pilot.press("l")
    await settle(pilot, lambda: isinstance(pilot.app.screen, LogsScreen))
    screen = pilot.app.screen
    assert isinstance(screen, LogsScreen)
    screen.show_stream("inference")
    await settle(pilot, lambda: screen.pane.stream == "inference")


async def mode_dialog(pilot: Pilot[object]) -> None:
    """The mode dialog of a quickstart run in shared_vllm, on lora_only (in place)."""
    plan = build_plan(load_profile(QUICKSTART), run_dir=Path("/nonexistent/run"))
    await pilot.pause()
    await pilot.app.push_screen(ModeSwitchScreen("shared_vllm", plan.mode_switch))
    await pilot.press("down")
    await settle(pilot)


async def quit_dialog(pilot: Pilot[object]) -> None:
    await pilot.pause()
    await pilot.app.push_screen(QuitConfirmScreen("step 40 / 60"))
    await settle(pilot)


def inspector_ready(pilot: Pilot[object]) -> bool:
    screen = pilot.app.screen
    return isinstance(screen, InspectorScreen) and screen.record is not None


def timeline_ready(pilot: Pilot[object]) -> bool:
    screen = pilot.app.screen
    return isinstance(screen, TimelineScreen) and screen._drawn is not None


SCREENS: dict[str, tuple[str, Callable[[Pilot[object]], Awaitable[None]]]] = {
    "dashboard": ("live", press()),
    "run_viewer": ("viewer", press()),
    "logs": ("live", inference_logs),
    "help": ("live", press("question_mark")),
    "mode_switch": ("live", mode_dialog),
    "live_edit": ("live", press("e")),
    "quit_confirm": ("live", quit_dialog),
    "inspector": ("live", press("g", "down", "right", ready=inspector_ready)),
    "timeline": ("live", press("t", "left", ready=timeline_ready)),
    "sweep": ("sweep", press()),
}
"""Every screen of ``grpo_tui/screens``: the app it is shown in and how to get there."""


def test_every_screen_has_a_snapshot() -> None:
    """Each module of ``grpo_tui/screens`` that defines a screen has its case."""
    import importlib
    import inspect

    from textual.screen import Screen

    folder = Path(__file__).resolve().parents[2] / "grpo_tui" / "screens"
    with_screens = set()
    for path in folder.glob("*.py"):
        module = importlib.import_module(f"grpo_tui.screens.{path.stem}")
        defined = [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Screen) and cls.__module__ == module.__name__
        ]
        if defined:
            with_screens.add(path.stem)
    assert with_screens == set(SCREENS)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen_snapshot(
    snap_compare, recorded_rollouts_dir: Path, tmp_path: Path, screen: str, size: str
) -> None:
    kind, get_there = SCREENS[screen]
    app: App[object]
    if kind == "sweep":
        app = SweepApp(recorded_sweep(tmp_path), runner=None, threshold=0.5)
    elif kind == "viewer":
        app = viewer_app(recorded_rollouts_dir)
    else:
        app = live_app(recorded_rollouts_dir)
    assert snap_compare(app, terminal_size=SIZES[size], run_before=get_there)
