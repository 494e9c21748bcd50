"""The rollout inspector (``g``) and the step timeline (``t``) live over a real trainer
writing its records; the inspector read-only over a run directory (``grpo-tui view``; the
timeline's own tests are in ``test_tui_timeline.py``)."""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recorded_rollouts import STEPS, write_recorded_rollouts
from textual.pilot import Pilot
from textual.widgets import Input, Static
from tui_recorded_run import NOW, recorded_state
from tui_text import plain

from grpo_trainer.models import build_tiny_model
from grpo_tui.app import GrpoTuiApp
from grpo_tui.run_state import RunState
from grpo_tui.screens.inspector import InspectorScreen
from grpo_tui.screens.timeline import TimelineScreen
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.spec import LogLineProbe, ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor
from grpo_tui.widgets.group_detail import GroupDetail
from grpo_tui.widgets.group_list import GroupList

SIZE = (160, 48)
NO_KEYMAP = Path("/nonexistent/grpo-tui/keymap.toml")


async def wait_for(
    pilot: Pilot[Any], what: str, predicate: Callable[[], bool], deadline: float
) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await pilot.pause(0.1)


def groups_for(step: int, count: int = 2, size: int = 2) -> list[dict[str, Any]]:
    """Groups a trainer can train on (token ids of the tiny model's vocabulary)."""
    rng = random.Random(step)
    out = []
    for index in range(count):
        prompt = [rng.randrange(5, 40) for _ in range(4)]
        tokens = [prompt + [rng.randrange(5, 40) for _ in range(5)] for _ in range(size)]
        out.append(
            {
                "tokens": tokens,
                "masks": [[-100] * 4 + seq[4:] for seq in tokens],
                "scores": [float(i == index % size) for i in range(size)],
                "inference_logprobs": [[1.0] * 4 + [-2.0] * 5 for _ in tokens],
                "policy_version": step - 1,
                "env_id": 0,
                "env_name": "toy",
            }
        )
    return out


def append_groups(path: Path, groups: list[dict[str, Any]]) -> None:
    with path.open("a") as handle:
        for group in groups:
            handle.write(json.dumps(group) + "\n")


def detail_text(app: GrpoTuiApp) -> str:
    detail = app.screen.query_one(GroupDetail)
    return "\n".join(plain(static) for static in detail.query(Static))


async def test_inspector_and_timeline_follow_a_live_trainer(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", seed=0)
    batches = tmp_path / "batches.jsonl"
    append_groups(batches, groups_for(1))
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "grpo_trainer.train", "--model-name", str(model),
        "--save-path", str(run_dir / "checkpoints"), "--batches-file", str(batches),
        "--sync-every", "0", "--batch-size", "4", "--seq-len", "32",
        "--training-steps", "2", "--checkpoint-interval", "0", "--api-timeout", "120",
    ]  # fmt: skip
    trainer = ProcessSpec(
        name="trainer",
        role="trainer",
        command=command,
        env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        readiness=LogLineProbe(pattern="grpo-trainer ready", period=0.1),
    )
    supervisor = Supervisor([trainer], run_dir)
    app = GrpoTuiApp(
        RunState("live", mode="none", run_dir=run_dir),
        stack=GrpoStack(supervisor),
        keymap_path=NO_KEYMAP,
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, InspectorScreen)
        listing = screen.query_one(GroupList)
        await wait_for(pilot, "step 1's groups", lambda: len(listing.rows) == 2, 180)
        await wait_for(pilot, "the newest group open", lambda: screen.record is not None, 10)
        assert screen.record.step == 1 and screen.record.kind == "trained"
        assert "step 1 · trained · toy" in detail_text(app)
        append_groups(batches, groups_for(2))  # the trainer takes step 2 as it appears
        await wait_for(pilot, "step 2's groups", lambda: len(listing.rows) == 4, 120)
        await wait_for(pilot, "the cursor on the newest", lambda: screen.record.step == 2, 10)
        assert screen.record.lag == 0 and screen.record.version == 1
        completion = screen.record.completions[0]
        assert "trainer_logprobs" in completion.values and "entropy" in completion.values
        await pilot.press("right")
        assert screen.selected == 1 and "completion #1" in detail_text(app)
        await pilot.press("c")
        assert screen.measure == "entropy" and "entropy: " in detail_text(app)
        await pilot.press("down")  # an older group: new ones no longer move the cursor
        assert screen.record.step == 2 and listing.cursor == 1

        await pilot.press("t")  # the timeline of the same two steps, from the trainer's lane
        timeline = app.screen
        assert isinstance(timeline, TimelineScreen)
        await wait_for(
            pilot, "two steps on the timeline", lambda: timeline_steps(timeline) == [1, 2], 20
        )
        summary = plain(timeline.query_one("#timeline-summary", Static))
        assert "steps 1-2" in summary and "step 2" in summary
        breakdown = plain(timeline.query_one("#timeline-breakdown", Static))
        assert "trainer" in breakdown and "forward+backward" in breakdown
        await pilot.press("left")
        assert timeline.current_step == 1
        await pilot.press("d")
        assert not isinstance(app.screen, InspectorScreen | TimelineScreen)
        await app.supervisor.shutdown("test done")  # type: ignore[union-attr]


