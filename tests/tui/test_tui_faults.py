"""The dashboard's state says when the run cannot go on and why it stalled (issue 27):
``NeedLost`` / ``NeedRegained`` and ``Stalled`` events become event lines and alerts, and
read back the same from a finished run's ``events.jsonl``."""

from __future__ import annotations

import json

from grpo_tui.alerts import evaluate
from grpo_tui.run_files import event_from_json
from grpo_tui.run_state import SUPERVISOR_LOG, RunState
from grpo_tui.supervisor.events import MetricsRecord, NeedLost, NeedRegained, Stalled

LOST = NeedLost(
    t=10,
    process="trainer",
    need="env",
    action="wait",
    failed={"env": "exited with code 2; gave up after 5 restarts"},
    last_lines={"env": ["Traceback (most recent call last):", "No module named 'no_such_mod'"]},
)
STALL = Stalled(
    t=20, process="trainer", seconds=31.0, step=12, causes=("env failed for good: exit 2",)
)


def test_a_lost_need_is_an_alert_naming_the_failed_process_until_regained() -> None:
    state = RunState("r")
    state.apply(LOST)
    (alert,) = evaluate(state, now=11)
    assert alert.message == "trainer cannot go on, waiting on env (env failed)"
    assert alert.process == "env"
    lines = state.logs[SUPERVISOR_LOG].lines
    assert any("trainer cannot go on without env" in line for line in lines)
    assert lines[-1] == "    env | No module named 'no_such_mod'"
    state.apply(NeedRegained(t=12, process="trainer", need="env"))
    assert evaluate(state, now=13) == []


def test_a_stall_is_an_alert_with_its_cause_until_the_next_step() -> None:
    state = RunState("r")
    state.apply(STALL)
    (alert,) = evaluate(state, now=21)
    assert alert.message == "trainer stalled 31 s: env failed for good: exit 2"
    state.apply(MetricsRecord(t=22, process="trainer", step=12, data={"phase/current": 0.0}))
    assert len(evaluate(state, now=23)) == 1  # the same step: still stalled
    state.apply(MetricsRecord(t=24, process="trainer", step=13, data={"loss": 0.1}))
    assert evaluate(state, now=25) == []


def test_the_viewer_reads_the_new_events_back() -> None:
    for event in (LOST, STALL, NeedRegained(t=1, process="trainer", need="env")):
        record = json.loads(json.dumps(event.to_json(), default=str))
        assert event_from_json(record) == event
