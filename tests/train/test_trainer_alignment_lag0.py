"""``alignment/diff_abs_mean_lag0``: the logprob difference of on-policy sequences alone.

The step's ``alignment/diff_abs_mean`` mixes a weight-sync error with the drift of samples
drawn steps ago; the lag-0 figure counts only sequences sampled at the policy the trainer
holds, so a wrong or stale weight load shows in it and drift cannot.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import make_groups, tiny_model

from grpo_trainer.models import load_model, load_tokenizer
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.data import build_step_batch, parse_groups
from grpo_trainer.train.loop import Trainer
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.sources import FileSource

DRIFT = 0.5


def trainer_at(model_path: Path, tmp_path: Path, step: int) -> Trainer:
    config = TrainerConfig(
        model_name=str(model_path),
        lr=1e-3,
        batch_size=4,
        seq_len=32,
        save_path=str(tmp_path / "ckpt"),
        sync_every=0,
    )
    trainer = Trainer(
        config,
        load_model(model_path),
        load_tokenizer(model_path),
        base=str(model_path),
        source=FileSource(tmp_path / "unused.jsonl", 4),
        reporter=Reporter(None, None),
    )
    trainer.step = step  # as after a resume at this step
    return trainer


def test_lag0_difference_counts_on_policy_sequences_only(tmp_path: Path) -> None:
    model_path = tiny_model(tmp_path / "model")
    fresh = make_groups(model_path, count=1, group_size=2, seed=3, policy_version=4)[0]
    stale = make_groups(model_path, count=1, group_size=2, seed=4, policy_version=3)[0]
    # the stale group's server logprobs are off by DRIFT on every sampled token
    stale["inference_logprobs"] = [
        [lp - DRIFT for lp in row] for row in stale["inference_logprobs"]
    ]
    trainer = trainer_at(model_path, tmp_path, step=4)
    batch = build_step_batch(parse_groups([fresh, stale]), micro_batch_size=2, seq_len=32, pad_id=0)
    metrics = trainer.train_step(batch)
    fresh_tokens = sum(len(seq) - 5 for seq in fresh["tokens"])
    stale_tokens = sum(len(seq) - 5 for seq in stale["tokens"])
    assert metrics["alignment/diff_abs_mean_lag0"] < 1e-4  # the same weights, float32
    assert metrics["alignment/lag0_fraction"] == pytest.approx(
        fresh_tokens / (fresh_tokens + stale_tokens)
    )
    assert metrics["alignment/diff_abs_mean"] == pytest.approx(
        DRIFT * stale_tokens / (fresh_tokens + stale_tokens), abs=1e-4
    )
    assert metrics["off_policy_lag"] == pytest.approx(0.5)


def test_no_lag0_figure_without_on_policy_sequences(tmp_path: Path) -> None:
    model_path = tiny_model(tmp_path / "model")
    groups = make_groups(model_path, count=2, group_size=2, seed=5, policy_version=1)
    trainer = trainer_at(model_path, tmp_path, step=2)
    batch = build_step_batch(parse_groups(groups), micro_batch_size=2, seq_len=32, pad_id=0)
    metrics = trainer.train_step(batch)
    assert "alignment/diff_abs_mean_lag0" not in metrics
    assert metrics["off_policy_lag"] == 1
