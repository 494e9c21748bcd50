"""Switching screens stays cheap and keeps what the user set: on the recorded run (pilot)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from textual.widgets import Log
from tui_recorded_run import NOW, recorded_state

from grpo_tui.app import GrpoTuiApp
from grpo_tui.run_state import SUPERVISOR_LOG, Point
from grpo_tui.screens.dashboard import DashboardScreen
from grpo_tui.screens.help import HelpScreen
from grpo_tui.screens.logs import LogsScreen
from grpo_tui.screens.mode_switch import ModeSwitchScreen
from grpo_tui.supervisor.events import MetricsRecord
from grpo_tui.widgets.key_bar import KeyBar
from grpo_tui.widgets.log_pane import LogPane
from grpo_tui.widgets.metric_chart import DASHBOARD_CHARTS, MetricChart, downsample

SIZE = (160, 48)


def recorded_app(keymap: Path = Path("/nonexistent/grpo-tui/keymap.toml")) -> GrpoTuiApp:
    return GrpoTuiApp(recorded_state(), clock=lambda: NOW, keymap_path=keymap)


def test_downsample_keeps_order_extremes_and_a_bound() -> None:
    points: list[Point] = [(float(i), i, float(i % 3)) for i in range(2000)]
    points[1234] = (1234.0, 1234, 50.0)  # one spike
    shown = downsample(points, 80)
    assert len(shown) <= 2 * 80 + 2
    assert shown[0] == points[0] and shown[-1] == points[-1]
    assert [p[1] for p in shown] == sorted(p[1] for p in shown)
    assert (1234.0, 1234, 50.0) in shown
    assert {p[2] for p in shown[1:-1]} == {0.0, 2.0, 50.0}  # the envelope, not an aliased 1.0
    short = points[:100]
    assert downsample(short, 80) == short


async def test_dashboard_draws_nothing_under_another_screen() -> None:
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        loss = dashboard.query_one("#chart-loss", MetricChart)
        before = loss.border_title
        app.state.apply(MetricsRecord(t=NOW, process="trainer", step=41, data={"loss": 9.5}))
        for _ in DASHBOARD_CHARTS:
            dashboard.redraw_next_charts()
        assert loss.border_title == before  # under the help: not redrawn
        await pilot.press("escape")
        assert app.screen is dashboard
        for _ in DASHBOARD_CHARTS:
            dashboard.redraw_next_charts()
        assert loss.border_title == "loss 9.5"


async def test_help_is_built_once() -> None:
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        first = app.screen
        await pilot.press("escape", "question_mark")
        assert app.screen is first is app.help_screen


async def test_each_log_stream_keeps_its_follow_setting() -> None:
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        logs = app.screen
        assert isinstance(logs, LogsScreen)
        logs.show_stream("trainer")
        await pilot.pause()
        pane = logs.pane
        last = app.state.logs["trainer"].lines[-1]
        assert pane.stream == "trainer" and pane.text[-1] == last
        await pilot.press("f")
        assert not pane.following
        await pilot.press("right_square_bracket")
        assert pane.stream == "env" and pane.following
        assert pane.text == [f"env line {i}" for i in range(5)]
        await pilot.press("left_square_bracket")
        assert pane.stream == "trainer" and not pane.following
        assert pane.border_subtitle == "paused"
        await pilot.press("f")
        assert pane.following and pane.text[-1] == last


async def test_key_bar_shows_the_keymap_and_clicks_press_keys(tmp_path: Path) -> None:
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('show-logs = "g"\n')
    app = recorded_app(keymap)
    async with app.run_test(size=SIZE) as pilot:
        bar = app.screen.query_one(KeyBar)
        text = bar.render().plain
        assert " g Logs " in text and " l Logs " not in text
        assert text.rstrip().endswith("^p palette")
        await pilot.click(KeyBar, offset=(text.index(" g Logs ") + 1, 0))
        assert isinstance(app.screen, LogsScreen)
        assert " f Follow/pause " in app.screen.query_one(KeyBar).render().plain


def test_quick_escape_reaches_textual_unless_the_user_set_one() -> None:
    code = (
        "from grpo_tui.terminal import prefer_quick_escape; prefer_quick_escape(); "
        "import textual.constants as c; print(c.ESCAPE_DELAY)"
    )
    env = {k: v for k, v in os.environ.items() if k != "ESCDELAY"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "0.025"
    env["ESCDELAY"] = "200"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "0.2"


async def test_mode_switch_progress_folds_long_lines_at_the_dialog_width() -> None:
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(ModeSwitchScreen("none"))
        await pilot.pause()
        pane = app.screen.query_one(LogPane)
        pane.display = True
        pane.start_from_now()
        for _ in range(200):  # laid out: on a loaded machine one pause may not be enough
            await pilot.pause(0.01)
            if pane.query_one(Log).scrollable_content_region.width:
                break
        words = [f"word{i:02d}" for i in range(40)]
        app.state.logs[SUPERVISOR_LOG].extend([" ".join(words)])
        pane.flush()
        width = pane.query_one(Log).scrollable_content_region.width
        assert 20 <= width < len(" ".join(words))
        assert len(pane.text) > 1 and all(len(line) <= width for line in pane.text)
        assert " ".join(pane.text).split() == words  # folded, nothing cut
        pane.reload()  # what a resize does: fold again, still from the dialog's start
        assert " ".join(pane.text).split() == words


def quickstart_planner(tmp_path: Path):
    """The quickstart's own ``Plan.mode_switch`` (the plan the stack's switch asks)."""
    from grpo_tui.plan.profile import load_profile
    from grpo_tui.plan.roles import build_plan

    profile = Path(__file__).resolve().parents[2] / "profiles" / "quickstart.toml"
    return build_plan(load_profile(profile), run_dir=tmp_path / "run").mode_switch


async def test_the_mode_dialog_opens_on_the_current_mode_and_says_what_a_switch_does(
    tmp_path: Path,
) -> None:
    """It opened describing ``none`` with its cursor on the current mode, and listed four
    restart steps where the switch then happened in place."""
    app = recorded_app()
    planner = quickstart_planner(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.push_screen(ModeSwitchScreen("shared_vllm", planner))
        await pilot.pause()
        modal = app.screen
        plan = modal.query_one("#mode-plan")
        confirm = modal.query_one("#mode-confirm")
        assert modal.highlighted == "shared_vllm" and modal.chosen is None
        assert "shared_vllm is the current mode" in str(plan.render()) and confirm.disabled
        await pilot.press("down")  # lora_only: in place in the quickstart
        assert modal.chosen == "lora_only" and not confirm.disabled
        text = str(plan.render())
        assert text.startswith("In place: inference keeps serving") and "1." not in text
        await pilot.press("down")  # lora_restart: inference restarts, with the plan's reason
        text = str(plan.render())
        assert text.startswith(f"By restarts ({planner('lora_restart').inference}):")
        assert "2. inference stops" in text
        assert "Switch weight-sync mode (now: " in str(modal.query_one("#mode-dialog").border_title)


def visible(pane: LogPane) -> list[str]:
    """The pane's lines on screen now."""
    log = pane.log_view
    top = round(log.scroll_y)
    return pane.text[top : top + log.scrollable_content_region.height]


