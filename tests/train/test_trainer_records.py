"""The trainer's records: each trained group with its own logprobs, entropy and ratio per
token, the step's phases on the timeline, and the mismatch and staleness metrics."""

from __future__ import annotations

import json
import math
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch
from train_helpers import make_groups, tiny_model, write_groups

from grpo_trainer.models import load_model, load_tokenizer
from grpo_trainer.records.rollout_reader import RolloutIndex
from grpo_trainer.records.rollouts import k3
from grpo_trainer.records.timeline_reader import Timeline
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.logprobs import naive_token_logprobs
from grpo_trainer.train.loop import Trainer
from grpo_trainer.train.recording import StepRecorder
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.sources import FileSource
from grpo_trainer.train.step_metrics import staleness

SHIFT = 0.3
"""The "math" environment's inference logprobs are this much below the model's."""
STEPS, GROUPS, SIZE = 4, 2, 2


def test_staleness_histogram_buckets_lags_and_flags_negative_ones() -> None:
    shares = staleness(5, [5, 4, 4, 0, -1, 7])
    assert shares["staleness/lag0"] == pytest.approx(1 / 5)
    assert shares["staleness/lag1"] == pytest.approx(2 / 5)
    assert shares["staleness/lag4+"] == pytest.approx(1 / 5)  # lag 5
    assert shares["staleness/negative"] == pytest.approx(1 / 5)  # version 7 > 5
    assert shares["staleness/max"] == 5
    assert staleness(3, [-1, -1]) == {}


def test_trained_groups_timeline_and_mismatch_metrics(tmp_path: Path) -> None:
    model_path = tiny_model(tmp_path / "model")
    groups = make_groups(model_path, count=STEPS * GROUPS, group_size=SIZE, seed=11)
    for i, group in enumerate(groups):
        step = i // GROUPS + 1
        group["policy_version"] = max(0, step - 1 - i % 3)  # lags 0, 1, 2 in turn
        group["env_id"], group["env_name"] = i % 2, ("toy", "math")[i % 2]
        if group["env_name"] == "math":
            group["inference_logprobs"] = [
                [lp if j < 5 else lp - SHIFT for j, lp in enumerate(row)]
                for row in group["inference_logprobs"]
            ]
    batches = write_groups(tmp_path / "batches.jsonl", groups)
    config = TrainerConfig(
        model_name=str(model_path),
        lr=1e-9,  # the weights stay the start model's: its logprobs are the reference
        batch_size=SIZE * GROUPS,
        seq_len=32,
        training_steps=STEPS,
        save_path=str(tmp_path / "run" / "ckpt"),
        sync_every=0,
        record_rollouts_every=2,
    )
    tokenizer = load_tokenizer(model_path)
    run = tmp_path / "run"
    recorder = StepRecorder(run, "trainer", tokenizer.decode, max_mb=16, every=2)
    trainer = Trainer(
        config,
        load_model(model_path),
        tokenizer,
        base=str(model_path),
        source=FileSource(batches, config.step_batch_size),
        reporter=Reporter(None, run / "metrics.jsonl"),
        recorder=recorder,
    )
    assert trainer.run() == STEPS
    metrics = {r["step"]: r["data"] for r in map(json.loads, (run / "metrics.jsonl").open())}

    index = RolloutIndex(run)
    index.poll()
    assert sorted(index.rows["step"].tolist()) == [2, 2, 4, 4]  # every 2nd step sampled
    reference = load_model(model_path).eval()
    for row in range(len(index)):
        record = index.open(row)
        source = groups[(record.step - 1) * GROUPS + record.group]
        assert record.env == source["env_name"] and record.version == source["policy_version"]
        assert record.lag == record.step - 1 - source["policy_version"]
        assert record.scores == source["scores"]
        tokens_k3 = []
        for completion, tokens in zip(record.completions, source["tokens"], strict=True):
            assert completion.tokens.tolist() == tokens and completion.start == 5
            ids = torch.tensor([tokens])
            with torch.no_grad():
                naive = naive_token_logprobs(
                    reference, ids, torch.ones_like(ids), torch.tensor([1.0]), with_entropy=True
                )
            trained = completion.trained
            np.testing.assert_allclose(
                completion.values["trainer_logprobs"][trained], naive.logprobs[0, 4:], atol=1e-4
            )
            np.testing.assert_allclose(
                completion.values["entropy"][trained], naive.entropy[0, 4:], atol=1e-4
            )
            delta = completion.delta()[trained]
            expected_shift = SHIFT if record.env == "math" else 0.0
            np.testing.assert_allclose(delta, expected_shift, atol=1e-4)
            np.testing.assert_allclose(
                completion.values["ratio"][trained], np.exp(delta), rtol=1e-4
            )
            assert math.isnan(completion.values["ratio"][0])
            tokens_k3 += k3(delta.astype(float)).tolist()
        assert index.rows["mismatch_kl"][row] == pytest.approx(np.mean(tokens_k3), rel=1e-3)

    for step in (2, 4):
        data = metrics[step]
        assert data["mismatch_kl/env/math"] == pytest.approx(
            float(k3(np.array([SHIFT]))[0]), rel=1e-3
        )
        assert data["mismatch_kl/env/toy"] == pytest.approx(0.0, abs=1e-6)
        rows = np.flatnonzero(index.rows["step"] == step)
        per_group = [
            (index.rows["mismatch_kl"][r], index.rows["length_mean"][r] * SIZE) for r in rows
        ]
        weighted = sum(m * n for m, n in per_group) / sum(n for _, n in per_group)
        assert data["mismatch_kl"] == pytest.approx(weighted, rel=1e-3)
        versions = [g["policy_version"] for g in groups[(step - 1) * GROUPS : step * GROUPS]]
        lags = Counter(step - 1 - v for v in versions)
        for lag in range(3):
            assert data[f"staleness/lag{lag}"] == pytest.approx(lags[lag] / GROUPS)
    # step 1 trains only lag-0 sequences: the lag-0 figure is the whole step's
    assert metrics[1]["mismatch_kl/lag0"] == pytest.approx(metrics[1]["mismatch_kl"], rel=1e-6)
    assert metrics[1]["mismatch_kl"] > 0.01

    timeline = Timeline(run)
    timeline.poll()
    assert list(timeline.lanes) == ["trainer"] and timeline.steps() == [1, 2, 3, 4]
    windows = [timeline.step_window(step) for step in timeline.steps()]
    assert all(a[1] <= b[0] for a, b in pairwise(windows))
    for step in timeline.steps():
        spent = timeline.breakdown(*timeline.step_window(step))["trainer"]
        assert {"wait", "forward_backward", "optimizer"} <= set(spent)
        assert sum(spent.values()) == pytest.approx(np.subtract(*timeline.step_window(step)[::-1]))
