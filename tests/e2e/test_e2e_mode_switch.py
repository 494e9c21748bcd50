"""One run switching weight-sync modes: ``lora_only`` -> ``shared_vllm`` -> ``colocate`` ->
``lora_only`` (LoRA to full: the adapter is merged; full to colocate; colocate to LoRA).

The real Supervisor over the real role plan of a shortened quickstart copy, in this
process; ``GrpoStack.switch_mode`` is called once the trainer has reported a few steps in
each mode. Two ways through the same switches:

- **in place** (the plan's answer: the server has every capability, the trainer is one
  process): inference and the trainer keep their pids through every switch; the trainer
  switched its weight sync at a step boundary (its own events say so, and no restart);
- **by restarts** (a stack without the plan, and a server with only its mode's
  capabilities), ``lora_only`` -> ``colocate`` -> ``lora_only`` (each switch restarts both
  processes): the trainer was spawned once per mode, each in the next mode, and each
  restart announced it resumed at the step the previous incarnation ended on; inference was
  rebuilt with the new mode's flags (LoRA slots, sleep mode).

In both:

- the trainer's step records over the whole run are exactly 1..STEPS, each once (no reset,
  no jump back, no step lost or duplicated);
- no rollout group is lost: groups the API received = groups served + still queued, and
  the groups served are exactly STEPS batches (every step acknowledged once);
- the run ends with exit code 0 and leaves no process carrying its run id.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from e2e_stack import (
    events,
    queue_counts,
    quickstart_value,
    run_id_of,
    spawns,
    tagged,
    trainer_steps,
)
from e2e_stack import quickstart_copy as make_profile
from grpo_stack_run import Stack

from grpo_trainer.train.resume import RESUMED
from grpo_trainer.train.switch import SWITCHED_IN_PLACE
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import Plan, build_plan
from grpo_tui.stack.modes import MODE_ACTIVE

STEPS = 15
START_MODE = "lora_only"
SWITCH_AT = (("shared_vllm", 4), ("colocate", 8), ("lora_only", 11))
"""(mode, the trainer step reached before switching to it), in order."""
RESTART_SWITCH_AT = (("colocate", 4), ("lora_only", 8))
"""The route by restarts: LoRA into colocate (the adapter merged) and back, each switch a
trainer and an inference restart (~10 s of imports on CPU); full to colocate is in place's."""

SYNC_EVERY = 2
LAG0_ATOL = 1e-4
GROUPS_PER_STEP = quickstart_value("trainer", "batch_size") // quickstart_value("env", "group_size")


def switching_profile(tmp_path: Path, inference: dict[str, object]) -> Plan:
    path = make_profile(
        tmp_path,
        mode=START_MODE,
        overrides={
            "inference": inference,
            "trainer": {
                "training_steps": STEPS,
                "checkpoint_interval": 100,  # only the checkpoints a switch asks for
                "sync_every": SYNC_EVERY,
                "max_sync_lag": SYNC_EVERY,
            },
        },
    )
    return build_plan(load_profile(path))


async def switches_to_the_end(
    stack: Stack, route: tuple[tuple[str, int], ...] = SWITCH_AT
) -> list[int]:
    """Each switch of ``route`` once its step is reached, then the run to its end: exit 0,
    nothing of it left running, nothing lost. Returns the last step before each switch."""
    run_dir = stack.plan.run_dir
    await stack.until(lambda: bool(spawns(run_dir, "trainer")), 120, "the trainer's spawn")
    run_id = run_id_of(spawns(run_dir, "trainer")[0][0])
    ended_at: list[int] = []
    for mode, step in route:
        await stack.until(lambda s=step: stack.latest_step() >= s, 180, f"step {step}")
        await stack.grpo.switch_mode(mode)
        ended_at.append(max(s for s, _ in trainer_steps(run_dir)))
    async with asyncio.timeout(240):
        outcome = await stack.task
    assert outcome.exit_code == 0, outcome
    assert tagged(run_id) == [], "processes of the run outlived it"
    print(f"mode switches after steps {ended_at}")
    assert_nothing_lost(run_dir)
    return ended_at


