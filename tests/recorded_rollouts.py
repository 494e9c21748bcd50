"""A deterministic run record for the inspector, the timeline, ``samples`` and the report:
trained and dropped groups of two environments and every process's phase spans, at fixed
times, written through the real writers (``grpo_trainer/records``).

Times line up with ``tests/tui/tui_recorded_run.py``: step N runs from ``T0 + 30 + 2(N-1)``
to ``T0 + 30 + 2N``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from grpo_trainer.records.background import BackgroundWriter
from grpo_trainer.records.rollout_writer import RolloutWriter
from grpo_trainer.records.rollouts import GroupParts
from grpo_trainer.records.timeline import SpanRecorder

T0 = 1_800_000_000.0
STEPS = 40
GROUP = 4
ENVS = ("toy", "gsm8k")
WORDS = ["repeat", " ", ":", "the", " answer", " is", "\n", *"0123456789", "Q", ".", " step"]
PIECES = dict(enumerate(WORDS))


def step_start(step: int) -> float:
    return T0 + 30 + 2.0 * (step - 1)


def _ids(text: list[str]) -> list[int]:
    return [WORDS.index(piece) for piece in text]


def _group(step: int, index: int, env: str, *, dropped: bool) -> GroupParts:
    rng = np.random.default_rng(step * 10 + index)
    digit = str((step + index) % 10)
    prompt = _ids(["repeat", " ", digit, ":"]) if env == "toy" else _ids(["Q", " step", ":"])
    tokens, trained, inference, trainer, entropy = [], [], [], [], []
    scores, texts = [], []
    for seq in range(GROUP):
        if env == "toy":
            body = [digit if (seq + step) % 3 else str((seq + 1) % 10) for _ in range(4)]
        else:
            answer = digit if (seq + step) % 3 else str((int(digit) + 1 + seq) % 10)
            body = ["the", " answer", " is", " ", answer, "."]
        if dropped:
            body = [digit] * 4
        completion = _ids(body)
        n, c = len(prompt), len(completion)
        tokens.append(np.array(prompt + completion, np.int32))
        mask = np.r_[np.zeros(n, bool), np.ones(c, bool)]
        trained.append(mask)
        lp = -rng.gamma(1.0, 0.4 + 0.01 * step, n + c).astype(np.float32)
        drift = rng.normal(0.0, 0.05 + 0.3 * (seq == 1 and step > 30), n + c).astype(np.float32)
        inference.append(np.where(mask, lp, np.nan).astype(np.float32))
        trainer.append(np.where(mask, lp + drift, np.nan).astype(np.float32))
        entropy.append(np.where(mask, rng.gamma(2.0, 0.4, n + c), np.nan).astype(np.float32))
        if env == "gsm8k" and not dropped:
            scores.append(float(body[4] == digit))
        else:
            scores.append(1.0 if dropped else round(sum(p == digit for p in body) / len(body), 3))
        texts.append("".join(body))
    arrays = {
        "tokens": np.concatenate(tokens),
        "trained": np.concatenate(trained),
        "inference_logprobs": np.concatenate(inference),
    }
    if not dropped:
        arrays["trainer_logprobs"] = np.concatenate(trainer)
        arrays["entropy"] = np.concatenate(entropy)
        arrays["ratio"] = np.exp(arrays["trainer_logprobs"] - arrays["inference_logprobs"])
    lag = index % 3 if step > 2 else 0
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores)) or 1e-8
    return GroupParts(
        kind="dropped" if dropped else "trained",
        step=step,
        group=index,
        env=env,
        env_id=ENVS.index(env),
        version=step - 1 - lag,
        lag=lag,
        t=step_start(step) + (0.5 if dropped else 1.0) + 0.01 * index,
        scores=scores,
        advantages=None if dropped else [(s - mean) / std for s in scores],
        lengths=[len(t) for t in tokens],
        arrays=arrays,
        prompt_text="".join(PIECES[i] for i in prompt),
        texts=texts,
        pieces=PIECES,
    )


def write_recorded_rollouts(run_dir: Path, steps: int = STEPS) -> None:
    """Four trained groups and one dropped group per step, and a timeline of a two-rank
    trainer and two environments, into ``run_dir``."""
    background = BackgroundWriter("fixture")
    trainer = RolloutWriter(run_dir, "trainer", max_mb=64, background=background)
    env = RolloutWriter(run_dir, "env.toy", max_mb=64, background=background)
    lanes = {
        name: SpanRecorder(
            run_dir, name, "trainer" if name.startswith("trainer") else "env", background
        )
        for name in ("trainer", "trainer.rank1", "env.toy", "env.gsm8k")
    }
    for step in range(1, steps + 1):
        trainer.add(
            lambda step=step: [_group(step, i, ENVS[i % 2], dropped=False) for i in range(4)]
        )
        env.add(lambda step=step: [_group(step, 0, "toy", dropped=True)])
        t = step_start(step)
        for rank, name in enumerate(("trainer", "trainer.rank1")):
            lane = lanes[name]
            lane.add("wait", t, t + 1.1)
            lane.add("forward_backward", t + 1.1, t + 1.6 + 0.05 * rank)
            lane.add("optimizer", t + 1.65 + 0.05 * rank, t + 1.7 + 0.05 * rank)
            lane.add("pause", t + 1.75, t + 1.78)
            lane.add("transfer", t + 1.78, t + 1.95)
            lane.add("resume", t + 1.95, t + 1.98)
            lane.flush(step)
        for shift, name in enumerate(("env.toy", "env.gsm8k")):
            lane = lanes[name]
            lane.add("generate", t - 0.6 + 0.2 * shift, t + 1.2)
            lane.add("generate", t + 1.0, t + 1.5 + 0.1 * shift)
            lane.add("room", t + 1.5 + 0.1 * shift, t + 1.95)
            lane.flush(step, merged=True)
    background.close()
    trainer.close()
    env.close()
    for lane in lanes.values():
        lane.close()
