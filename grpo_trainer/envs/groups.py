"""Turning one prompt's samples and scores into an Atropos ``ScoredData`` group.

Alignment, position by position, for sequence i of a prompt of length P::

    tokens[i]             = prompt_ids + completion_ids
    masks[i]              = [-100] * P + completion_ids
    inference_logprobs[i] = [1.0]  * P + completion_logprobs

The drop rules (each counted in metrics and logged, never silent):

- **equal scores**: a group whose scores are all equal carries no GRPO signal (every
  advantage is zero), so it is not sent (``env/groups_dropped_equal_scores``);
- **too long**: a group with any sequence longer than the API's ``max_token_len`` is not
  sent (``env/groups_dropped_too_long``); sequences are never truncated, because a cut
  sequence would be trained on a completion the policy did not finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_trainer.envs.inference import Sample

PROMPT_MASK = -100
PROMPT_LOGPROB = 1.0


@dataclass(frozen=True)
class Group:
    """A scored group ready to post, with the numbers the drop rules look at."""

    tokens: list[list[int]]
    masks: list[list[int]]
    inference_logprobs: list[list[float]]
    scores: list[float]
    temperature: float
    policy_version: int

    @property
    def equal_scores(self) -> bool:
        """True when every score is the same (no GRPO signal)."""
        return len(set(self.scores)) <= 1

    @property
    def longest(self) -> int:
        """Length of the longest sequence, prompt included."""
        return max(len(seq) for seq in self.tokens)

    def payload(self, env_id: int | None, env_name: str | None = None) -> dict[str, Any]:
        """The ``POST /scored_data`` body (Atropos field names, plus ``policy_version`` and,
        given, ``env_name``: extensions an Atropos API ignores, by which our trainer tells
        the environments apart in its metrics and records)."""
        body = {
            "tokens": self.tokens,
            "masks": self.masks,
            "scores": self.scores,
            "inference_logprobs": self.inference_logprobs,
            "generation_params": {"temperature": self.temperature},
            "policy_version": self.policy_version,
            "env_id": env_id,
        }
        if env_name:
            body["env_name"] = env_name
        return body


def build_group(
    prompt_ids: list[int],
    samples: list[Sample],
    scores: list[float],
    *,
    temperature: float,
    policy_version: int,
) -> Group:
    """Align prompt and completions into tokens, masks and logprobs (see module doc)."""
    if len(samples) != len(scores):
        raise ValueError(f"{len(samples)} samples but {len(scores)} scores")
    prompt_len = len(prompt_ids)
    return Group(
        tokens=[prompt_ids + s.token_ids for s in samples],
        masks=[[PROMPT_MASK] * prompt_len + s.token_ids for s in samples],
        inference_logprobs=[[PROMPT_LOGPROB] * prompt_len + s.logprobs for s in samples],
        scores=[float(score) for score in scores],
        temperature=temperature,
        policy_version=policy_version,
    )
