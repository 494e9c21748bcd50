"""The UI's plain state and alerts (no textual): events in, rows / series / alerts out."""

from __future__ import annotations

import pytest
from tui_recorded_run import NOW, T0, recorded_state

from grpo_tui.alerts import evaluate
from grpo_tui.run_state import SUPERVISOR_LOG, LogBuffer, RunState
from grpo_tui.supervisor.events import (
    LogBatch,
    MetricsRecord,
    Notice,
    ProbeResult,
    Restarting,
    State,
    StateChanged,
)


def test_log_buffer_is_bounded_and_reports_only_new_lines() -> None:
    buffer = LogBuffer(max_lines=5)
    buffer.extend([f"a{i}" for i in range(3)])
    lines, seen = buffer.since(0)
    assert lines == ["a0", "a1", "a2"] and seen == 3
    buffer.extend([f"b{i}" for i in range(10)])
    lines, seen = buffer.since(seen)
    assert lines == [f"b{i}" for i in range(5, 10)]  # only what the buffer still holds
    assert seen == 13 and len(buffer.lines) == 5
    assert buffer.since(seen) == ([], 13)


def test_state_follows_lifecycle_restarts_and_dropped_lines() -> None:
    state = RunState("r")
    state.apply(StateChanged(t=1, process="api", old=State.PENDING, new=State.STARTING, pid=7))
    state.apply(StateChanged(t=2, process="api", old=State.STARTING, new=State.READY, pid=7))
    row = state.processes["api"]
    assert (row.state, row.pid, row.started_at) == (State.READY, 7, 1)
    state.apply(Restarting(t=3, process="api", attempt=1, delay=1.0, reason="exit 1"))
    assert row.restarts == 1
    state.apply(LogBatch(t=4, process="api", lines=("x",), dropped=1200))
    assert state.dropped_lines == 1200
    assert any("1200 log lines dropped" in line for line in state.logs[SUPERVISOR_LOG].lines)
    state.apply(ProbeResult(t=5, process="api", probe="readiness", ok=False, message="refused"))
    assert row.health is None  # a readiness failure while starting is not a health problem
    state.apply(ProbeResult(t=6, process="api", probe="liveness", ok=False, message="timeout"))
    assert row.health == "failing"


def test_metrics_skip_non_numbers_and_give_step_total_and_eta() -> None:
    state = RunState("r")
    for step in range(1, 11):
        data = {"loss": 1.0 / step, "training_steps": 20, "note": "x", "bad": float("nan")}
        state.apply(MetricsRecord(t=100.0 + step, process="trainer", step=step, data=data))
    state.apply(MetricsRecord(t=200.0, process="env", step=99, data={"env/reward_mean": 0.5}))
    assert state.metrics.names() == ["env/reward_mean", "loss", "training_steps"]
    assert state.step() == 10  # the trainer's step, not the environment's
    assert state.total_steps() == 20
    assert state.eta_seconds() == 10.0  # 10 steps left at 1 step/s


def test_the_eta_assumes_the_pace_of_the_recent_steps() -> None:
    """The first steps drain what was queued while the trainer loaded, fast; the ETA reads
    the steady pace after them (a mean over all of them read "ETA 0:14" with 35 s left)."""
    state = RunState("r")
    t = 0.0
    for step in range(1, 41):
        t += 0.2 if step <= 20 else 2.0  # 20 quick steps, then 2 s a step
        state.apply(MetricsRecord(t=t, process="trainer", step=step, data={"loss": 1.0}))
    state.apply(MetricsRecord(t=t, process="trainer", step=40, data={"training_steps": 60}))
    assert state.eta_seconds() == pytest.approx(40.0)  # 20 steps left at 2 s


def test_the_weights_each_inference_process_serves() -> None:
    """``v<step>`` of the incarnation the trainer pushed to; ``pending`` once inference was
    restarted and the trainer has not pushed to the new one yet."""
    state = RunState("r")
    for name, role in (("api", "api"), ("inference", "inference"), ("trainer", "trainer")):
        state.process(name).role = role
    ready = StateChanged(
        t=1, process="inference", old=State.STARTING, new=State.READY, pid=9, incarnation=1
    )
    state.apply(ready)
    assert state.served_weights() == {}  # nothing reported yet
    served = {"api/served_version": 12.0, "api/served_incarnation": 1.0}
    state.apply(MetricsRecord(t=2, process="supervisor", step=None, data=served))
    assert state.served_weights() == {"inference": "v12"}
    state.apply(
        StateChanged(t=3, process="inference", old=State.READY, new=State.BACKOFF, exit_code=9)
    )
    assert state.served_weights() == {}  # not serving
    state.apply(
        StateChanged(
            t=4, process="inference", old=State.STARTING, new=State.READY, pid=10, incarnation=2
        )
    )
    assert state.served_weights() == {"inference": "pending"}
    served = {"api/served_version": 13.0, "api/served_incarnation": 2.0}
    state.apply(MetricsRecord(t=5, process="supervisor", step=None, data=served))
    assert state.served_weights() == {"inference": "v13"}


def test_recorded_run_raises_the_expected_alerts() -> None:
    alerts = {alert.key: alert for alert in evaluate(recorded_state(), NOW)}
    assert set(alerts) == {"clipped_fraction", "crash:env"}
    assert alerts["clipped_fraction"].chart == "clipped_fraction"
    assert alerts["crash:env"].process == "env"
    later = {alert.key for alert in evaluate(recorded_state(), NOW + 3600)}
    assert later == {"clipped_fraction"}  # the crash loop aged out


