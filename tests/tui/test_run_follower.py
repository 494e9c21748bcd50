"""``RunFollower`` (``grpo-tui attach``): a running run's files, read as they grow."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_tui.run_files import RunFollower
from grpo_tui.run_state import RunState


def append(path: Path, text: str) -> None:
    with path.open("a") as file:
        file.write(text)


def test_follower_applies_only_what_was_appended(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    events, metrics, log = (
        tmp_path / "events.jsonl",
        tmp_path / "metrics.jsonl",
        tmp_path / "logs" / "trainer.log",
    )
    planned = {
        "type": "ProcessPlanned",
        "t": 1.0,
        "process": "trainer",
        "role": "trainer",
        "port": None,
        "command": ["python"],
    }
    append(events, json.dumps(planned) + "\n")
    append(log, "line 1\nline ")
    state = RunState(tmp_path.name)
    follower = RunFollower(tmp_path, state)
    assert follower.poll() == 2
    assert "trainer" in state.processes and list(state.log("trainer").lines) == ["line 1"]

    changed = {
        "type": "StateChanged",
        "t": 2.0,
        "process": "trainer",
        "old": "pending",
        "new": "ready",
        "pid": 7,
        "reason": "",
        "exit_code": None,
    }
    append(events, json.dumps(changed) + "\n")
    append(
        metrics,
        json.dumps({"t": 2.5, "process": "trainer", "step": 1, "data": {"loss": 0.5}})
        + "\n"
        + '{"t": 3',
    )
    append(log, "2\n")
    assert follower.poll() == 3
    assert state.processes["trainer"].state == "ready"
    assert state.step() == 1 and state.metrics.series("loss")
    assert list(state.log("trainer").lines) == ["line 1", "line 2"]
    assert follower.poll() == 0, "nothing new: nothing applied twice"
