"""CPU check of benchmarks/restart_phases.py: a restart's phases, from the supervisor's events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from grpo_tui.supervisor.events import Event, Notice, RequestReceived, State, StateChanged
from grpo_tui.supervisor.standby import STANDBY_ADOPTED

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "restart_phases.py"


def write(run: Path, events: list[Event]) -> Path:
    run.mkdir(parents=True)
    (run / "events.jsonl").write_text("".join(json.dumps(e.to_json()) + "\n" for e in events))
    return run


def restart(at: float, stop: float, start: float, age: float) -> list[Event]:
    """One asked-for restart: stopped ``stop`` s after the request, ready ``start`` s later."""

    def change(old: State, new: State, t: float) -> StateChanged:
        return StateChanged(t=t, process="inference", old=old, new=new, pid=7)

    adopted = Notice(
        t=at + stop,
        level="info",
        message="inference: the standby, in words that may change",
        code=STANDBY_ADOPTED,
        data={"pid": 8, "waited_s": age},
    )
    return [
        RequestReceived(t=at, process="trainer", action="restart", target="inference", args={}),
        change(State.READY, State.STOPPING, at),
        change(State.STOPPING, State.STOPPED, at + stop),
        adopted,
        change(State.STARTING, State.READY, at + stop + start),
    ]


def test_each_restarts_phases_are_told_by_run_side_by_side(tmp_path: Path) -> None:
    crash = [StateChanged(t=50.0, process="inference", old=State.READY, new=State.BACKOFF)]
    fast = write(tmp_path / "a", restart(10, 0.5, 7, 20) + crash + restart(100, 3, 9, 18))
    slow = write(tmp_path / "b", restart(10, 8, 20, 0))
    result = subprocess.run([sys.executable, str(SCRIPT), f"after={fast}", f"before={slow}"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    rows = [line for line in result.stdout.splitlines() if line.startswith("| after")]
    assert rows == ["| after | 2 | 1.8 / 3.0 | 8.0 / 9.0 | 9.8 / 12.0 | 19.0 / 20.0 |"]
    assert "| before | 1 | 8.0 / 8.0 | 20.0 / 20.0 | 28.0 / 28.0 | 0.0 / 0.0 |" in result.stdout


def test_an_argument_without_a_label_is_refused() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "runs/x"], capture_output=True, text=True)
    assert result.returncode == 2 and "LABEL=RUN_DIR" in result.stderr
