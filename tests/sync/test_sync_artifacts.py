"""Synced artifacts are pruned, but never the served one nor the newest few before it."""

import os
from pathlib import Path

from grpo_trainer.sync.artifacts import prune_served, served_dir


def test_prune_keeps_the_served_artifact_and_recent_history(tmp_path: Path) -> None:
    root = served_dir(tmp_path)
    root.mkdir(parents=True, exist_ok=True)
    made = []
    for step in range(1, 7):
        path = root / f"adapter_step_{step}"
        path.mkdir()
        (path / "adapter_config.json").write_text("{}")
        os.utime(path, (step, step))
        made.append(path)
    prune_served(tmp_path, keep=made[-1], history=2)
    left = sorted(p.name for p in root.iterdir())
    assert left == ["adapter_step_4", "adapter_step_5", "adapter_step_6"]
