"""The environment runner: prompts -> inference -> scores -> rollout API, concurrently.

Each job has its own module; the runner puts them together. The rollout API
(``rollout_api.py``: registration, ``/status-env``, ``/scored_data``, at-most-once
delivery), back-pressure (``backpressure.py``: sample only while the queue has room),
sampling (``sampling.py``: tokens, sampling settings, live edits), scoring
(``scoring.py``), the group's shape and drop rules (``groups.py``) and evaluation
(``evaluation.py``). ``max_concurrency`` workers run the loop side by side: wait for room,
sample a prompt, ask inference for ``group_size`` completions, score, build, post.

Failures of the servers never stop the environment. The inference server unreachable or
answering 5xx: retry with exponential backoff. Garbage answers, a group the API rejects:
logged with the reason, counted in ``env/errors``, next prompt. The API unreachable: retry
with backoff. Failures of the task's code (``sample``, ``score``, or anything else that
raises in the loop) cost their group too, and are reported and bounded
(``task_errors.py``): after ``max_consecutive_errors`` in a row the runner stops and
``run`` raises :class:`TaskFailing`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass

import httpx

from grpo_trainer.envs.backpressure import QueueRoom
from grpo_trainer.envs.evaluation import Evaluator
from grpo_trainer.envs.groups import Group, build_group
from grpo_trainer.envs.inference import BadCompletion, InferenceUnavailable, Sample
from grpo_trainer.envs.recording import EnvRecorder
from grpo_trainer.envs.rollout_api import RolloutApi
from grpo_trainer.envs.sampling import Sampling
from grpo_trainer.envs.scoring import Scorer
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.envs.stats import EnvStats, Reporter
from grpo_trainer.envs.task import Prompt, Task
from grpo_trainer.envs.task_errors import TaskErrors, TaskFailing
from grpo_trainer.envs.tokenizer import PromptTokenizer
from grpo_trainer.envs.waits import Backoff, StopFlag
from grpo_trainer.serve.settings import inference_headers

log = logging.getLogger("grpo_trainer.envs")


@dataclass(frozen=True)
class Connection:
    """Where the environment talks to: the rollout API and the inference server."""

    api_url: str
    inference_url: str
    api_token: str | None = None


class EnvRunner:
    """Runs one task against the API and the inference server until stopped."""

    def __init__(
        self,
        task: Task,
        settings: EnvSettings,
        connection: Connection,
        tokenizer: PromptTokenizer,
        *,
        reporter: Reporter | None = None,
        status_poll: float = 0.25,
        report_every: float = 2.0,
    ) -> None:
        self.task = task
        self.connection = connection
        self.reporter = reporter or Reporter(None)
        self.report_every = report_every
        self.stats = EnvStats()
        self.rng = random.Random(settings.seed)
        self.stopping = StopFlag()
        headers = (
            {"Authorization": f"Bearer {connection.api_token}"} if connection.api_token else {}
        )
        limits = httpx.Limits(max_connections=settings.max_concurrency + 4)
        api = httpx.AsyncClient(
            base_url=connection.api_url, headers=headers, timeout=30.0, limits=limits
        )
        inference = httpx.AsyncClient(
            base_url=connection.inference_url,
            headers=inference_headers(),
            timeout=600.0,
            limits=limits,
        )
        self.api = RolloutApi(api, settings, self.stats, self.stopping)
        self.room = QueueRoom(self.api, settings.model_name, poll=status_poll)
        max_tokens = settings.max_tokens or task.default_max_tokens
        self.sampling = Sampling(settings, tokenizer, inference, max_tokens, self.reporter)
        self.errors = TaskErrors(settings.max_consecutive_errors, self.stats, self.reporter)
        self.scorer = Scorer(task, tokenizer, self.errors)
        self.evaluator = Evaluator(self.sampling, self.scorer, self.room, self.stats, self.reporter)
        self.recorder = EnvRecorder.for_env(
            settings.registered_name,
            tokenizer.decode,
            max_mb=settings.record_dropped_mb,
            every=settings.record_dropped_every,
            on_error=self.reporter.event,
        )
        self._reserved = 0
        self._inference_up = True
        self._last_report: dict[str, float] = {}

    @property
    def settings(self) -> EnvSettings:
        """The settings in force (live edits included)."""
        return self.sampling.settings

    # ---- lifecycle -------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the runner to finish the groups in flight and return."""
        self.stopping.set()

    async def run(self) -> EnvStats:
        """Register, then produce groups until stopped or ``max_groups`` are sent; raises
        :class:`TaskFailing` once the task failed ``max_consecutive_errors`` times in a row."""
        try:
            if await self.api.register() is None:
                return self.stats
            await self.api.read_info()
            workers = [asyncio.create_task(self._worker()) for _ in range(self.settings.workers)]
            background = [asyncio.create_task(self._report_loop())]
            if self.settings.eval_every > 0:
                background.append(asyncio.create_task(self.evaluator.loop(self.room.poll)))
            await asyncio.gather(*workers)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self._report()
            await self.api.disconnect()
        finally:
            await self.aclose()
            if self.recorder is not None:
                self.recorder.close()
            self.reporter.close()
        if self.errors.exhausted:
            raise TaskFailing(self.errors.verdict())
        return self.stats

    async def aclose(self) -> None:
        """Close the connections to the API and the inference server."""
        await self.api.http.aclose()
        await self.sampling.inference.aclose()

    # ---- producing groups ------------------------------------------------------------

    def _reserve(self, wanted: int) -> int:
        """Claim up to ``wanted`` of the ``max_groups`` slots before generating (all of
        them when unlimited); 0 once every slot is taken."""
        limit = self.settings.max_groups
        granted = wanted if not limit else max(0, min(wanted, limit - self._reserved))
        self._reserved += granted
        return granted

    async def _worker(self) -> None:
        """Produce groups until stopped; an unexpected error costs its groups, not the worker."""
        inference_backoff = Backoff(cap=1.0)
        while not self.stopping.is_set():
            try:
                if not await self._produce(inference_backoff):
                    return
            except Exception as exc:  # a bug or a surprise costs its groups, counted
                self._task_failed("unexpected", "the environment's loop", exc)
                await self.stopping.sleep(1.0)

    def _task_failed(self, kind: str, where: str, error: BaseException | str) -> None:
        """Count a failure of the task's code; stop once there were too many in a row."""
        self.errors.failed(kind, where, error)
        self._stop_if_exhausted()

    def _stop_if_exhausted(self) -> None:
        if self.errors.exhausted:
            self.stopping.set()

    async def _produce(self, inference_backoff: Backoff) -> bool:
        """One request's prompts through generation, scoring and posting; False when done."""
        reserved = self._reserve(self.settings.groups_per_request)
        if not reserved:
            return False
        posted = 0
        try:
            posted = await self._attempt_groups(reserved, inference_backoff)
        finally:
            self._reserved -= reserved - posted
        return not self.stopping.is_set()

    async def _attempt_groups(self, count: int, inference_backoff: Backoff) -> int:
        """Generate ``count`` groups in one request, score and post each; how many were
        posted (or may have been)."""
        started = time.perf_counter()
        room = await self.room.wait()
        if room is None:
            return 0
        version, model = room
        if self.stopping.is_set():
            return 0  # no new group once stopping (the task failed too often, say)
        asked = time.perf_counter()
        self.stats.timed("room", asked - started)
        self._span("room", asked - started)
        self.sampling.take_edits()
        sampling = self.sampling.request(self.settings.group_size, model)
        prompts: list[tuple[Prompt, list[int]]] = []
        for _ in range(count):
            try:
                prompt = self.task.sample(self.rng)
            except Exception as exc:  # a user's code may raise anything
                self._task_failed("sample_raised", "sample()", exc)
                continue
            prompts.append((prompt, self.sampling.encode(prompt)))
        if not prompts:
            return 0
        generating = time.time()
        try:
            groups = await self.sampling.sample([ids for _, ids in prompts], sampling)
        except InferenceUnavailable as exc:
            if exc.status is not None:
                self.stats.error("inference_error", str(exc))
            elif self._inference_up:
                self._inference_up = False
                log.warning("%s; retrying with backoff", exc)
            await self.stopping.sleep(inference_backoff.next())
            return 0
        except BadCompletion as exc:
            self.stats.error("bad_completion", str(exc))
            return 0
        if not self._inference_up:
            self._inference_up = True
            log.info("inference server reachable again at %s", self.connection.inference_url)
        inference_backoff.reset()
        self.stats.timed("inference", time.perf_counter() - asked)
        if self.recorder is not None:
            self.recorder.timeline.add("generate", generating, time.time())
        scored = [
            self._scored_group(prompt, prompt_ids, samples, sampling.temperature, version)
            for (prompt, prompt_ids), samples in zip(prompts, groups, strict=True)
        ]
        sending = [group for group in scored if group is not None]
        if not sending:
            return 0
        posting = time.perf_counter()
        posted = await self.room.post(sending)
        self.stats.timed("post", time.perf_counter() - posting)
        return len(sending) if posted else 0

    def _scored_group(
        self,
        prompt: Prompt,
        prompt_ids: list[int],
        samples: list[Sample],
        temperature: float,
        version: int,
    ) -> Group | None:
        """Score ``samples`` and build their group; None when a drop rule (or the task's
        code) costs it."""
        scores = self.scorer.score(prompt, samples)
        if scores is None:
            self._stop_if_exhausted()
            return None
        self.errors.succeeded()
        self.stats.scored(scores)
        group = build_group(
            prompt_ids, samples, scores, temperature=temperature, policy_version=version
        )
        max_token_len = self.api.max_token_len
        if group.longest > max_token_len:
            self.stats.count("groups_dropped_too_long")
            log.info("dropped a group: %d tokens > max_token_len %d", group.longest,
                     max_token_len)  # fmt: skip
            return None
        if group.equal_scores:
            self.stats.count("groups_dropped_equal_scores")
            if self.recorder is not None:
                step = self.api.current_step
                self.recorder.dropped(
                    group,
                    step=step + 1,
                    env=self.settings.registered_name,
                    env_id=self.api.env_id,
                    lag=step - version,
                )
            return None
        return group

    # ---- reporting -------------------------------------------------------------------

    def _span(self, phase: str, seconds: float) -> None:
        """A timeline span of ``phase`` that ended now (only waits longer than 1 ms)."""
        if self.recorder is not None and seconds > 1e-3:
            now = time.time()
            self.recorder.timeline.add(phase, now - seconds, now)

    def _report(self) -> None:
        self._last_report = self.stats.snapshot()
        self.reporter.metrics(self.api.current_step, self._last_report | self.errors.rates())
        if self.recorder is not None:
            self.recorder.flush(self.api.current_step + 1)

    async def _report_loop(self) -> None:
        """Report every ``report_every`` seconds while anything changed."""
        while True:
            await asyncio.sleep(self.report_every)
            if self.stats.changed_since(self._last_report):
                self._report()