async def test_the_events_pane_follows_the_newest_event_and_can_be_scrolled_back() -> None:
    """At 100x30 the events pane stayed on its first lines for good (written before its
    first layout, Log's auto_scroll never followed)."""
    app = recorded_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        pane = app.screen.query_one(LogPane)
        await pilot.pause()
        assert visible(pane)[-1].endswith("checkpoint step_40 written")
        events = app.state.logs[SUPERVISOR_LOG]
        events.extend([f"event {i}" for i in range(30)])
        pane.flush()
        await pilot.pause()
        assert visible(pane)[-1] == "event 29"
        pane.log_view.scroll_page_up(animate=False)  # as pgup / the wheel do
        await pilot.pause()
        held = visible(pane)
        assert held[-1] != "event 29" and not pane.log_view.pinned
        events.extend(["event 30"])
        pane.flush()
        await pilot.pause()
        assert visible(pane) == held  # scrolled back: the view stays
        pane.log_view.scroll_end(animate=False)
        await pilot.pause()
        events.extend(["event 31"])
        pane.flush()
        await pilot.pause()
        assert visible(pane)[-1] == "event 31"  # at the end again: following


async def test_a_long_log_line_is_folded_so_its_end_is_on_screen() -> None:
    """At 100 columns a vLLM error was cut at the pane's edge ("…/v1/load_lora_ad");
    folded at word boundaries its end is on screen, and ``w`` shows it whole, sideways."""
    app = recorded_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("l")
        logs = app.screen
        assert isinstance(logs, LogsScreen)
        logs.show_stream("inference")
        await pilot.pause()
        await pilot.pause()
        pane = logs.pane
        line = app.state.logs["inference"].lines[-1]
        width = pane.log_view.scrollable_content_region.width
        assert len(line) > width
        shown = visible(pane)
        assert shown[-1].endswith("(error: base mismatch)")
        assert all(len(part) <= width for part in shown)
        assert " ".join(part.strip() for part in pane.text[-len(shown) :]).endswith(
            "does not match the served model tiny-llama (error: base mismatch)"
        )
        await pilot.press("w")
        assert pane.text[-1] == line  # whole, the pane scrolls sideways
