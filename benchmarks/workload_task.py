"""The GPU workload's task: GSM8K-shaped lengths, a synthetic reward, no data set.

Prompts are ``PROMPT_CHARS`` letters and digits, one token each with the padded tiny
tokenizer (``build_tiny_tokenizer(vocab_size=...)``), so every prompt is exactly that many
tokens. The reward is the share of digits in the decoded completion: cheap, deterministic,
different between the completions of a group (so no group is dropped for equal scores),
and the same function for grpo-tui (``task = "benchmarks.workload_task:Workload"``) and
TRL (``digit_share`` as its reward function).
"""

from __future__ import annotations

import random
import string
from typing import Any, ClassVar

from grpo_trainer.envs.task import Prompt, Task

PROMPT_CHARS = 128
COMPLETION_TOKENS = 256
LETTERS = string.ascii_lowercase + string.digits


def prompt_text(rng: random.Random, length: int = PROMPT_CHARS) -> str:
    """``length`` random letters and digits: ``length`` tokens with the padded tokenizer."""
    return "".join(rng.choice(LETTERS) for _ in range(length))


def digit_share(text: str) -> float:
    """The synthetic reward: the share of digits among the completion's characters."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


class Workload(Task):
    """Fixed-length prompts and the digit-share reward (lengths via the env's settings)."""

    name = "workload"
    default_max_tokens: ClassVar[int] = COMPLETION_TOKENS

    def sample(self, rng: random.Random) -> Prompt:
        return Prompt(text=prompt_text(rng))

    def score(self, prompt: Prompt, completion: str) -> float:
        return digit_share(completion)


def trl_reward(completions: list[Any], **_: Any) -> list[float]:
    """TRL's reward-function signature around :func:`digit_share` (a completion is text, or
    a list of chat messages in ``AsyncGRPOTrainer``)."""
    return [digit_share(completion_text(c)) for c in completions]


def completion_text(completion: Any) -> str:
    """The text of a completion: as is, or the contents of its chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    return str(completion)
