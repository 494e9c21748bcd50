"""Scoring a group's completions with the task's reward function.

A user's scorer may raise anything or return junk (NaN, infinity): either costs the group
and is a failure of the task's code (``task_errors.py``: counted, reported, bounded).
"""

from __future__ import annotations

import math

from grpo_trainer.envs.inference import Sample
from grpo_trainer.envs.task import Prompt, Task
from grpo_trainer.envs.task_errors import TaskErrors
from grpo_trainer.envs.tokenizer import PromptTokenizer


class Scorer:
    """Scores samples with ``task.score`` on their decoded text."""

    def __init__(self, task: Task, tokenizer: PromptTokenizer, errors: TaskErrors) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.errors = errors

    def score(self, prompt: Prompt, samples: list[Sample]) -> list[float] | None:
        """Every sample's score; None (a task failure) when the scorer raises or returns junk.

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
                self.errors.failed("scorer_raised", "score()", exc)
                return None
            if not math.isfinite(score):
                self.errors.failed(
                    "scorer_non_finite", "score()", f"returned {score!r} for {text[:80]!r}"
                )
                return None
            scores.append(score)
        return scores