def timeline_steps(screen: TimelineScreen) -> list[int]:
    return screen.timeline.steps() if screen.timeline is not None else []


def view_app(run_dir: Path) -> GrpoTuiApp:
    state = recorded_state()
    state.run_dir = run_dir
    return GrpoTuiApp(state, clock=lambda: NOW, keymap_path=NO_KEYMAP)


async def test_inspector_filters_and_browses_a_finished_run(tmp_path: Path) -> None:
    write_recorded_rollouts(tmp_path)
    app = view_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, InspectorScreen)
        listing = screen.query_one(GroupList)
        assert len(listing.rows) == STEPS * 5
        assert screen.record is not None and screen.record.step == STEPS
        await pilot.press("v")  # trained only
        assert screen.filter.kind == "trained" and len(listing.rows) == STEPS * 4
        await pilot.press("v")  # dropped only
        assert len(listing.rows) == STEPS and screen.record.kind == "dropped"
        assert "needs the trainer's logprobs" in detail_text(app)  # coloured by logprob
        await pilot.press("slash")
        box = screen.query_one(Input)
        assert box.display and box.has_focus and box.value == "kind=dropped"
        box.value = "env=gsm8k step=10..12 lag>=1"
        await pilot.press("enter")
        assert not box.display and listing.has_focus
        steps = sorted(
            {(screen.index.rows["step"][r], screen.index.env_name(r)) for r in listing.rows}
        )
        assert steps == [(10, "gsm8k"), (11, "gsm8k"), (12, "gsm8k")]
        await pilot.press("slash")
        box.value = "lag>>2"
        await pilot.press("enter")
        summary = plain(screen.query_one("#inspector-summary", Static))
        assert "lag>>2" in summary and box.display  # refused: the filter stays open
        await pilot.press("escape")
        assert not box.display
        await pilot.press("end")
        assert screen.record.step == 10
        await pilot.press("escape")  # back to the dashboard
        assert not isinstance(app.screen, InspectorScreen)


async def test_inspector_says_when_nothing_is_recorded(tmp_path: Path) -> None:
    app = view_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("g")
        assert detail_text(app).strip() == "nothing recorded"


async def test_inspector_says_when_no_group_matches_the_filter(tmp_path: Path) -> None:
    write_recorded_rollouts(tmp_path)
    app = view_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, InspectorScreen)
        await pilot.press("slash")
        screen.query_one(Input).value = f"step={STEPS + 1}"
        await pilot.press("enter")
        assert len(screen.query_one(GroupList).rows) == 0 and screen.record is None
        assert detail_text(app).strip() == "no group matches the filter"
