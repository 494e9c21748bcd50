"""The step timeline (``t``): cells that show every phase however short, and the screen
over a finished run's records (``grpo-tui view``); live in ``test_tui_inspector.py``."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from recorded_rollouts import STEPS, write_recorded_rollouts
from textual.widgets import Static
from tui_recorded_run import NOW, recorded_state
from tui_text import plain

from grpo_trainer.records.timeline_reader import PHASE_NAMES, Lane, Timeline
from grpo_tui.app import GrpoTuiApp
from grpo_tui.screens.timeline import TimelineScreen
from grpo_tui.timeline_view import chart, cover

SIZE = (160, 48)


def test_cover_sums_each_phase_over_each_cell_like_a_brute_force() -> None:
    rng = np.random.default_rng(3)
    lane = Lane("trainer", "trainer")
    t = 100.0
    spans = []
    for _ in range(200):  # back-to-back spans of every length, some far below a cell
        phase = PHASE_NAMES[int(rng.integers(len(PHASE_NAMES)))]
        length = float(rng.choice([1e-4, 0.01, 0.3, 2.5]))
        spans.append([phase, t, t + length])
        t += length + float(rng.choice([0.0, 0.05]))
    lane.add(1, spans)
    t0, t1, width = 101.0, t - 1.0, 97
    got = cover(lane, t0, t1, width)
    edges = np.linspace(t0, t1, width + 1)
    expected = np.zeros_like(got)
    for phase, start, end in spans:
        for cell in range(width):
            overlap = min(end, edges[cell + 1]) - max(start, edges[cell])
            if overlap > 0:
                expected[PHASE_NAMES.index(phase), cell] += overlap / (edges[1] - edges[0])
    np.testing.assert_allclose(got, expected, atol=1e-9)


def test_a_thousand_steps_of_eight_lanes_draw_at_any_zoom(tmp_path: Path) -> None:
    """What the benchmark times, drawn once here: every lane in the chart, the marks fit."""
    timeline = Timeline(tmp_path)
    for lane in range(8):
        timeline.lanes[f"lane{lane}"] = Lane(f"lane{lane}", "trainer" if lane < 2 else "env")
        for step in range(1, 1001):
            t = step * 1.0
            timeline.lanes[f"lane{lane}"].add(
                step, [["wait", t, t + 0.4], ["forward_backward", t + 0.4, t + 0.9]]
            )
            timeline._steps[step] = (t, t + 0.9)
    steps = timeline.steps()
    started = time.process_time()
    lines = [line for line in chart(timeline, steps, 200, steps[-1]).renderables]
    assert len(lines) == 1 + 8 + 1
    assert time.process_time() - started < 5  # correctness here; speed in benchmarks/tui.py


@pytest.fixture
def view(tmp_path: Path) -> GrpoTuiApp:
    write_recorded_rollouts(tmp_path)
    state = recorded_state()
    state.run_dir = tmp_path
    return GrpoTuiApp(state, clock=lambda: NOW, keymap_path=Path("/nonexistent/keymap.toml"))


def texts(screen: TimelineScreen) -> tuple[str, str, str]:
    return tuple(  # type: ignore[return-value]
        plain(screen.query_one(f"#timeline-{part}", Static))
        for part in ("summary", "chart", "breakdown")
    )


async def test_timeline_steps_zooms_and_says_where_the_time_went(view: GrpoTuiApp) -> None:
    async with view.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        screen = view.screen
        assert isinstance(screen, TimelineScreen)
        summary, drawn, breakdown = texts(screen)
        assert f"steps 1-{STEPS}" in summary and f"showing {STEPS - 2}-{STEPS}" in summary
        lanes = [line.split()[0] for line in drawn.splitlines()[1:-1]]
        assert lanes == ["trainer", "trainer.rank1", "env.gsm8k", "env.toy"]
        assert f"▏{STEPS}" in drawn and "█" in drawn
        assert f"step {STEPS}: 1.98 s" in breakdown  # wait start to resume end
        assert "data wait 1.1s 56%" in breakdown and "generation" in breakdown
        await pilot.press("left", "left")
        assert screen.current_step == STEPS - 2
        assert f"step {STEPS - 2}:" in texts(screen)[2]
        await pilot.press("plus")
        assert screen.shown_steps() == list(range(STEPS - 6, STEPS - 1))
        await pilot.press("minus", "minus", "minus")
        assert screen.shown_steps() == [STEPS - 2]
        await pilot.press("a")
        assert screen.shown_steps() == list(range(1, STEPS + 1))
        await pilot.press("end")
        assert screen.current_step == STEPS and screen.shown_steps()[-1] == STEPS
        await pilot.press("escape")
        assert not isinstance(view.screen, TimelineScreen)


async def test_timeline_says_when_nothing_is_recorded(tmp_path: Path) -> None:
    state = recorded_state()
    state.run_dir = tmp_path
    app = GrpoTuiApp(state, clock=lambda: NOW, keymap_path=Path("/nonexistent/keymap.toml"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        assert "no step recorded yet" in texts(app.screen)[0]  # type: ignore[arg-type]