def test_every_threshold_alerts() -> None:
    state = RunState("r")
    data = {
        "mean_ratio": 1.3,
        "clipped_fraction": 0.1,
        "alignment/diff_abs_mean": 0.2,
        "alignment/diff_abs_mean_lag0": 0.2,  # a sync error: the lag-0 figure is off too
    }
    state.apply(MetricsRecord(t=T0, process="trainer", step=1, data=data))
    failed = {"loss": 0.1, "sync/failed_attempts": 4.0}  # every attempt of step 2's sync
    state.apply(MetricsRecord(t=T0, process="trainer", step=2, data=failed))
    keys = {alert.key for alert in evaluate(state, T0 + 1)}
    assert keys == {"mean_ratio", "alignment", "sync"}
    state.apply(MetricsRecord(t=T0, process="trainer", step=3, data={"mean_ratio": 0.9}))
    assert "mean_ratio" not in {alert.key for alert in evaluate(state, T0 + 1)}


def test_drift_and_sync_errors_are_told_apart_by_the_lag0_figures() -> None:
    """The quickstart's early steps: the all-token difference crosses 0.1 from the batch
    queued one step ahead while the lag-0 difference is float32 rounding. No alert; past
    the mismatch_kl line the alert says drift, not a sync error."""
    state = RunState("r")
    drift = {
        "alignment/diff_abs_mean": 0.12,
        "alignment/diff_abs_mean_lag0": 1e-7,
        "mismatch_kl": 0.02,
        "mismatch_kl/lag0": 0.0,
        "off_policy_lag": 0.8,
    }
    state.apply(MetricsRecord(t=T0, process="trainer", step=5, data=drift))
    assert evaluate(state, T0) == []
    state.apply(MetricsRecord(t=T0, process="trainer", step=6, data={"mismatch_kl": 0.09}))
    (alert,) = evaluate(state, T0)
    assert alert.key == "mismatch_kl" and alert.chart == "mismatch_kl"
    assert "off-policy drift" in alert.message and "sync error" not in alert.message
    for step in range(7, 20):  # no lag-0 sequences for a while: the cause cannot be told
        state.apply(MetricsRecord(t=T0, process="trainer", step=step, data={"loss": 0.1}))
    (alert,) = evaluate(state, T0)
    assert "no lag-0 sequences lately" in alert.message
    sync = {"alignment/diff_abs_mean_lag0": 0.4, "mismatch_kl": 0.3, "mismatch_kl/lag0": 0.3}
    state.apply(MetricsRecord(t=T0, process="trainer", step=20, data=sync))
    (alert,) = evaluate(state, T0)  # one alert for one cause
    assert alert.key == "alignment" and "weight-sync error" in alert.message


def test_staleness_alerts_on_negative_lags_and_far_stale_samples() -> None:
    state = RunState("r")
    state.apply(MetricsRecord(t=T0, process="trainer", step=3, data={"staleness/max": 2.0}))
    assert evaluate(state, T0) == []
    state.apply(MetricsRecord(t=T0, process="trainer", step=4, data={"staleness/max": 9.0}))
    (alert,) = evaluate(state, T0)
    assert alert.chart == "staleness" and "9 steps stale" in alert.message
    data = {"staleness/negative": 0.25, "staleness/max": 1.0}
    state.apply(MetricsRecord(t=T0, process="trainer", step=5, data=data))
    (alert,) = evaluate(state, T0)
    assert "abandoned policy after a resume" in alert.message
    state.apply(MetricsRecord(t=T0, process="trainer", step=6, data={"staleness/max": 1.0}))
    assert evaluate(state, T0) == []  # the step after has none (only sent when present)


def test_the_sync_alert_keys_on_the_trainers_sync_results_not_on_a_word() -> None:
    """Issue 35: any warning with the word "sync" raised "weight sync is failing" for 120 s,
    the config warning of ``sync/vllm_shared.py`` (a slower sync, not a failing one) too.
    The alert now reads the trainer's step records: a step whose sync failed every
    attempt (``sync/failed_attempts`` and no ``sync_time``) until one succeeds again."""
    state = RunState("r")
    for level, message in [
        ("warning", "trainer: weight_transfer_delta needs vLLM's own layout (tensor parallel 1 "
         "and a working direct copy); every sync sends every weight instead"),
        ("error", "trainer: weight sync at step 3 failed (attempt 1): HTTP 500"),
    ]:  # fmt: skip
        state.apply(Notice(t=T0, level=level, message=message))
    assert "sync" not in {alert.key for alert in evaluate(state, T0 + 1)}, "words are not results"

    def step(n: int, t: float, **data: float) -> None:
        state.apply(MetricsRecord(t=t, process="trainer", step=n, data={"loss": 0.1, **data}))

    step(3, T0 + 2, sync_time=0.4, **{"sync/failed_attempts": 2.0})  # retried, then synced
    assert "sync" not in {alert.key for alert in evaluate(state, T0 + 3)}
    step(4, T0 + 4, **{"sync/failed_attempts": 4.0})  # every attempt failed
    (alert,) = [a for a in evaluate(state, T0 + 5) if a.key == "sync"]
    assert alert.message == "weight sync is failing (step 4: 4 failed attempts)"
    assert alert.chart == "sync_time"
    step(5, T0 + 6, sync_time=0.3)
    assert "sync" not in {alert.key for alert in evaluate(state, T0 + 7)}, "synced again"
    step(6, T0 + 8, **{"sync/failed_attempts": 4.0})
    assert "sync" in {alert.key for alert in evaluate(state, T0 + 9)}
    assert "sync" not in {alert.key for alert in evaluate(state, T0 + 8 + 121)}, "aged out"
