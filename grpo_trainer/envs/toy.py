"""The offline toy task: repeat the digit named in the prompt.

Prompt ``"repeat 7:"``; the completion is scored by the fraction of its first
``LENGTH`` characters equal to the digit (partial credit, so every group carries signal).
A random tiny model (44-token character vocabulary) starts near 1/44 per position, well
under 0.2, and plain GRPO lifts it past 0.8 in about a hundred steps (see
``benchmarks/toy_learnability.py`` and ``docs/environments.md``). Needs no data and no
network: the prompts come from the seed.
"""

from __future__ import annotations

import random

from grpo_trainer.envs.task import Prompt, Task

DIGITS = "0123456789"
LENGTH = 6


class RepeatDigit(Task):
    """``repeat D:`` -> ``DDDDDD``; reward = matching characters / ``LENGTH``."""

    name = "toy"
    default_max_tokens = LENGTH

    def sample(self, rng: random.Random) -> Prompt:
        digit = rng.choice(DIGITS)
        return Prompt(text=f"repeat {digit}:", answer=digit)

    def score(self, prompt: Prompt, completion: str) -> float:
        return sum(char == prompt.answer for char in completion[:LENGTH]) / LENGTH

    def eval_prompts(self, size: int) -> list[Prompt]:
        """Every digit once (the whole prompt space is ten prompts), up to ``size``."""
        return [Prompt(text=f"repeat {d}:", answer=d) for d in DIGITS[:size]]


if __name__ == "__main__":
    from grpo_trainer.envs.cli import main

    main(RepeatDigit)
