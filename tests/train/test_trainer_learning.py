"""One optimizer step moves logprobs in the direction of the advantage."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import make_groups, tiny_model

from grpo_trainer.models import load_model, load_tokenizer
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.data import build_step_batch, parse_groups
from grpo_trainer.train.logprobs import naive_token_logprobs
from grpo_trainer.train.loop import Trainer
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.sources import FileSource


def sequence_logprob(model, tokens: list[int], prompt_len: int) -> float:
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = naive_token_logprobs(model, ids, torch.ones_like(ids), torch.tensor([1.0]))
    return float(out.logprobs[0, prompt_len - 1 :].sum())


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_positive_advantage_raises_and_negative_lowers_logprob(tmp_path: Path, loss_type: str):
    model_path = tiny_model(tmp_path / "model")
    group = make_groups(model_path, count=1, group_size=2, seed=7, completion_len=6)[0]
    group["scores"] = [1.0, 0.0]
    config = TrainerConfig(
        model_name=str(model_path),
        lr=1e-2,
        batch_size=2,
        seq_len=32,
        loss_type=loss_type,
        save_path=str(tmp_path / "ckpt"),
        sync_every=0,
    )
    model = load_model(model_path)
    trainer = Trainer(
        config,
        model,
        load_tokenizer(model_path),
        base=str(model_path),
        source=FileSource(tmp_path / "unused.jsonl", 2),
        reporter=Reporter(None, None),
    )
    before = [sequence_logprob(model, seq, 5) for seq in group["tokens"]]
    batch = build_step_batch(parse_groups([group]), micro_batch_size=2, seq_len=32, pad_id=0)
    metrics = trainer.train_step(batch)
    after = [sequence_logprob(model, seq, 5) for seq in group["tokens"]]
    assert after[0] > before[0], "positive advantage must raise the sequence's logprob"
    assert after[1] < before[1], "negative advantage must lower the sequence's logprob"
    assert trainer.step == 1
    assert abs(metrics["alignment/diff_abs_mean"]) < 1e-4  # inference logprobs = trainer's
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-4)
