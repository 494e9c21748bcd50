"""The header's phase: the trainer device's live phase and the last step's seconds in each."""

from __future__ import annotations

from grpo_trainer.train.phases import CURRENT, PHASES, PhaseClock, per_rank
from grpo_tui.run_state import RunState
from grpo_tui.supervisor.events import MetricsRecord
from grpo_tui.widgets.run_header import status_text, step_times_text


def test_header_shows_the_phase_the_trainer_last_reported_and_the_step_times() -> None:
    state = RunState("r")
    assert status_text(state).plain == step_times_text(state).plain == ""
    sent: list[MetricsRecord] = []
    clock = PhaseClock(
        lambda step, data: sent.append(
            MetricsRecord(t=0.0, process="trainer", step=step, data=data)
        ),
        0,
    )
    for phase in ("sleeping", "training", "syncing", "generating"):
        clock.enter(phase, 1)
    clock.move(0.0, "syncing", "waking")
    step_record = clock.take()
    assert set(step_record) == {f"phase/{name}_s" for name in PHASES}
    assert [r.data[CURRENT] for r in sent] == [0.0, 1.0, 2.0, 3.0, 0.0]

    for record in sent[:3]:  # generating, sleeping, training
        state.apply(record)
    assert status_text(state).plain == "  phase training"
    state.apply(MetricsRecord(t=1.0, process="trainer", step=1, data=step_record))
    text = step_times_text(state).plain
    assert text.startswith("last step: generating ")
    assert all(f"{name} " in text for name in PHASES)
    assert "per GPU" not in text  # one rank: nothing per GPU


def test_header_shows_each_ranks_gpu_time_in_each_phase() -> None:
    state = RunState("r")
    state.apply(MetricsRecord(t=0.0, process="trainer", step=1, data={CURRENT: 2.0}))
    rank0 = {"phase/training_s": 0.5, "phase/syncing_s": 0.25}
    rank1 = {"phase/training_s": 0.25, "phase/syncing_s": 0.5}
    step = {**rank0, **per_rank([rank0, rank1])}
    assert step["phase/training_s/rank1"] == 0.25 and step["phase/syncing_s/rank0"] == 0.25
    state.apply(MetricsRecord(t=1.0, process="trainer", step=1, data=step))
    text = step_times_text(state).plain
    assert text.endswith("per GPU (ranks 0-1): training 0.50/0.25s syncing 0.25/0.50s")
    assert "per GPU" not in step_times_text(state, per_gpu=False).plain


def test_a_finished_run_says_finished_not_its_last_phase() -> None:
    """``grpo-tui view`` of a finished run read "phase generating": the phase the trainer
    reported last, before it ended."""
    from grpo_tui.supervisor.events import Notice

    state = RunState("r")
    state.apply(MetricsRecord(t=0.0, process="trainer", step=3, data={CURRENT: 0.0}))
    assert status_text(state).plain == "  phase generating"
    state.apply(Notice(t=1.0, level="info", message="run ended: trainer completed"))
    assert status_text(state).plain == "  finished: trainer completed"
    cut_short = RunState("r")  # a record without its end: a supervisor killed -9
    cut_short.apply(MetricsRecord(t=0.0, process="trainer", step=3, data={CURRENT: 0.0}))
    cut_short.finished_at = 0.0
    assert status_text(cut_short).plain.startswith("  not running (its record ends at ")
