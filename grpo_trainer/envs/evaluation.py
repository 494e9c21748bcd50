"""Evaluation: pass@k and mean@k, as the offline grail trainer reports them.

For each held-out prompt, k samples are drawn and each is judged correct or not
(``Task.is_correct``). pass@k is the fraction of prompts with at least one correct
sample; mean@k is the mean, over prompts, of the fraction of correct samples (an
estimate of pass@1 from k draws). :class:`Evaluator` runs it every ``eval_every``
trainer steps, beside production; a failed evaluation is counted, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from grpo_trainer.envs.backpressure import QueueRoom
from grpo_trainer.envs.inference import BadCompletion, InferenceUnavailable
from grpo_trainer.envs.sampling import Sampling
from grpo_trainer.envs.scoring import Scorer
from grpo_trainer.envs.stats import EnvStats, Reporter
from grpo_trainer.envs.task import Prompt

log = logging.getLogger("grpo_trainer.envs")


def pass_and_mean_at_k(correct: Sequence[Sequence[bool]], k: int) -> dict[str, float]:
    """``{"eval/pass@k": ..., "eval/mean@k": ...}`` for one row of k judgements per prompt."""
    if not correct:
        raise ValueError("no evaluated prompts")
    return {
        f"eval/pass@{k}": sum(any(row) for row in correct) / len(correct),
        f"eval/mean@{k}": sum(sum(row) / len(row) for row in correct) / len(correct),
    }


class Evaluator:
    """Evaluates the served policy on the task's held-out prompts, as metrics."""

    def __init__(
        self,
        sampling: Sampling,
        scorer: Scorer,
        room: QueueRoom,
        stats: EnvStats,
        reporter: Reporter,
    ) -> None:
        self.sampling = sampling
        self.room = room
        self.scorer = scorer
        self.stats = stats
        self.reporter = reporter

    async def loop(self, poll: float) -> None:
        """At step 0 and every ``eval_every`` trainer steps after (the step the API
        reports), until cancelled."""
        every = self.sampling.settings.eval_every
        api = self.room.api
        due = 0
        while True:
            if api.current_step >= due:
                step = api.current_step
                try:
                    await self.evaluate(step)
                except Exception as exc:  # evaluation must never end production
                    self.stats.error("eval_failed", f"{type(exc).__name__}: {exc}")
                due = (step // every + 1) * every
            await asyncio.sleep(poll)

    async def evaluate(self, step: int) -> dict[str, float]:
        """pass@k and mean@k over the held-out prompts, sampled from the policy served now,
        reported for ``step``."""
        settings, sampling = self.sampling.settings, self.sampling
        k = settings.eval_k
        request = sampling.request(k, self.room.model())
        prompts = self.scorer.task.eval_prompts(settings.eval_size)
        limit = asyncio.Semaphore(settings.max_concurrency)

        async def one(prompt: Prompt) -> list[bool] | None:
            async with limit:
                try:
                    (samples,) = await sampling.sample([sampling.encode(prompt)], request)
                except (InferenceUnavailable, BadCompletion) as exc:
                    self.stats.error("eval_inference", str(exc))
                    return None
            scores = self.scorer.score(prompt, samples)
            return None if scores is None else [self.scorer.task.is_correct(s) for s in scores]

        results = [r for r in await asyncio.gather(*(one(p) for p in prompts)) if r is not None]
        if not results:
            log.warning("evaluation at step %d produced no results", step)
            return {}
        data = pass_and_mean_at_k(results, k)
        self.reporter.metrics(step, data)
        return data