def assert_nothing_lost(run_dir: Path) -> None:
    steps = [step for step, _ in trainer_steps(run_dir)]
    print(f"steps {steps}")
    assert steps == list(range(1, STEPS + 1))
    counts = queue_counts(run_dir)
    print(f"queue {counts}")
    assert counts["received"] == counts["served"] + counts["queued"], counts
    assert counts["served"] == STEPS * GROUPS_PER_STEP, counts
    saved = {p.name for p in (run_dir / "checkpoints").iterdir()}
    assert f"step_{STEPS}" in saved


@pytest.mark.e2e
@pytest.mark.timeout(420)
async def test_switches_in_place_keep_inference_and_trainer_running(
    tmp_path: Path, stacks: list[Stack]
) -> None:
    plan = switching_profile(tmp_path, {})
    stack = Stack(plan, plan.mode_switch)
    stacks.append(stack)
    run_dir = plan.run_dir
    ended_at = await switches_to_the_end(stack)

    assert len(spawns(run_dir, "trainer")) == 1, "the trainer kept its pid through every switch"
    assert len(spawns(run_dir, "inference")) == 1, "inference kept its pid through every switch"
    notices = events(run_dir, "Notice")
    switched = [e["data"] for e in notices if e.get("code") == SWITCHED_IN_PLACE]
    assert [s["new"] for s in switched] == [mode for mode, _ in SWITCH_AT], switched
    active = [e["data"] for e in notices if e.get("code") == MODE_ACTIVE]
    assert [(a["mode"], a["in_place"]) for a in active] == [
        (mode, True) for mode, _ in SWITCH_AT
    ], active
    resumed = [e for e in notices if e.get("code") == RESUMED]
    assert resumed == [], "no trainer resumed: none restarted"
    # issue 35: through every in-place switch, every group sampled at the weights being
    # trained (lag 0) was sampled by exactly those weights (float32: rounding is ~1e-7), but
    # in the first sync period after a switch ("within a few steps of every action"): once in
    # two CI runs (2026-11-29) the step after lora_only -> shared_vllm measured 0.15 there
    lag0 = {
        step: data["alignment/diff_abs_mean_lag0"]
        for step, data in trainer_steps(run_dir)
        if "alignment/diff_abs_mean_lag0" in data
    }
    settling = {end + k for end in ended_at for k in range(1, SYNC_EVERY + 1)}
    off = {step: value for step, value in lag0.items() if value >= LAG0_ATOL}
    print(f"lag-0 off within a sync period of a switch (allowed): {off}")
    assert lag0 and set(off) <= settling, (off, ended_at)
    assert [step for step in lag0 if step not in settling], "no step outside the switches' periods"


@pytest.mark.e2e
@pytest.mark.slow  # switches by restarts also run in CI's combos walks
@pytest.mark.timeout(420)
async def test_lora_to_colocate_and_back_by_restarts_keeps_steps_and_rollouts(
    tmp_path: Path, stacks: list[Stack]
) -> None:
    """By restarts: no plan to ask, and a server with only its mode's capabilities."""
    plan = switching_profile(tmp_path, {"enable_lora": False, "enable_sleep_mode": False})
    stack = Stack(plan, None)
    stacks.append(stack)
    run_dir = plan.run_dir
    ended_at = await switches_to_the_end(stack, RESTART_SWITCH_AT)

    trainers = spawns(run_dir, "trainer")
    assert len(trainers) == len(RESTART_SWITCH_AT) + 1
    commands = [e["command"] for e in events(run_dir, "ProcessPlanned")]
    trainer_modes = [
        c[c.index("--weight-bridge-mode") + 1] for c in commands if "--weight-bridge-mode" in c
    ]
    # each mode once, in order (a crash restart would repeat one: none is expected)
    assert [m for i, m in enumerate(trainer_modes) if i == 0 or m != trainer_modes[i - 1]] == [
        START_MODE,
        *(mode for mode, _ in RESTART_SWITCH_AT),
    ]
    inference = [c for c in commands if "grpo_trainer.serve" in c]
    flags = [("--enable-lora" in c, "--enable-sleep-mode" in c) for c in inference]
    assert flags[0] == (True, False)
    assert flags[-2:] == [(False, True), (True, False)], flags
    notices = events(run_dir, "Notice")
    resumed = [int(e["data"]["step"]) for e in notices if e.get("code") == RESUMED]
    assert resumed == ended_at, (resumed, ended_at)
