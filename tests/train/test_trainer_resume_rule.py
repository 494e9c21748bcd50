"""The resume rule shared by the trainer and the profile layer, and checkpoint pruning."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_trainer.train.checkpoint import prune_checkpoints
from grpo_trainer.train.resume import (
    ServedWeights,
    resolve_resume,
    resume_from_path,
    resume_point,
    served_at_start,
)


def full(root: Path, step: int, kind: str = "full") -> Path:
    path = root / f"step_{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"step": step, "kind": kind}))
    return path


def adapter(root: Path, step: int, base: str) -> Path:
    path = root / f"adapter_step_{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"step": step, "base": base}))
    return path


def test_nothing_or_only_incomplete_checkpoints_means_fresh_start(tmp_path: Path) -> None:
    assert resolve_resume(tmp_path / "absent", "none") is None
    (tmp_path / "step_9").mkdir()  # no trainer_state.json: a save that never finished
    (tmp_path / ".tmp-step_10-123").mkdir()
    assert resolve_resume(tmp_path, "none") is None
    assert resolve_resume(tmp_path, "lora_only") is None


def test_lora_mode_prefers_adapter_at_or_after_latest_full(tmp_path: Path) -> None:
    full(tmp_path, 10)
    adapter(tmp_path, 20, base=str(tmp_path / "step_10"))
    full(tmp_path, 20, kind="merged")
    point = resolve_resume(tmp_path, "lora_restart")
    assert (point.step, point.exact) == (20, True)
    assert point.model_path == str(tmp_path / "step_10")
    assert point.adapter_path == str(tmp_path / "adapter_step_20")


def test_lora_mode_after_full_training_takes_full_weights_and_fresh_adapter(tmp_path: Path):
    adapter(tmp_path, 5, base="base-model")
    full(tmp_path, 8)
    point = resolve_resume(tmp_path, "lora_only")
    assert (point.model_path, point.adapter_path, point.step, point.exact) == (
        str(tmp_path / "step_8"),
        None,
        8,
        False,
    )


def test_full_mode_takes_latest_full_or_merges_newer_adapter(tmp_path: Path) -> None:
    full(tmp_path, 4)
    adapter(tmp_path, 3, base="base-model")
    point = resolve_resume(tmp_path, "shared_vllm")
    assert (point.model_path, point.adapter_path, point.exact) == (
        str(tmp_path / "step_4"),
        None,
        True,
    )
    adapter(tmp_path, 6, base=str(tmp_path / "step_4"))
    point = resolve_resume(tmp_path, "none")
    assert point.model_path == str(tmp_path / "step_4")
    assert point.adapter_path == str(tmp_path / "adapter_step_6")
    assert (point.step, point.exact) == (6, False)
    full(tmp_path, 6, kind="merged")
    point = resolve_resume(tmp_path, "none")
    assert (point.model_path, point.step, point.exact) == (str(tmp_path / "step_6"), 6, False)
    assert resume_from_path(tmp_path / "step_4", "none").step == 4


def test_prune_keeps_last_steps_and_the_bases_of_kept_adapters(tmp_path: Path) -> None:
    full(tmp_path, 2)
    for step in (4, 6, 8):
        adapter(tmp_path, step, base=str(tmp_path / "step_2"))
        full(tmp_path, step, kind="merged")
    removed = prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["adapter_step_4", "step_4"]
    assert (tmp_path / "step_2").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adapter_step_6",
        "adapter_step_8",
        "step_2",
        "step_6",
        "step_8",
    ]


def test_resume_from_a_path_until_the_run_saved_its_own(tmp_path: Path) -> None:
    """``--resume PATH`` starts a run from another run's checkpoint; once this run saved its
    own, a restarted trainer continues from those, not from PATH again (found by the fault
    suite: a resumed run's trainer, killed, went back to the first run's step 8)."""
    start = full(tmp_path / "old" / "checkpoints", 8)
    save = tmp_path / "new" / "checkpoints"
    assert resume_point(save, "none", str(start)).checkpoint == start
    full(save, 12)
    assert resume_point(save, "none", str(start)).checkpoint == save / "step_12"


def test_a_starting_server_loads_the_base_under_the_trainers_adapter(tmp_path: Path) -> None:
    """``served_at_start``: what an inference server loads at each start (docs/inference.md,
    "What inference serves"), from the same resume point the trainer starts from."""
    here = tmp_path / "run" / "checkpoints"

    def served(mode: str, resume: str | None = "auto") -> ServedWeights:
        return served_at_start(resume_point(here, mode, resume), mode)

    assert served("lora_only") == ServedWeights(model=None, adapter=None)  # the profile's model
    # a full-mode run switched into LoRA in place at step 6: its base is step_6
    full(here, 4)
    switch = full(here, 6)
    assert served("lora_only") == ServedWeights(model=str(switch), adapter=None)
    assert served("shared_vllm").model == str(switch)
    trained = adapter(here, 8, base=str(switch))
    full(here, 8, kind="merged")
    assert served("lora_restart") == ServedWeights(model=str(switch), adapter=str(trained))
    # a full mode serves the newest full weights, never an adapter (the trainer merges it)
    assert served("colocate") == ServedWeights(model=str(here / "step_8"), adapter=None)


def test_a_run_resumed_from_another_serves_the_adapter_on_its_recorded_base(
    tmp_path: Path,
) -> None:
    """Resumed from another run's adapter (``--resume PATH``), a server starts on the base
    that adapter recorded (issue 35: it started on the profile's model until the run saved
    its own checkpoint)."""
    old = tmp_path / "old" / "checkpoints"
    base = full(old, 3)
    start = adapter(old, 8, base=str(base))
    new = tmp_path / "new" / "checkpoints"
    point = resume_point(new, "lora_only", str(start))
    assert served_at_start(point, "lora_only") == ServedWeights(model=str(base), adapter=str(start))
    assert served_at_start(resume_point(new, "lora_only", None), "lora_only").model is None
