"""The headless quickstart, shortened, in each of the five weight-sync modes.

``grpo-tui run`` on a copy of ``profiles/quickstart.toml`` (free ports, a temporary output
directory, fewer steps): exit 0, a clear reward rise in the run's ``metrics.jsonl``, a
complete run directory, and no process carrying the run's ``GRPO_TUI_RUN_ID`` afterwards.
The restart mode (``lora_restart``) restarts the inference server at every sync, so the
product syncs it every ``RESTART_SYNC_EVERY`` steps with ``max_sync_lag``
``RESTART_SYNC_EVERY - 1`` (``grpo_tui.plan.roles``): no step trains on weights more than
``RESTART_SYNC_EVERY - 1`` steps older than its own, and the test checks exactly that.
``none`` reloads the weights into the running server, so it syncs every step: lag 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from e2e_stack import HeadlessCli, mean, quickstart_run_to_end, trainer_steps

from grpo_trainer.records.rollout_reader import RolloutIndex
from grpo_trainer.records.rollouts import KINDS
from grpo_trainer.records.timeline_reader import Timeline
from grpo_trainer.serve.capabilities import restarts_inference
from grpo_tui.plan.roles import RESTART_SYNC_EVERY

STEPS = {"shared_vllm": 30, "lora_only": 30, "none": 30, "lora_restart": 30, "colocate": 30}
"""Trainer steps per mode. Measured with the quickstart's 10 warm-up steps (5-step means;
this test and the full quickstart, one run each): from 0.05-0.08 at step 5 to 0.20-0.37
(shared_vllm), 0.32-0.34 (lora_only), 0.18-0.28 (none) and 0.15-0.22 (lora_restart) at
step 30; the restart modes serve weights up to RESTART_SYNC_EVERY - 1 steps old, which
slows their rise."""
WINDOW = 5
"""Steps averaged at each end of the reward curve."""
MARGIN = 0.03
"""Least rise of the mean reward, last WINDOW steps over the first WINDOW. A 5-step mean of
128 samples a step moves by about 0.01 between runs; the least rise measured at STEPS
(+0.095, lora_restart) is three times this margin."""

PROCESSES = ("model", "api", "inference", "trainer", "env")
GROUPS_PER_STEP = 16
"""The quickstart's 128 sequences a step in groups of 8."""


def overrides(mode: str) -> dict[str, dict[str, object]]:
    return {"trainer": {"training_steps": STEPS[mode], "checkpoint_interval": 10}}


@pytest.mark.e2e
@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    "mode",
    # CI: one full mode and one LoRA mode; the others (each also runs in test_e2e_faults
    # under faults) in the slow tier
    ["shared_vllm", "lora_only"]
    + [pytest.param(m, marks=pytest.mark.slow) for m in ("none", "lora_restart", "colocate")],
)
def test_quickstart_mode_learns_and_leaves_nothing(
    mode: str, tmp_path: Path, cli: list[HeadlessCli]
) -> None:
    run_dir = quickstart_run_to_end(
        tmp_path, cli, mode=mode, overrides=overrides(mode), timeout=360
    )

    steps = trainer_steps(run_dir)
    curve = [(step, data["reward/mean"]) for step, data in steps]
    if mode == "colocate":  # inference slept and woke in every step
        assert all(data["phase/sleeping_s"] > 0 < data["phase/waking_s"] for _, data in steps)
    assert [step for step, _ in curve] == list(range(1, STEPS[mode] + 1))
    if mode in ("none", "lora_restart"):  # synced every RESTART_SYNC_EVERY steps, no later
        lags = [step - int(data["policy_version"]) for step, data in steps]
        assert max(lags) == (RESTART_SYNC_EVERY - 1 if restarts_inference(mode) else 0), lags
    first = mean([reward for _, reward in curve[:WINDOW]])
    last = mean([reward for _, reward in curve[-WINDOW:]])
    print(f"{mode}: reward first {WINDOW} steps {first:.3f}, last {WINDOW} steps {last:.3f}")
    assert first < 0.2

    assert (run_dir / "profile.toml").is_file()
    assert (run_dir / "events.jsonl").stat().st_size > 0
    for name in PROCESSES:
        assert (run_dir / "logs" / f"{name}.log").is_file(), name
    saved = {p.name for p in (run_dir / "checkpoints").iterdir()}
    assert f"step_{STEPS[mode]}" in saved
    if mode.startswith("lora"):
        assert f"adapter_step_{STEPS[mode]}" in saved

    assert last > first + MARGIN, f"no clear rise in {mode}: {first:.3f} -> {last:.3f}"
    check_records(run_dir, mode, steps)


def check_records(run_dir: Path, mode: str, steps: list[tuple[int, dict[str, float]]]) -> None:
    """The rollout inspector's and the timeline's records filled in: every trained group of
    every step with the trainer's numbers, the groups the environment dropped, a timeline
    line per step on the trainer's lane, and the mismatch and staleness metrics."""
    index = RolloutIndex(run_dir)
    index.poll()
    trained = index.rows[index.rows["kind"] == KINDS.index("trained")]
    per_step = {int(s): int((trained["step"] == s).sum()) for s in set(trained["step"])}
    assert per_step == {step: GROUPS_PER_STEP for step in range(1, STEPS[mode] + 1)}
    assert (trained["lag"] >= 0).all() and set(index.envs) == {"toy"}
    newest = index.open(int(np.argmax(index.rows["t"] * (index.rows["kind"] == 0))))
    for completion in newest.completions:
        assert {"trainer_logprobs", "entropy", "ratio"} <= set(completion.values)
        assert completion.text and all(int(t) in newest.pieces for t in completion.tokens)
    dropped = np.flatnonzero(index.rows["kind"] == KINDS.index("dropped"))
    assert len(dropped), "the environment records the all-equal groups it drops"
    assert len(set(index.open(int(dropped[-1])).scores)) == 1
    timeline = Timeline(run_dir)
    timeline.poll()
    assert {lane.role for lane in timeline.lanes.values()} == {"trainer", "env"}
    assert timeline.steps() == list(range(1, STEPS[mode] + 1))
    phases = timeline.breakdown(*timeline.span_of(1, STEPS[mode]))["trainer"]
    assert {"wait", "forward_backward", "optimizer"} <= set(phases)
    if mode == "colocate":
        assert {"sleep", "wake"} <= set(phases)
    for _, data in steps:
        assert data["mismatch_kl"] >= 0 and "staleness/lag0" in data
