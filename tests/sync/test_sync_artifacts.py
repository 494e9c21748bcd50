"""Synced artifacts are pruned, but never the served one nor the newest few before it;
an adapter is written as its weights and config only."""

import json
import os
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from safetensors.torch import load_file

from grpo_trainer.models import build_tiny_model, load_model
from grpo_trainer.sync.artifacts import prune_served, save_adapter, served_dir


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


def test_prune_leaves_the_sglang_current_link_alone(tmp_path: Path) -> None:
    """A link in ``served/`` (SGLang's ``adapter_current`` of runs before the two adapter
    slots, in a run directory resumed now) is older than the history kept; pruning removes
    its target, never the link (an H200 run failed every sync from the second on with
    "Cannot call rmtree on a symbolic link")."""
    root = served_dir(tmp_path)
    root.mkdir(parents=True, exist_ok=True)
    made = []
    for step in range(4):
        path = root / f"adapter_step_{step}"
        path.mkdir()
        os.utime(path, (step + 1, step + 1))
        made.append(path)
    link = root / "adapter_current"
    link.symlink_to(made[0].name)
    prune_served(tmp_path, keep=made[-1], history=1)
    assert sorted(p.name for p in root.iterdir()) == [
        "adapter_current",
        "adapter_step_2",
        "adapter_step_3",
    ]
    assert link.is_symlink()


def test_save_adapter_writes_weights_and_config_without_a_model_card(tmp_path: Path) -> None:
    torch.manual_seed(0)
    base = build_tiny_model(tmp_path / "model", seed=0)
    model = get_peft_model(
        load_model(base), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    )
    path = save_adapter(model, tmp_path, "adapter_step_1")
    assert sorted(p.name for p in path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["r"], config["target_modules"]) == (4, ["q_proj"])
    assert config["inference_mode"] is True
    saved = load_file(path / "adapter_model.safetensors")
    expected = get_peft_model_state_dict(model)
    assert saved.keys() == expected.keys()
    assert all(torch.equal(saved[k], expected[k]) for k in saved)
    # The card writer is shadowed for that one save only: peft's own save still writes it.
    model.save_pretrained(tmp_path / "plain")
    assert (tmp_path / "plain" / "README.md").exists()
