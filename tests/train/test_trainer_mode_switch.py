"""Mode switches through --resume auto: full -> LoRA -> full, step count continuing."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import torch
from train_helpers import make_groups, tiny_model, write_groups

from grpo_trainer.models import load_model
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.resume import resolve_resume
from grpo_trainer.train.session import run_session


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
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
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
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()]
    assert steps == list(range(1, 9))
    state = json.loads((ckpt / "step_8" / "trainer_state.json").read_text())
    assert state["kind"] == "full" and state["step"] == 8
