"""The rollout API's rules and state, callable without HTTP: ``RolloutService``.

Each operation is one method; the app's routes only parse a request, call it and turn a
``Refused`` into the 4xx answer. Each method's database work is one function run on the
store's thread (``StoreRunner``), so what it reads and writes is one consistent step.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import uuid
from typing import Any

from grpo_trainer.api.prometheus import render_metrics
from grpo_trainer.api.runner import StoreRunner
from grpo_trainer.api.schemas import GROUP, GROUP_LIST, RegisterEnv, Registration, ScoredData
from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.api.store import Delivery
from grpo_trainer.api.validation import Refused, check_groups, parse, refused_groups
from grpo_trainer.live_edits import EditWatcher
from grpo_trainer.run_notices import INFERENCE_FILE, InferenceLife, NoticeWatcher

log = logging.getLogger("grpo_trainer.api")

WAIT = {"status": "wait for trainer to start"}
EMPTY_EXAMPLE = {
    "tokens": [],
    "masks": [],
    "scores": [],
    "advantages": [],
    "ref_logprobs": [],
    "generation_params": [],
    "inference_logprobs": [],
    "messages": [],
    "images": [],
}
"""``/latest_example`` before any group arrived (Atropos's answer)."""


class RolloutService:
    """The queue's operations over ``runner``'s store, under ``settings`` and live edits."""

    def __init__(
        self, settings: ApiSettings, runner: StoreRunner, edits: EditWatcher | None = None
    ) -> None:
        self.settings = settings
        self.runner = runner
        self.store = runner.store
        self.edits = EditWatcher.for_role("api") if edits is None else edits
        self.inference = NoticeWatcher.in_run(INFERENCE_FILE, InferenceLife)
        """The supervisor's word on the inference server (``grpo_trainer.run_notices``)."""
        self.latest: bytes | None = None
        """The last group queued, as served (``/latest_example``)."""

    def _registration(self) -> dict[str, Any]:
        """The trainer's registration; 409 before the trainer registered."""
        reg = self.store.registration()
        if reg is None:
            raise Refused(409, "no trainer registered yet: the trainer must POST /register")
        return reg

    async def register(self, body: Registration) -> int:
        """Record the trainer's batch shape; a fresh uuid. 422 when an environment's group
        size does not divide ``batch_size`` (batches hold whole groups). A restarted trainer
        (a new ``trainer_id``) gets the batches its predecessor leased back in the queue."""

        def write() -> int:
            bad = [e for e in self.store.envs() if body.batch_size % e.group_size]
            if bad:
                names = ", ".join(f"{e.real_name} (group_size {e.group_size})" for e in bad)
                raise Refused(
                    422,
                    f"batch_size {body.batch_size} is not a multiple of the group size of {names}",
                )
            return self.store.register_trainer(body.model_dump())

        requeued = await self.runner.call(write)
        log.info("trainer registered: batch_size %d, step %d", body.batch_size, body.starting_step)
        if requeued:
            log.info(
                "a new trainer: the %d batches leased to the one before and never "
                "acknowledged are queued again",
                requeued,
            )
            self.runner.changed()
        return uuid.uuid4().int

    async def register_env(self, body: RegisterEnv) -> dict[str, Any]:
        """Register an environment once the trainer asked for its first batch (before:
        ``WAIT``). 422 when its groups could never fill a batch exactly, exceed
        ``max_group_size``, or its ``min_batch_allocation`` overbooks the batch."""

        def write() -> dict[str, Any]:
            store, settings = self.store, self.settings
            reg = store.registration()
            if reg is None or not store.started():
                return WAIT
            if reg["batch_size"] % body.group_size:
                raise Refused(
                    422,
                    f"batch_size {reg['batch_size']} (from the trainer) is not a multiple of "
                    f"group_size {body.group_size} (from {body.desired_name!r}): batches hold "
                    "whole groups, so this environment's groups could never fill one exactly",
                )
            if body.group_size > settings.max_group_size:
                raise Refused(
                    422,
                    f"group_size {body.group_size} exceeds max_group_size "
                    f"{settings.max_group_size}",
                )
            if body.min_batch_allocation:
                taken = sum(e.min_batch_allocation or 0 for e in store.envs() if e.connected)
                if taken + body.min_batch_allocation > 1:
                    raise Refused(
                        422,
                        f"min_batch_allocation {body.min_batch_allocation} plus the {taken} "
                        "already reserved by connected environments exceeds 1",
                    )
            env = store.add_env(
                body.desired_name,
                body.weight,
                body.group_size,
                body.max_token_length,
                body.min_batch_allocation,
            )
            log.info("env registered: %s (env_id %d)", env.real_name, env.env_id)
            return {
                "status": "success",
                "env_id": env.env_id,
                "wandb_name": env.real_name,
                "checkpoint_dir": reg["checkpoint_dir"],
                "starting_step": store.current_step(),
                "checkpoint_interval": reg["save_checkpoint_interval"],
                "num_steps": reg["num_steps"],
            }

        return await self.runner.call(write)

    async def disconnect_env(self, env_id: int) -> None:
        """Mark an environment disconnected; 404 for an unknown ``env_id``."""

        def write() -> None:
            if self.store.env(env_id) is None:
                raise Refused(404, f"env_id {env_id} is not registered")
            self.store.disconnect_env(env_id)

        await self.runner.call(write)

    async def registration(self) -> dict[str, Any] | None:
        """The trainer's registration (None before it registered)."""
        return await self.runner.call(self.store.registration)

    async def ingest(self, body: bytes, *, many: bool) -> list[ScoredData]:
        """Queue the group (or, ``many``, the list of groups) in ``body``, all or none.

        409 before the trainer registered; 400/422 for a body the queue cannot take,
        counted as dropped; 503 when the database fails (nothing stored).
        """

        def context() -> tuple[dict[str, Any], set[int]]:
            return self._registration(), {e.env_id for e in self.store.envs()}

        reg, known = await self.runner.call(context)
        try:
            groups = parse(GROUP_LIST, body) if many else [parse(GROUP, body)]
            check_groups(groups, reg, known, self.settings.max_group_size)
        except Refused:
            await self.runner.call(self.store.count_dropped, *refused_groups(body))
            raise
        payloads = [GROUP.dump_json(g) for g in groups]
        rows = [(g.env_id, len(g.tokens), p) for g, p in zip(groups, payloads, strict=True)]
        try:
            await self.runner.add_groups(rows)
        except sqlite3.Error as exc:
            log.error("could not store %d groups: %s", len(rows), exc)
            raise Refused(503, f"queue database error, nothing stored: {exc}") from exc
        if payloads:
            self.latest = payloads[-1]
        return groups

    async def next_batch(self, lease: float | None, wait: float) -> Delivery | None:
        """The next batch (held ``lease`` seconds when given), waiting up to ``wait``
        seconds for one; None when none formed. 409 before the trainer registered.
        Marks the run started: environments may register from now on."""

        def take() -> Delivery | None:
            reg = self._registration()
            self.store.mark_started()
            return self.store.take_batch(reg["batch_size"], lease)

        runner = self.runner
        deadline = time.monotonic() + wait
        while (delivery := await runner.call(take)) is None and time.monotonic() < deadline:
            await runner.wait_for_change(deadline - time.monotonic())
        if delivery is None:
            return None
        runner.changed()
        if delivery.batch_id is None:
            runner.purge_soon()
        return delivery

    async def ack(self, batch_id: str) -> int:
        """Consume a leased batch; the current step. 404 for a batch not leased, 409 for
        a lease that expired (its groups went back to the queue)."""
        store = self.store
        outcome, step = await self.runner.call(lambda: (store.ack(batch_id), store.current_step()))
        if outcome == "unknown":
            raise Refused(404, f"batch_id {batch_id!r} is not leased (acked already?)")
        if outcome == "expired":
            raise Refused(
                409, f"lease of batch {batch_id!r} expired; its groups went back to the queue"
            )
        self.runner.changed()
        self.runner.purge_soon()
        return step

    async def set_served_version(
        self, version: int, model: str | None = None, incarnation: int | None = None
    ) -> None:
        """The trainer step whose weights inference serves from now on, the name it serves
        them under and the inference incarnation they were pushed to (which may end a hold:
        waiting environments are answered)."""
        await self.runner.call(self.store.set_served_version, version, model, incarnation)
        self.runner.changed()

    def inference_held(self) -> bool:
        """Environments wait while inference serves no weights the trainer pushed: from the
        supervisor's word that it went down until the trainer reports weights pushed to the
        incarnation up now. Only a trainer that reports incarnations is waited for."""
        pushed = self.store.served_incarnation()
        life = self.inference.current()
        return (
            pushed is not None and life is not None and (not life.up or life.incarnation != pushed)
        )

    async def status(self) -> dict[str, Any]:
        """Step, queued groups and sequences, leased batches (overdue leases expired first),
        whether the environments are held for the trainer's push to a restarted inference
        (``inference_held``; ``served_incarnation``: the one it last pushed to) and whether
        back-pressure pauses them (``backpressure``: the queue at ``max_batches_offpolicy``)."""

        def read() -> dict[str, Any]:
            store = self.store
            store.expire_leases()
            pending = store.pending()
            queued = sum(p.size for p in pending)
            leased = store.leased_batches()
            return {
                "current_step": store.current_step(),
                "queue_size": len(pending),
                "queue_sequences": queued,
                "leased_batches": leased,
                "inference_held": self.inference_held(),
                "served_incarnation": store.served_incarnation(),
                "max_batches_offpolicy": self.settings.max_batches_offpolicy,
                "backpressure": self._at_bound(self._batches(queued), leased),
            }

        return await self.runner.call(read)

    def take_edits(self) -> None:
        """The run's live edits (``grpo_trainer.live_edits``), validated by the supervisor."""
        changed = self.edits.poll()
        if changed:
            log.info("live edit: %s", changed)
            self.settings = self.settings.model_copy(update=changed)

    def _batches(self, sequences: int) -> float:
        """``sequences`` in batches of the registered trainer (0 before it registered)."""
        batch_size = (self.store.registration() or {}).get("batch_size", 0)
        return sequences / batch_size if batch_size else 0.0

    def _at_bound(self, queued_batches: float, leased: int) -> bool:
        """Back-pressure: the queue holds ``max_batches_offpolicy`` batches; at 0
        (synchronous), a batch queued or one leased and not acknowledged."""
        bound = self.settings.max_batches_offpolicy
        return queued_batches >= bound if bound else (queued_batches >= 1 or leased > 0)

    def _status_for(self, env_id: int) -> dict[str, Any] | None:
        """What ``/status-env`` answers for ``env_id`` (None: not registered).

        Runs on the store's thread; expires overdue leases first, so every answer (from
        ``/status-env`` or a ``/scored_data?env_status=true``) counts the same queue.
        """
        store = self.store
        env = store.env(env_id)
        if env is None:
            return None
        store.expire_leases()
        envs = store.envs()
        pending = store.pending()
        total_weight = sum(e.max_token_length * max(0.0, e.weight) for e in envs if e.connected)
        share = env.max_token_length * env.weight / total_weight if total_weight else 1.0
        reserved = sum(e.min_batch_allocation or 0 for e in envs if e.connected)
        queued = sum(p.size for p in pending)
        own = sum(p.size for p in pending if p.env_id == env_id)
        queued_batches = self._batches(queued)
        bound = self.settings.max_batches_offpolicy
        leased = store.leased_batches()
        full = self._at_bound(queued_batches, leased)
        held = self.inference_held()
        return {
            "current_step": store.current_step(),
            "served_version": store.served_version(),
            "served_model": store.served_model(),
            "inference_held": held,
            "queue_size": queued // env.group_size,
            "unallocated_fraction": 1.0 - min(reserved, 1.0),
            "self_queue_size": own // env.group_size,
            "max_group_size": max((p.size for p in pending), default=1),
            "env_weight": max(0.01, share),
            "queued_batches": queued_batches,
            "max_batches_offpolicy": bound,
            "leased_batches": leased,
            "pause": full or held,
        }

    async def env_status(self, env_id: int, wait: float = 0.0) -> dict[str, Any]:
        """An environment's view of the queue (live edits taken first); while it says
        ``pause``, waits up to ``wait`` seconds for room. 404 for an unknown ``env_id``."""
        deadline = time.monotonic() + wait
        while True:
            self.take_edits()
            answer = await self.runner.call(self._status_for, env_id)
            if answer is None:
                raise Refused(404, f"env_id {env_id} is not registered")
            if not answer["pause"] or time.monotonic() >= deadline:
                return answer
            await self.runner.wait_for_change(deadline - time.monotonic())

    async def scored_data(
        self, body: bytes, *, many: bool = False, env_status: bool = False
    ) -> dict[str, Any]:
        """Queue one group (``many``: a list of groups, all or none); with ``env_status``,
        add the environment's ``/status-env`` answer, read after the groups were queued."""
        groups = await self.ingest(body, many=many)
        answer: dict[str, Any] = {"status": "received"}
        if many:
            answer["groups_processed"] = len(groups)
        env_id = groups[-1].env_id if groups else None
        if env_status and env_id is not None:
            self.take_edits()
            status = await self.runner.call(self._status_for, env_id)
            if status is not None:
                answer["env_status"] = status
        return answer

    def latest_example(self) -> bytes:
        """The last group queued, as served (an empty example before the first)."""
        return json.dumps(EMPTY_EXAMPLE).encode() if self.latest is None else self.latest

    async def reset(self) -> int:
        """Clear queue, environments, registration and step; the groups dropped."""
        dropped = await self.runner.call(self.store.reset)
        self.runner.changed()
        self.latest = None
        log.warning("reset: queue, envs, registration and step cleared (%d groups)", dropped)
        return dropped

    async def metrics(self) -> str:
        """Prometheus text of the queue's counters (overdue leases expired first)."""

        def read() -> str:
            self.store.expire_leases()
            return render_metrics(self.store)

        return await self.runner.call(read)
