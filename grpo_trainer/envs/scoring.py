"""Scoring a group's completions with the task's reward function.

A user's scorer may raise anything or return junk (NaN, infinity): either costs the group
(counted in ``env/errors`` with the reason), never the environment.
"""

from __future__ import annotations

import math

from grpo_trainer.envs.inference import Sample
from grpo_trainer.envs.stats import EnvStats
from grpo_trainer.envs.task import Prompt, Task
from grpo_trainer.envs.tokenizer import PromptTokenizer


class Scorer:
    """Scores samples with ``task.score`` on their decoded text."""

    def __init__(self, task: Task, tokenizer: PromptTokenizer, stats: EnvStats) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.stats = stats

    def score(self, prompt: Prompt, samples: list[Sample]) -> list[float] | None:
        """Every sample's score; None (error counted) when the scorer raises or returns junk.

        A completion cut off by ``max_tokens`` gets the task's ``truncated_score`` unscored
        when the task sets one."""
        truncated_score = self.task.truncated_score
        scores = []
        for sample in samples:
            if sample.truncated and truncated_score is not None:
                scores.append(truncated_score)
                continue
            text = self.tokenizer.decode(sample.token_ids)
            try:
                score = float(self.task.score(prompt, text))
            except Exception as exc:  # a user's scorer may raise anything; keep going
                self.stats.error("scorer_raised", f"{type(exc).__name__}: {exc}")
                return None
            if not math.isfinite(score):
                self.stats.error("scorer_non_finite", f"score {score!r} for {text[:80]!r}")
                return None
            scores.append(score)
        return scores
