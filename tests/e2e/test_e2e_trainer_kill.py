"""SIGKILL of the trainer mid-run: restarted, resumed from its checkpoint, nothing lost.

``grpo-tui run`` on a shortened quickstart copy (``shared_vllm``: syncs cost nothing, so
the run is short). Once a checkpoint past step ``KILL_AFTER`` exists, the trainer's pid
(from ``events.jsonl``) and only it gets SIGKILL. Asserted:

- the supervisor spawned a second trainer, which announced it resumed from a checkpoint at
  a step >= the one on disk at the kill, and whose step records continue from that step
  (never from 1) up to ``STEPS``; the run exits 0;
- no acknowledged rollout is lost: in ``rollouts.db``, every group the API answered
  ``received`` to was consumed by an acknowledged batch or is still queued (the killed
  trainer's leased batch stays queued until its lease expires), and the consumed groups
  are whole batches, one per acknowledged optimizer step.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from e2e_stack import (
    HeadlessCli,
    events,
    only_run_dir,
    pids,
    queue_counts,
    quickstart_value,
    run_id_of,
    spawns,
    tagged,
    trainer_steps,
    wait_until,
)
from e2e_stack import quickstart_copy as make_profile

STEPS = 16
INTERVAL = 4
KILL_AFTER = 8
MODE = "shared_vllm"
GROUPS_PER_STEP = quickstart_value("trainer", "batch_size") // quickstart_value("env", "group_size")


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete full checkpoints (``trainer_state.json`` is written last)."""
    found = []
    for path in (run_dir / "checkpoints").glob("step_*"):
        if (path / "trainer_state.json").is_file():
            found.append(int(path.name.removeprefix("step_")))
    return sorted(found)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_trainer_sigkill_resumes_from_checkpoint_and_loses_no_rollout(
    tmp_path: Path, cli: list[HeadlessCli]
) -> None:
    profile = make_profile(
        tmp_path,
        mode=MODE,
        overrides={
            "trainer": {"training_steps": STEPS, "checkpoint_interval": INTERVAL},
        },
    )
    run = HeadlessCli(profile, MODE, tmp_path / "console.log")
    cli.append(run)

    def checkpointed() -> Path | None:
        run.check_alive()
        run_dir = only_run_dir(tmp_path)
        if run_dir is None or not (run_dir / "checkpoints").is_dir():
            return None
        steps = checkpoint_steps(run_dir)
        return run_dir if steps and steps[-1] >= KILL_AFTER else None

    run_dir = wait_until(checkpointed, 180, f"a checkpoint at step >= {KILL_AFTER}")
    (first_pid,) = pids(run_dir, "trainer")
    run_id = run_id_of(first_pid)
    on_disk = checkpoint_steps(run_dir)[-1]
    os.kill(first_pid, signal.SIGKILL)

    assert run.wait(timeout=240) == 0, run.text()[-4000:]
    assert tagged(run_id) == [], "processes of the run outlived it"

    (_, _), (second_pid, respawned) = spawns(run_dir, "trainer")
    assert second_pid != first_pid
    assert any(e["process"] == "trainer" for e in events(run_dir, "Restarting"))
    resumed = [
        int(m.group(1))
        for e in events(run_dir, "Notice")
        if (m := re.search(r"resuming from \S+ at step (\d+)", e["message"]))
    ]
    assert len(resumed) == 1 and resumed[0] >= on_disk, (resumed, on_disk)

    before = [step for step, _ in trainer_steps(run_dir)]
    after = [step for step, _ in trainer_steps(run_dir, since=respawned)]
    before = before[: len(before) - len(after)]
    assert before == list(range(1, len(before) + 1))
    assert after == list(range(resumed[0] + 1, STEPS + 1)), after
    # The last record of the killed trainer may not have reached the supervisor.
    assert resumed[0] <= len(before) + 1

    counts = queue_counts(run_dir)
    print(f"trainer killed after step {len(before)}, resumed at {resumed[0]}; queue {counts}")
    assert counts["received"] == counts["served"] + counts["queued"], counts
    acked = counts["served"] // GROUPS_PER_STEP
    assert counts["served"] == acked * GROUPS_PER_STEP, counts
    assert len(before) + len(after) <= acked <= len(before) + 1 + len(after), (acked, counts)
