"""The environment runner: prompts -> inference -> scores -> rollout API, concurrently.

Protocol (Atropos environment side): ``POST /register-env`` until the API stops answering
"wait for trainer to start" (then ``grpo-env registered`` is printed: the supervisor's
readiness probe), ``GET /info`` for the batch shape, then per group: ``GET /status-env``
(pause while the API says the queue is full: bounded off-policy lag), ``/v1/completions``
on the inference server, score, build the group (``groups.py``), ``POST /scored_data``.
``max_concurrency`` workers run this loop side by side.

Failures never stop the environment. The inference server unreachable or answering 5xx:
retry with exponential backoff. Garbage answers, a scorer that raises, a group the API
rejects: logged with the reason, counted in ``env/errors``, next prompt. The API
unreachable: retry with backoff. Delivery is **at most once**: a group is re-posted only
when the API provably did not queue it (connection refused, 503, or rejected unread for
an unknown ``env_id``); when the connection drops after the request went out, the group
is counted in ``env/groups_unconfirmed`` and not re-sent, so the queue never holds a
duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from grpo_trainer.envs.evaluation import pass_and_mean_at_k
from grpo_trainer.envs.groups import Group, build_group
from grpo_trainer.envs.inference import (
    BadCompletion,
    InferenceUnavailable,
    Sample,
    SamplingRequest,
    complete,
)
from grpo_trainer.envs.recording import EnvRecorder
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.envs.stats import EnvStats, Reporter
from grpo_trainer.envs.task import Prompt, Task
from grpo_trainer.envs.tokenizer import PromptTokenizer
from grpo_trainer.live_edits import EditWatcher
from grpo_trainer.serve.settings import inference_headers

log = logging.getLogger("grpo_trainer.envs")

READY_LINE = "grpo-env registered"
ATROPOS_MAX_BATCHES_OFFPOLICY = 3
LONG_POLL = 1.0
"""Seconds ``/status-env`` may hold a full-queue answer (bounds how late a stop is seen)."""
NOT_DELIVERED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError)


class FatalEnvError(RuntimeError):
    """Something retrying cannot fix (e.g. the API refuses our registration)."""


@dataclass(frozen=True)
class Connection:
    """Where the environment talks to: the rollout API and the inference server."""

    api_url: str
    inference_url: str
    api_token: str | None = None


@dataclass
class Backoff:
    """Exponential backoff with a cap: 0.1 s, 0.2 s, ... up to ``cap``; reset on success."""

    first: float = 0.1
    cap: float = 5.0
    current: float = 0.0

    def next(self) -> float:
        self.current = self.first if self.current == 0 else min(self.current * 2, self.cap)
        return self.current

    def reset(self) -> None:
        self.current = 0.0


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
        self.settings = settings
        self.connection = connection
        self.tokenizer = tokenizer
        self.reporter = reporter or Reporter(None)
        self.status_poll = status_poll
        self.report_every = report_every
        self.stats = EnvStats()
        self.rng = random.Random(settings.seed)
        self.max_tokens = settings.max_tokens or task.default_max_tokens
        self.env_id: int | None = None
        self.current_step = 0
        self.served_version: int | None = None
        """The trainer step whose weights inference serves, as our API reports it (None:
        not reported, e.g. an Atropos API): between syncs it lags ``current_step``."""
        self.served_model: str | None = None
        """The name inference serves those weights under, as the trainer reported it with
        the version (a new adapter at each ``lora_only`` sync); else ``model_name``."""
        self.batch_size = 0
        self.max_token_len = settings.max_token_length
        self.edits = EditWatcher.for_role("env")
        self.recorder = EnvRecorder.for_env(
            settings.registered_name,
            tokenizer.decode,
            max_mb=settings.record_dropped_mb,
            every=settings.record_dropped_every,
            on_error=self.reporter.event,
        )
        self._reserved = 0
        self._paused = False
        self._posted_status: dict[str, Any] | None = None
        self._api_up = True
        self._inference_up = True
        self._last_report: dict[str, float] = {}
        self._stop = asyncio.Event()
        self._registering = asyncio.Lock()
        self._registrations = 0
        headers = (
            {"Authorization": f"Bearer {connection.api_token}"} if connection.api_token else {}
        )
        limits = httpx.Limits(max_connections=settings.max_concurrency + 4)
        self.api = httpx.AsyncClient(
            base_url=connection.api_url, headers=headers, timeout=30.0, limits=limits
        )
        self.inference = httpx.AsyncClient(
            base_url=connection.inference_url,
            headers=inference_headers(),
            timeout=600.0,
            limits=limits,
        )

    # ---- lifecycle -------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the runner to finish the groups in flight and return."""
        self._stop.set()

    async def run(self) -> EnvStats:
        """Register, then produce groups until stopped or ``max_groups`` are sent."""
        try:
            if await self.register() is None:
                return self.stats
            await self._read_info()
            tasks = [
                asyncio.create_task(self._worker()) for _ in range(self.settings.max_concurrency)
            ]
            background = [asyncio.create_task(self._report_loop())]
            if self.settings.eval_every > 0:
                background.append(asyncio.create_task(self._eval_loop()))
            await asyncio.gather(*tasks)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self._report()
            await self._disconnect()
        finally:
            await self.api.aclose()
            await self.inference.aclose()
            if self.recorder is not None:
                self.recorder.close()
            self.reporter.close()
        return self.stats

    async def _sleep(self, seconds: float) -> None:
        """Sleep that ends early when the runner is asked to stop."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    # ---- rollout API -----------------------------------------------------------------

    async def register(self) -> dict[str, Any] | None:
        """``POST /register-env``, retried while the trainer has not started or the API is
        down; the API's answer, or None when asked to stop first."""
        body = {
            "max_token_length": self.settings.max_token_length,
            "desired_name": self.settings.registered_name,
            "weight": self.settings.weight,
            "group_size": self.settings.group_size,
            "min_batch_allocation": self.settings.min_batch_allocation,
        }
        backoff = Backoff(cap=2.0)
        said_waiting = False
        while not self._stop.is_set():
            try:
                response = await self.api.post("/register-env", json=body)
            except httpx.TransportError as exc:
                self._api_down(exc)
                await self._sleep(backoff.next())
                continue
            self._api_back()
            if response.status_code >= 500:
                await self._sleep(backoff.next())
                continue
            if response.status_code >= 400:
                raise FatalEnvError(
                    f"the API refused /register-env ({response.status_code}): {response.text}"
                )
            try:
                answer = response.json()
            except ValueError:
                log.warning("/register-env answered non-JSON: %r", response.text[:200])
                await self._sleep(backoff.next())
                continue
            if answer.get("status") == "success":
                self.env_id = int(answer["env_id"])
                self._registrations += 1
                print(READY_LINE, flush=True)
                log.info("registered as env_id=%s (%s)", self.env_id, answer)
                return answer
            if not said_waiting:
                log.info("API says %r; retrying until the trainer starts", answer.get("status"))
                said_waiting = True
            await self._sleep(backoff.next())
        return None

    async def _reregister(self, reason: str, seen: int) -> None:
        """Register again (the API forgot us, e.g. after a reset); one worker does it.

        ``seen`` is the registration count when the refused request was sent: a request
        that raced an earlier re-registration does not register a second time. (Counted,
        not compared by ``env_id``: after a reset the API may hand out the same id again.)
        """
        async with self._registering:
            if self._registrations == seen:
                log.warning("registering again: %s", reason)
                await self.register()

    async def _read_info(self) -> None:
        backoff = Backoff()
        info: dict[str, Any] = {}
        while not self._stop.is_set():
            try:
                response = await self.api.get("/info")
                response.raise_for_status()
                info = response.json()
                break
            except (httpx.TransportError, httpx.HTTPStatusError, ValueError) as exc:
                log.warning("GET /info failed (%r); retrying", exc)
                await self._sleep(backoff.next())
        self.batch_size = int(info.get("batch_size", -1))
        max_len = int(info.get("max_token_len", -1))
        if max_len > 0:
            self.max_token_len = max_len

    async def _status(self, wait: float = 0.0) -> dict[str, Any] | None:
        """``GET /status-env`` (JSON body on a GET, as Atropos does); None on failure.

        ``wait``: our API holds a paused answer up to that long, until the queue has room.
        """
        seen = self._registrations
        try:
            response = await self.api.request(
                "GET", "/status-env", json={"env_id": self.env_id}, params={"wait": wait}
            )
        except httpx.TransportError as exc:
            self._api_down(exc)
            return None
        self._api_back()
        if response.status_code in (400, 404, 422) and "env" in response.text:
            await self._reregister(f"/status-env answered {response.status_code}", seen)
            return None
        if response.status_code != 200:
            return None
        status = response.json()
        self._take_versions(status)
        return status

    def _take_versions(self, status: dict[str, Any]) -> None:
        """The step and the served version an API status carries."""
        self.current_step = int(status.get("current_step", self.current_step))
        served = status.get("served_version")
        self.served_version = None if served is None else int(served)
        model = status.get("served_model")
        self.served_model = model if isinstance(model, str) and model else None

    def _policy_version(self) -> int:
        """The version a group sampled now is tagged with: the weights inference serves.
        Only the trainer's sync moves them, so with ``sync_every`` > 1 they trail the step;
        an API that does not report them (Atropos) leaves the step."""
        if self.served_version is None:
            return self.current_step
        return min(self.current_step, self.served_version)

    def _queue_full(self, status: dict[str, Any]) -> bool:
        """Whether the queue is at its off-policy bound.

        Our API says so (``pause``); with an Atropos API, compute it the Atropos way:
        ``queue_size`` groups of our size against ``ATROPOS_MAX_BATCHES_OFFPOLICY`` batches.
        """
        if "pause" in status:
            return bool(status["pause"])
        if self.batch_size <= 0:
            return False
        queued = int(status.get("queue_size", 0)) * self.settings.group_size
        return queued >= ATROPOS_MAX_BATCHES_OFFPOLICY * self.batch_size

    async def _wait_for_room(self) -> tuple[int, str] | None:
        """Ask ``/status-env`` until the queue has room; returns the version to tag the
        group with (``_policy_version``) and the model to ask for it, read together so a
        sync between two groups never mixes them (None: stop).

        Our API answers a full queue once it has room (long poll, ``LONG_POLL`` at most); an
        API that answers at once (Atropos) is polled every ``status_poll`` seconds. The
        status our API returned with the last post (``_post``) is used once instead of a
        request when it shows room: one request less per group.
        """
        posted, self._posted_status = self._posted_status, None
        if posted is not None and not self._queue_full(posted):
            self._note_pause(False, posted)
            return self._policy_version(), self._model()
        backoff = Backoff(first=self.status_poll, cap=5.0)
        while not self._stop.is_set():
            asked = time.monotonic()
            status = await self._status(wait=LONG_POLL)
            if status is not None:
                full = self._queue_full(status)
                self._note_pause(full, status)
                if not full:
                    return self._policy_version(), self._model()
                if time.monotonic() - asked >= LONG_POLL:
                    continue
            await self._sleep(self.status_poll if status is not None else backoff.next())
        return None

    def _note_pause(self, full: bool, status: dict[str, Any]) -> None:
        """Log each change between producing and pausing for back-pressure."""
        if full == self._paused:
            return
        self._paused = full
        if full:
            log.info("queue full (%s); pausing production", _queue_text(status))
        else:
            log.info("queue has room (%s); producing", _queue_text(status))

    async def _post(self, group: Group) -> bool:
        """``POST /scored_data``, at most once; True when queued or possibly queued."""
        backoff = Backoff()
        registered_again = False
        while True:
            seen = self._registrations
            try:
                response = await self.api.post(
                    "/scored_data",
                    json=group.payload(self.env_id, self.settings.registered_name),
                    params={"env_status": "true"},
                )
            except NOT_DELIVERED as exc:
                if self._stop.is_set():
                    self.stats.error("api_unreachable", f"group not sent at shutdown: {exc!r}")
                    return False
                self._api_down(exc)
                await self._sleep(backoff.next())
                continue
            except httpx.TransportError as exc:
                self._api_down(exc)
                self.stats.count("groups_unconfirmed")
                self.stats.error("api_connection_lost", f"group may or may not be queued: {exc!r}")
                return True
            self._api_back()
            if response.status_code == 200:
                self.stats.count("groups_sent")
                self._keep_posted_status(response)
                return True
            if response.status_code == 503:
                await self._sleep(backoff.next())
                continue
            forgotten = response.status_code in (400, 404, 422) and "env_id" in response.text
            if forgotten and not registered_again:
                registered_again = True
                await self._reregister(f"/scored_data answered {response.status_code}", seen)
                continue
            self.stats.error(
                "api_rejected",
                f"/scored_data answered {response.status_code}: {response.text[:300]}",
            )
            return False

    def _keep_posted_status(self, response: httpx.Response) -> None:
        """Keep the queue status our API answers with a post (absent from Atropos's)."""
        try:
            status = response.json().get("env_status")
        except (ValueError, AttributeError):
            return
        if isinstance(status, dict):
            self._take_versions(status)
            self._posted_status = status

    def _api_down(self, exc: Exception) -> None:
        """Log the start of an API outage once; requests retry with backoff meanwhile."""
        if self._api_up:
            self._api_up = False
            log.warning("API unreachable at %s (%r); retrying with backoff",
                        self.connection.api_url, exc)  # fmt: skip

    def _api_back(self) -> None:
        if not self._api_up:
            self._api_up = True
            log.info("API reachable again at %s", self.connection.api_url)

    async def _disconnect(self) -> None:
        if self.env_id is None:
            return
        try:
            await self.api.post("/disconnect-env", json={"env_id": self.env_id})
        except httpx.TransportError:
            log.info("API unreachable at shutdown; not disconnected")

    # ---- producing groups ------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: chat template for ``messages``, plain text otherwise."""
        if prompt.messages:
            return self.tokenizer.encode(self.tokenizer.render_chat(list(prompt.messages)))
        return self.tokenizer.encode(prompt.text)

    def _model(self) -> str:
        """The ``model`` to ask inference for: what the trainer last reported, else ours."""
        return self.served_model or self.settings.model_name

    def _sampling(self, n: int, model: str | None = None) -> SamplingRequest:
        return SamplingRequest(
            model=model or self._model(),
            n=n,
            max_tokens=self.max_tokens,
            temperature=self.settings.temperature,
            top_p=self.settings.top_p,
            ignore_eos=self.settings.ignore_eos,
            copies=self.settings.prompt_copies,
        )

    def _take_edits(self) -> None:
        """The run's live edits (``grpo_trainer.live_edits``) from the next group on; the
        supervisor validated them with these settings' own model."""
        changed = self.edits.poll()
        if not changed:
            return
        new = {k: v for k, v in changed.items() if getattr(self.settings, k) != v}
        if new:
            changes = ", ".join(f"{k} {getattr(self.settings, k)} -> {v}" for k, v in new.items())
            self.settings = self.settings.model_copy(update=new)
            self.reporter.event(f"live edit from the next group: {changes}")

    def _score(self, prompt: Prompt, samples: list[Sample]) -> list[float] | None:
        """Score every sample; None (error counted) when the scorer raises or returns junk."""
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

    def _reserve(self) -> bool:
        """Claim one of the ``max_groups`` slots before generating (always true unlimited)."""
        limit = self.settings.max_groups
        if limit and self._reserved >= limit:
            return False
        self._reserved += 1
        return True

    async def _worker(self) -> None:
        """Produce groups until stopped; an unexpected error costs one group, not the worker."""
        inference_backoff = Backoff(cap=1.0)
        while not self._stop.is_set():
            try:
                if not await self._produce_one(inference_backoff):
                    return
            except Exception as exc:  # a bug or a surprise must not end production
                self.stats.error("unexpected", f"{type(exc).__name__}: {exc}")
                log.exception("unexpected error while producing a group")
                await self._sleep(1.0)

    async def _produce_one(self, inference_backoff: Backoff) -> bool:
        """One prompt through generation, scoring and posting; False when done."""
        if not self._reserve():
            return False
        posted = False
        try:
            posted = await self._attempt_group(inference_backoff)
        finally:
            if not posted:
                self._reserved -= 1
        return not self._stop.is_set()

    async def _attempt_group(self, inference_backoff: Backoff) -> bool:
        """Generate, score and post one group; True once it was posted (or may have been)."""
        started = time.perf_counter()
        room = await self._wait_for_room()
        if room is None:
            return False
        version, model = room
        asked = time.perf_counter()
        self.stats.timed("room", asked - started)
        self._span("room", asked - started)
        self._take_edits()
        sampling = self._sampling(self.settings.group_size, model)
        prompt = self.task.sample(self.rng)
        prompt_ids = self.encode(prompt)
        generating = time.time()
        try:
            samples = await complete(self.inference, prompt_ids, sampling)
        except InferenceUnavailable as exc:
            if exc.status is not None:
                self.stats.error("inference_error", str(exc))
            elif self._inference_up:
                self._inference_up = False
                log.warning("%s; retrying with backoff", exc)
            await self._sleep(inference_backoff.next())
            return False
        except BadCompletion as exc:
            self.stats.error("bad_completion", str(exc))
            return False
        if not self._inference_up:
            self._inference_up = True
            log.info("inference server reachable again at %s", self.connection.inference_url)
        inference_backoff.reset()
        self.stats.timed("inference", time.perf_counter() - asked)
        if self.recorder is not None:
            self.recorder.timeline.add("generate", generating, time.time())
        scores = self._score(prompt, samples)
        if scores is None:
            return False
        self.stats.scored(scores)
        group = build_group(
            prompt_ids, samples, scores, temperature=sampling.temperature,
            policy_version=version,
        )  # fmt: skip
        if group.longest > self.max_token_len:
            self.stats.count("groups_dropped_too_long")
            log.info("dropped a group: %d tokens > max_token_len %d", group.longest,
                     self.max_token_len)  # fmt: skip
            return False
        if group.equal_scores:
            self.stats.count("groups_dropped_equal_scores")
            if self.recorder is not None:
                self.recorder.dropped(
                    group,
                    step=self.current_step + 1,
                    env=self.settings.registered_name,
                    env_id=self.env_id,
                    lag=self.current_step - version,
                )
            return False
        posting = time.perf_counter()
        posted = await self._post(group)
        self.stats.timed("post", time.perf_counter() - posting)
        return posted

    # ---- reporting and evaluation ----------------------------------------------------

    def _span(self, phase: str, seconds: float) -> None:
        """A timeline span of ``phase`` that ended now (only waits longer than 1 ms)."""
        if self.recorder is not None and seconds > 1e-3:
            now = time.time()
            self.recorder.timeline.add(phase, now - seconds, now)

    def _report(self) -> None:
        self._last_report = self.stats.snapshot()
        self.reporter.metrics(self.current_step, self._last_report)
        if self.recorder is not None:
            self.recorder.flush(self.current_step + 1)

    async def _report_loop(self) -> None:
        """Report every ``report_every`` seconds while anything changed."""
        while True:
            await asyncio.sleep(self.report_every)
            if self.stats.changed_since(self._last_report):
                self._report()

    async def _eval_loop(self) -> None:
        every = self.settings.eval_every
        due = 0
        while True:
            if self.current_step >= due:
                step = self.current_step
                try:
                    await self.evaluate(step)
                except Exception as exc:  # evaluation must never end production
                    self.stats.error("eval_failed", f"{type(exc).__name__}: {exc}")
                due = (step // every + 1) * every
            await asyncio.sleep(self.status_poll)

    async def evaluate(self, step: int) -> dict[str, float]:
        """pass@k and mean@k (``evaluation.py``) over the held-out prompts, as metrics."""
        k = self.settings.eval_k
        prompts = self.task.eval_prompts(self.settings.eval_size)
        limit = asyncio.Semaphore(self.settings.max_concurrency)

        async def one(prompt: Prompt) -> list[bool] | None:
            async with limit:
                try:
                    samples = await complete(self.inference, self.encode(prompt), self._sampling(k))
                except (InferenceUnavailable, BadCompletion) as exc:
                    self.stats.error("eval_inference", str(exc))
                    return None
            scores = self._score(prompt, samples)
            return None if scores is None else [self.task.is_correct(s) for s in scores]

        results = [r for r in await asyncio.gather(*(one(p) for p in prompts)) if r is not None]
        if not results:
            log.warning("evaluation at step %d produced no results", step)
            return {}
        data = pass_and_mean_at_k(results, k)
        self.reporter.metrics(step, data)
        return data


def _queue_text(status: dict[str, Any]) -> str:
    if status.get("inference_held"):
        return "inference restarted: waiting for the trainer's weights"
    if "queued_batches" in status:
        return f"{status['queued_batches']:.2f} batches queued"
    return f"{status.get('queue_size')} groups queued"
