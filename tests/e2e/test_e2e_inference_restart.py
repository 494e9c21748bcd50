"""Inference killed mid-run: the supervisor restarts it and the trainer re-attaches by itself.

A shortened quickstart copy under the real Supervisor and GRPO stack, in this process; once
the trainer has reported a few steps, the inference server is SIGKILLed (the run's own
child, by pid). Asserted, per mode:

- the trainer is never restarted (one spawn), inference twice (the kill, the restart);
- the trainer says it re-established its weight path to the new incarnation (issue 27:
  before, every sync after a restart failed until the trainer stopped on its max sync lag);
- the run still trains every step exactly once and ends with exit 0, nothing left running;
- every group trained as sampled by the weights being trained (lag 0) was sampled by
  exactly those weights (float32: the logprob difference is rounding only), so no group
  came from a restarted server's stale weights under a fresh version tag;
- no rollout group is lost.

One mode here, ``shared_vllm`` (a full-weights path; the hold on the environments is
the API's, the same in every mode). The other modes re-attach under the fault suite's
inference kills (``test_e2e_faults.py``, whose contract refuses a trainer restart but for
the trainer's own kills), and ``colocate``'s and ``lora_only``'s on the GPU
(``benchmarks/faults_gpu.py``).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import pytest
from e2e_stack import events, queue_counts, quickstart_value, spawns, tagged, trainer_steps
from e2e_stack import quickstart_copy as make_profile
from grpo_stack_run import Stack

from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan

STEPS = 9
KILL_AT = 3
LAG0_ATOL = 1e-4
"""float32 on both sides: a weight-sync error shows as ~1e-2, rounding as ~1e-6."""
GROUPS_PER_STEP = quickstart_value("trainer", "batch_size") // quickstart_value("env", "group_size")


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["shared_vllm"])
async def test_the_trainer_reattaches_to_a_restarted_server_without_restarting(
    tmp_path: Path, stacks: list[Stack], mode: str
) -> None:
    path = make_profile(
        tmp_path,
        mode=mode,
        overrides={"trainer": {"training_steps": STEPS, "checkpoint_interval": 100}},
    )
    plan = build_plan(load_profile(path))
    stack = Stack(plan, plan.mode_switch)
    stacks.append(stack)
    run_dir = plan.run_dir
    await stack.until(lambda: stack.latest_step() >= KILL_AT, 180, f"step {KILL_AT}")
    (trainer_pid,) = [pid for pid, _ in spawns(run_dir, "trainer")]
    run_id = stack.supervisor.run_id
    killed = stack.supervisor.status()["inference"].pid
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    async with asyncio.timeout(240):
        outcome = await stack.task
    assert outcome.exit_code == 0, outcome
    assert tagged(run_id) == [], "processes of the run outlived it"

    assert [pid for pid, _ in spawns(run_dir, "trainer")] == [trainer_pid]
    assert len(spawns(run_dir, "inference")) == 2
    messages = [e["message"] for e in events(run_dir, "Notice")]
    reattached = r"inference restarted \(incarnation 2\): weight path re-established"
    assert any(re.search(reattached, m) for m in messages), messages
    steps = trainer_steps(run_dir)
    assert [step for step, _ in steps] == list(range(1, STEPS + 1))
    lag0 = {step: data["alignment/diff_abs_mean_lag0"] for step, data in steps
            if "alignment/diff_abs_mean_lag0" in data}  # fmt: skip
    print(f"{mode}: lag-0 logprob difference per step {lag0}")
    assert all(value < LAG0_ATOL for value in lag0.values()), lag0
    assert any(step > KILL_AT for step in lag0), "no group sampled at the trained weights after"
    counts = queue_counts(run_dir)
    assert counts["received"] == counts["served"] + counts["queued"], counts
    assert counts["served"] == STEPS * GROUPS_PER_STEP, counts
