"""pass@k and mean@k, as the offline grail trainer reports them.

For each held-out prompt, k samples are drawn and each is judged correct or not
(``Task.is_correct``). pass@k is the fraction of prompts with at least one correct
sample; mean@k is the mean, over prompts, of the fraction of correct samples (an
estimate of pass@1 from k draws).
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_and_mean_at_k(correct: Sequence[Sequence[bool]], k: int) -> dict[str, float]:
    """``{"eval/pass@k": ..., "eval/mean@k": ...}`` for one row of k judgements per prompt."""
    if not correct:
        raise ValueError("no evaluated prompts")
    return {
        f"eval/pass@{k}": sum(any(row) for row in correct) / len(correct),
        f"eval/mean@{k}": sum(sum(row) / len(row) for row in correct) / len(correct),
    }
