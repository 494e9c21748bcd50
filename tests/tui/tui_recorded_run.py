"""A deterministic recorded run (events, metrics, logs at fixed times) for UI tests."""

from __future__ import annotations

import math

from grpo_tui.run_state import RunState
from grpo_tui.supervisor.events import (
    Event,
    LogBatch,
    MetricsRecord,
    Notice,
    ProbeResult,
    ResourceSample,
    Restarting,
    State,
    StateChanged,
)

T0 = 1_800_000_000.0
STEPS = 40
TOTAL = 60
NOW = T0 + 30 + STEPS * 2.0 + 1
PROCESSES = (
    ("model", "model", None),
    ("api", "api", 8000),
    ("inference", "inference", 9001),
    ("trainer", "trainer", None),
    ("env", "env", None),
)


def recorded_events() -> list[Event]:
    """Start-up, 40 training steps with a clipped_fraction spike at the end, an env crash loop."""
    events: list[Event] = []
    pid = 4100
    for offset, (name, _role, _port) in enumerate(PROCESSES):
        t = T0 + offset
        events.append(
            StateChanged(t=t, process=name, old=State.PENDING, new=State.STARTING, pid=pid)
        )
        pid += 1
        if name == "model":
            events.append(
                StateChanged(
                    t=t + 0.5, process=name, old=State.STARTING, new=State.COMPLETED, exit_code=0
                )
            )
            continue
        events.append(ProbeResult(t=t + 0.5, process=name, probe="readiness", ok=True))
        events.append(
            StateChanged(
                t=t + 0.5,
                process=name,
                old=State.STARTING,
                new=State.READY,
                pid=pid - 1,
                incarnation=1,
            )
        )
        events.append(
            LogBatch(t=t + 0.6, process=name, lines=tuple(f"{name} line {i}" for i in range(5)))
        )
    for attempt in range(1, 4):
        t = T0 + 10 + attempt * 3
        events.append(
            StateChanged(
                t=t, process="env", old=State.READY, new=State.BACKOFF, exit_code=1, reason="exit 1"
            )
        )
        events.append(
            Restarting(t=t, process="env", attempt=attempt, delay=2.0**attempt, reason="exit 1")
        )
    events.append(ProbeResult(t=T0 + 25, process="env", probe="readiness", ok=True))
    events.append(
        StateChanged(t=T0 + 25, process="env", old=State.BACKOFF, new=State.READY, pid=4200)
    )
    for step in range(1, STEPS + 1):
        t = T0 + 30 + step * 2.0
        clipped = 0.05 + 0.01 * step if step < STEPS else 0.42
        data = {
            "loss": 0.5 * math.exp(-step / 15) + 0.02 * math.sin(step),
            "mean_ratio": 1.0 + 0.05 * math.sin(step / 3),
            "clipped_fraction": clipped,
            "reward/mean": min(0.95, 0.05 + step * 0.022),
            "alignment/diff_abs_mean": 0.02 + 0.001 * step,
            "tokens_per_s": 900 + 10 * step,
            "off_policy_lag": float(step % 3),
            "sync_time": 0.4 + 0.01 * (step % 5),
            "training_steps": TOTAL,
            "mismatch_kl": 0.004 + 0.0004 * step,
            "mismatch_kl/env/toy": 0.003 + 0.0005 * step,
            "staleness/lag0": [1.0, 0.5, 0.25][step % 3],
            "staleness/lag1": [0.0, 0.5, 0.5][step % 3],
            "staleness/lag2": [0.0, 0.0, 0.25][step % 3],
            "phase/generating_s": 1.1,
            "phase/training_s": 0.6,
            "phase/syncing_s": 0.3,
            "sync/split/pause_s": 0.02,
            "sync/split/transfer_s": 0.3 + 0.01 * (step % 5),
            "sync/split/finish_s": 0.05,
            "sync/split/resume_s": 0.03,
        }
        if step % 3 != 2:  # steps with sequences sampled at the trained weights
            data["alignment/diff_abs_mean_lag0"] = 0.002
            data["mismatch_kl/lag0"] = 0.0001
        events.append(MetricsRecord(t=t, process="trainer", step=step, data=data))
        events.append(
            MetricsRecord(
                t=t,
                process="inference",
                step=None,
                data={"inference/tokens_per_s": 1500 + 20 * step},
            )
        )
        for index, (name, _role, _port) in enumerate(PROCESSES[1:]):
            events.append(
                ResourceSample(
                    t=t,
                    process=name,
                    cpu_percent=10.0 * (index + 1),
                    rss_bytes=(100 + 50 * index + step) * 2**20,
                )
            )
        events.append(
            LogBatch(t=t, process="trainer", lines=(f"step {step} loss {data['loss']:.4f}",))
        )
        api = {
            "api/queue_groups": float(4 + step % 5),
            "api/time_in_queue_s": 1.5 + 0.05 * step,
            "api/served_version": float(step - 1),
            "api/served_incarnation": 1.0,
        }
        events.append(MetricsRecord(t=t, process="supervisor", step=None, data=api))
    events.append(Notice(t=NOW - 1, level="info", message="checkpoint step_40 written"))
    events.append(
        LogBatch(
            t=NOW - 1,
            process="inference",
            lines=(
                "ERROR 01-15 08:01:50 [serving.py:204] POST /v1/load_lora_adapter failed for "
                "adapter policy-step40 at /runs/quickstart-20270115-080000/checkpoints/"
                "adapter_step_40: the adapter's base model Qwen/Qwen2.5-0.5B-Instruct does not "
                "match the served model tiny-llama (error: base mismatch)",
            ),
        )
    )
    return events


def recorded_state() -> RunState:
    state = RunState("quickstart-20270115-080000", mode="none", started_at=T0)
    for name, role, port in PROCESSES:
        row = state.process(name)
        row.role, row.port = role, port
    for event in recorded_events():
        state.apply(event)
    return state
