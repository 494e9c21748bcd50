"""``colocate`` with 2 trainer ranks through ``grpo-tui run``: the N-GPU layout on CPU.

A copy of ``profiles/quickstart.toml`` with ``[trainer] ranks = 2`` (torchrun, 2 gloo FSDP2
ranks) and ``[inference] data_parallel_size = 2`` (the built-in server's 2 replicas, one per
rank). Every step the replicas sleep, both ranks train, and each replica is loaded from its
own rank's gathered weights (shared memory standing in for CUDA IPC): the run exits 0,
every step reports its phases and its pushed weights, on-policy sequences' logprobs match
the trainer's (each replica holds its rank's weights), and nothing of the run outlives it.
That two ranks train as one does is ``tests/train/test_trainer_distributed.py``'s; that
colocate learns, ``test_e2e_modes.py``'s: this run is short.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_stack import HeadlessCli, quickstart_run_to_end, trainer_steps

RANKS = 2
STEPS = 12


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_colocate_on_two_ranks_and_two_replicas_serves_each_ranks_weights_and_leaves_nothing(
    tmp_path: Path, cli: list[HeadlessCli]
) -> None:
    steps = STEPS
    overrides = {
        "trainer": {"training_steps": steps, "checkpoint_interval": 10, "ranks": RANKS},
        "inference": {"data_parallel_size": RANKS},
    }
    run_dir = quickstart_run_to_end(
        tmp_path, cli, mode="colocate", overrides=overrides, timeout=540
    )

    log = (run_dir / "logs" / "trainer.log").read_text()
    assert "[rank0]" in log and "[rank1]" in log  # one torchrun group of 2 ranks
    records = trainer_steps(run_dir)
    assert [step for step, _ in records] == list(range(1, steps + 1))
    for _, data in records:  # inference slept, the weights were pushed, it woke: each step
        assert data["phase/sleeping_s"] > 0 and data["phase/waking_s"] > 0
        assert data["sync/push_time"] > 0
        assert set(data) >= {f"gpu_memory_gb/rank{r}" for r in range(RANKS)}
        # each rank's device's time in each phase (the dashboard's "per GPU")
        for phase in ("sleeping", "training", "syncing", "waking", "generating"):
            assert all(data[f"phase/{phase}_s/rank{r}"] > 0 for r in range(RANKS)), phase
    # sequences sampled at the weights being trained: their logprobs match the trainer's to
    # float32 rounding, so every replica holds its rank's weights (no stale or mixed bucket)
    on_policy = [
        d["alignment/diff_abs_mean_lag0"] for _, d in records if "alignment/lag0_fraction" in d
    ]
    assert on_policy, "no step trained on sequences sampled at its own weights"
    assert max(on_policy) < 1e-5, on_policy
    served = (run_dir / "logs" / "inference.log").read_text()
    assert "2 replicas" in served
    saved = {p.name for p in (run_dir / "checkpoints").iterdir()}
    assert f"step_{steps}" in saved
