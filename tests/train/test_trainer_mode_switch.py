"""Mode switches through --resume auto (full -> LoRA -> full, step count continuing), and
the same switches inside one running trainer."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from train_helpers import make_groups, tiny_model, write_groups

from grpo_trainer.models import load_model, load_tokenizer
from grpo_trainer.run_notices import ModeSwitch
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.loop import Trainer
from grpo_trainer.train.policy import build_policy
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.resume import resolve_resume
from grpo_trainer.train.session import run_session
from grpo_trainer.train.sources import FileSource
from grpo_trainer.train.switch import switch_in_place
from grpo_trainer.weight_dirs.layout import read_checkpoint


def test_full_to_lora_to_full_keeps_weights_and_steps(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "model")
    data = write_groups(
        tmp_path / "groups.jsonl", make_groups(model, count=8, group_size=2, seed=3)
    )
    ckpt = tmp_path / "ckpt"
    common = {
        "model_name": str(model),
        "save_path": str(ckpt),
        "batches_file": str(data),
        "sync_every": 0,
        "batch_size": 2,
        "seq_len": 64,
        "lr": 1e-2,
        "metrics_file": str(tmp_path / "metrics.jsonl"),
        "resume": "auto",
        "lora_target_modules": ["q_proj", "v_proj", "o_proj"],
    }
    for mode, steps in (("none", 3), ("lora_only", 6), ("shared_vllm", 8)):
        config = TrainerConfig(**common, weight_bridge_mode=mode, training_steps=steps)
        assert run_session(config) == 0
        if mode == "lora_only":
            point = resolve_resume(ckpt, "lora_only")
            assert point.model_path == str(ckpt / "step_3")  # full weights became the base
            assert point.adapter_path == str(ckpt / "adapter_step_6")
            lora = load_model(point.model_path, adapter=point.adapter_path)
            merged = load_model(ckpt / "step_6")
            ids = torch.randint(5, 44, (2, 9), generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                want, got = lora(input_ids=ids).logits, merged(input_ids=ids).logits
            assert torch.allclose(want, got, atol=1e-5), "merged step_6 != base + adapter"
            base = load_model(ckpt / "step_3")
            with torch.no_grad():
                assert not torch.allclose(base(input_ids=ids).logits, got, atol=1e-4)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()]
    assert steps == list(range(1, 9))
    state = json.loads((ckpt / "step_8" / "trainer_state.json").read_text())
    assert state["kind"] == "full" and state["step"] == 8


def test_switches_in_place_keep_the_process_steps_and_between_full_modes_the_optimizer(
    tmp_path: Path,
) -> None:
    """The same modes switched inside one trainer (what a run's in-place switch does at a
    step boundary): full -> LoRA wraps the current weights in a fresh adapter (checkpointed
    first as its base), LoRA -> full merges it; full -> full keeps the optimizer state."""
    model_dir = tiny_model(tmp_path / "model")
    data = write_groups(
        tmp_path / "groups.jsonl", make_groups(model_dir, count=8, group_size=2, seed=3)
    )
    ckpt = tmp_path / "ckpt"
    config = TrainerConfig(
        model_name=str(model_dir), save_path=str(ckpt), batches_file=str(data), sync_every=0,
        batch_size=2, seq_len=64, lr=1e-2, lora_target_modules=["q_proj", "v_proj", "o_proj"],
        weight_bridge_mode="none", training_steps=3, checkpoint_interval=100,
    )  # fmt: skip
    policy = build_policy(config, None)
    trainer = Trainer(
        config, policy.model, load_tokenizer(config.model_name), base=policy.base,
        source=FileSource(data, config.step_batch_size),
        reporter=Reporter(link=None, metrics_path=tmp_path / "metrics.jsonl"),
    )  # fmt: skip

    def switch(mode: str, serial: int) -> None:
        argv = config.model_copy(update={"weight_bridge_mode": mode}).to_argv()
        switch_in_place(trainer, ModeSwitch(serial=serial, mode=mode, argv=argv))
        assert trainer.config.weight_bridge_mode == mode

    def train_until(step: int) -> None:
        trainer.config = trainer.config.model_copy(update={"training_steps": step})
        assert trainer.run() == step

    assert trainer.run() == 3
    optimizer = trainer.optimizer
    switch("shared_vllm", 1)
    train_until(4)
    assert trainer.optimizer is optimizer and optimizer.state, "full -> full keeps its state"
    switch("lora_only", 2)
    train_until(6)
    assert hasattr(trainer.model, "peft_config") and trainer.optimizer is not optimizer
    assert read_checkpoint(ckpt / "step_4").kind == "full"  # written at the switch: the base
    assert trainer.base == str(ckpt / "step_4")
    switch("none", 3)
    adapter = read_checkpoint(ckpt / "adapter_step_6")  # written at the switch
    assert adapter.kind == "adapter" and adapter.base == str(ckpt / "step_4")
    # the adapter's own config names its base too: what lora_restart restarts inference on
    # and the server checks (issue 35: it named the model the trainer first loaded)
    config_file = ckpt / "adapter_step_6" / "adapter_config.json"
    assert json.loads(config_file.read_text())["base_model_name_or_path"] == str(ckpt / "step_4")
    assert not hasattr(trainer.model, "peft_config")
    ids = torch.randint(5, 44, (2, 9), generator=torch.Generator().manual_seed(0))
    lora = load_model(ckpt / "step_4", adapter=ckpt / "adapter_step_6")
    with torch.no_grad():
        want, got = lora(input_ids=ids).logits, trainer.model(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5), "merged in process != base + adapter"
    train_until(8)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()]
    assert steps == list(range(1, 9))
    state = json.loads((ckpt / "step_8" / "trainer_state.json").read_text())
    assert state["kind"] == "full" and state["step"] == 8
