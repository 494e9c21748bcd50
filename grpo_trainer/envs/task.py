"""The small interface a task implements: sample a prompt, score a completion.

A task knows nothing about HTTP, tokens or the rollout API; the runner (``base.py``) does
all of that. A new task is a subclass with two methods::

    class Reverse(Task):
        name = "reverse"

        def sample(self, rng: random.Random) -> Prompt:
            word = "".join(rng.choice("abc") for _ in range(4))
            return Prompt(text=f"reverse {word}:", answer=word[::-1])

        def score(self, prompt: Prompt, completion: str) -> float:
            return float(completion.strip() == prompt.answer)
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar


@dataclass(frozen=True)
class Prompt:
    """One prompt: raw ``text`` (tokenized as is) or chat ``messages`` (chat template applied).

    ``answer`` and ``meta`` carry whatever the scorer needs; the runner never reads them.
    """

    text: str = ""
    messages: tuple[dict[str, str], ...] = ()
    answer: str = ""
    meta: dict[str, str] = field(default_factory=dict)


class Task(ABC):
    """A source of prompts and a reward function.

    ``score`` may return any float; the runner sends it unchanged as the sequence's score.
    A completion cut off by ``max_tokens`` gets ``truncated_score`` without being scored
    when that is set (``None`` = score it like any other).
    """

    name: ClassVar[str] = "task"
    default_max_tokens: ClassVar[int] = 64
    truncated_score: ClassVar[float | None] = None
    correct_threshold: ClassVar[float] = 1.0

    def __init__(self, *, seed: int = 0, data_file: Path | None = None) -> None:
        self.seed = seed
        self.data_file = data_file

    @abstractmethod
    def sample(self, rng: random.Random) -> Prompt:
        """A training prompt, drawn with ``rng`` (seeded by the runner)."""

    @abstractmethod
    def score(self, prompt: Prompt, completion: str) -> float:
        """The reward of ``completion`` (decoded text, special tokens removed) for ``prompt``."""

    def eval_prompts(self, size: int) -> list[Prompt]:
        """The held-out prompts evaluation uses (default: ``size`` draws from a separate seed)."""
        rng = random.Random(f"eval-{self.seed}")
        return [self.sample(rng) for _ in range(size)]

    def is_correct(self, score: float) -> bool:
        """Whether a score counts as solved for pass@k and mean@k."""
        return score >= self.correct_threshold
