"""The rollout API's HTTP surface: Atropos endpoints and answers, our fixes behind them.

Endpoints and field names are Atropos's (so its environments and trainers work unchanged);
``/batch?lease=``, ``/batch/ack``, ``/health`` and ``/metrics`` are ours. Every refusal is
a 4xx whose ``detail`` says what was wrong; a refused request changes nothing.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import uuid
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import PlainTextResponse, Response
from pydantic import TypeAdapter, ValidationError

from grpo_trainer.api.bodies import BodyLimit
from grpo_trainer.api.prometheus import render_metrics
from grpo_trainer.api.runner import StoreRunner
from grpo_trainer.api.schemas import (
    GROUP,
    GROUP_LIST,
    Ack,
    EnvIdentifier,
    Problem,
    RegisterEnv,
    Registration,
    ScoredData,
    ServedVersion,
)
from grpo_trainer.api.security import TokenGuard
from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.api.store import Delivery
from grpo_trainer.live_edits import EditWatcher

log = logging.getLogger("grpo_trainer.api")

WAIT = {"status": "wait for trainer to start"}
MAX_REPORTED_ERRORS = 10
MAX_WAIT = 60.0
"""Longest ``wait`` of a long-polled ``/batch`` or ``/status-env``, in seconds."""
ENV_IDENTIFIER = TypeAdapter(EnvIdentifier)
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "empty body, or not JSON"},
    401: {"model": Problem, "description": "missing or wrong token (when one is set)"},
    404: {"model": Problem, "description": "unknown env_id or batch_id"},
    409: {"model": Problem, "description": "no trainer registered yet, or a lease expired"},
    413: {"model": Problem, "description": "body over max_body_bytes"},
    422: {"model": Problem, "description": "a value or shape the API cannot take"},
}
"""Error responses of every operation, so the OpenAPI schema says what clients get."""


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` declaring a required JSON body (for handlers that parse it)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


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


def _validation_detail(exc: ValidationError) -> str:
    """The first problems, with field paths, e.g. ``tokens.0.1: Input should be ...``."""
    errors = exc.errors(include_url=False)
    lines = []
    for error in errors[:MAX_REPORTED_ERRORS]:
        where = ".".join(str(part) for part in error["loc"]) or "body"
        lines.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    if len(errors) > MAX_REPORTED_ERRORS:
        lines.append(f"... and {len(errors) - MAX_REPORTED_ERRORS} more")
    return "; ".join(lines)


def _parse(adapter: TypeAdapter[Any], body: bytes) -> Any:
    """Validate a JSON body: 400 when it is not JSON, 422 when it has the wrong shape."""
    if not body:
        raise HTTPException(400, "empty body: a JSON document is required")
    try:
        return adapter.validate_json(body)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise HTTPException(400, f"malformed JSON: {_validation_detail(exc)}") from exc
        raise HTTPException(422, _validation_detail(exc)) from exc


def _refused_groups(body: bytes) -> tuple[int | None, int]:
    """``(env_id, groups)`` a refused body claims, for the dropped counter (best effort)."""
    try:
        value = json.loads(body)
    except ValueError:
        return None, 1
    count = len(value) if isinstance(value, list) else 1
    if isinstance(value, list):
        value = value[0] if value else None
    env_id = value.get("env_id") if isinstance(value, dict) else None
    return (env_id if isinstance(env_id, int) else None), max(count, 1)


def create_app(settings: ApiSettings, db: StoreRunner) -> FastAPI:
    """Build the ASGI app over ``db``; middleware enforces token and body limits.

    Each handler's database work is one function run on the store's thread, so what it
    reads and writes is one consistent step.
    """
    app = FastAPI(title="grpo-tui rollout API", docs_url=None, redoc_url=None, responses=ERRORS)
    store = db.store
    latest: dict[str, bytes] = {}

    def registration() -> dict[str, Any]:
        reg = store.registration()
        if reg is None:
            raise HTTPException(409, "no trainer registered yet: the trainer must POST /register")
        return reg

    def check_groups(groups: list[ScoredData], reg: dict[str, Any], known: set[int]) -> None:
        for index, group in enumerate(groups):
            where = f"group {index}: " if len(groups) > 1 else ""
            size = len(group.tokens)
            if group.env_id is not None and group.env_id not in known:
                raise HTTPException(
                    422, f"{where}env_id {group.env_id} is not registered (POST /register-env)"
                )
            if size > settings.max_group_size:
                raise HTTPException(
                    422, f"{where}{size} sequences exceed max_group_size {settings.max_group_size}"
                )
            if size > reg["batch_size"]:
                raise HTTPException(
                    422, f"{where}{size} sequences cannot fit a batch of {reg['batch_size']}"
                )
            longest = max(len(seq) for seq in group.tokens)
            if longest > reg["max_token_len"]:
                raise HTTPException(
                    422,
                    f"{where}a sequence has {longest} tokens, over max_token_len "
                    f"{reg['max_token_len']}",
                )

    def ingest_context() -> tuple[dict[str, Any], set[int]]:
        return registration(), {e.env_id for e in store.envs()}

    async def ingest(request: Request, many: bool) -> list[ScoredData]:
        reg, known = await db.call(ingest_context)
        body = await request.body()
        try:
            groups = _parse(GROUP_LIST, body) if many else [_parse(GROUP, body)]
            check_groups(groups, reg, known)
        except HTTPException:
            await db.call(store.count_dropped, *_refused_groups(body))
            raise
        payloads = [GROUP.dump_json(g) for g in groups]
        rows = [(g.env_id, len(g.tokens), p) for g, p in zip(groups, payloads, strict=True)]
        try:
            await db.add_groups(rows)
        except sqlite3.Error as exc:
            log.error("could not store %d groups: %s", len(rows), exc)
            raise HTTPException(503, f"queue database error, nothing stored: {exc}") from exc
        if payloads:
            latest["group"] = payloads[-1]
        return groups

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"message": "AtroposLib API"}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/register")
    async def register(body: Registration) -> dict[str, int]:
        def write() -> None:
            bad = [e for e in store.envs() if body.batch_size % e.group_size]
            if bad:
                names = ", ".join(f"{e.real_name} (group_size {e.group_size})" for e in bad)
                raise HTTPException(
                    422,
                    f"batch_size {body.batch_size} is not a multiple of the group size of {names}",
                )
            store.register_trainer(body.model_dump())

        await db.call(write)
        log.info("trainer registered: batch_size %d, step %d", body.batch_size, body.starting_step)
        return {"uuid": uuid.uuid4().int}

    @app.post("/register-env")
    async def register_env(body: RegisterEnv) -> dict[str, Any]:
        def write() -> dict[str, Any]:
            reg = store.registration()
            if reg is None or not store.started():
                return WAIT
            if reg["batch_size"] % body.group_size:
                raise HTTPException(
                    422,
                    f"batch_size {reg['batch_size']} (from the trainer) is not a multiple of "
                    f"group_size {body.group_size} (from {body.desired_name!r}): batches hold "
                    "whole groups, so this environment's groups could never fill one exactly",
                )
            if body.group_size > settings.max_group_size:
                raise HTTPException(
                    422,
                    f"group_size {body.group_size} exceeds max_group_size "
                    f"{settings.max_group_size}",
                )
            if body.min_batch_allocation:
                taken = sum(e.min_batch_allocation or 0 for e in store.envs() if e.connected)
                if taken + body.min_batch_allocation > 1:
                    raise HTTPException(
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

        return await db.call(write)

    @app.post("/disconnect-env")
    async def disconnect_env(body: EnvIdentifier) -> dict[str, str]:
        def write() -> None:
            if store.env(body.env_id) is None:
                raise HTTPException(404, f"env_id {body.env_id} is not registered")
            store.disconnect_env(body.env_id)

        await db.call(write)
        return {"status": "success"}

    @app.get("/info")
    async def info() -> dict[str, int]:
        reg = await db.call(store.registration)
        if reg is None:
            return {"batch_size": -1, "max_token_len": -1}
        return {"batch_size": reg["batch_size"], "max_token_len": reg["max_token_len"]}

    @app.get("/wandb_info")
    async def wandb_info() -> dict[str, str | None]:
        reg = await db.call(store.registration) or {}
        return {
            "group": reg.get("wandb_group"),
            "project": reg.get("wandb_project"),
            "zmq_port": None,
        }

    @app.post("/scored_data", openapi_extra=_json_body(GROUP.json_schema()))
    async def scored_data(
        request: Request,
        env_status: bool = Query(
            False,
            description="also answer the group's environment's /status-env (as env_status), "
            "read after the group was queued: saves the environment a request per group",
        ),
    ) -> dict[str, Any]:
        (group,) = await ingest(request, many=False)
        answer: dict[str, Any] = {"status": "received"}
        if env_status and group.env_id is not None:
            status = await read_env_status(group.env_id)
            if status is not None:
                answer["env_status"] = status
        return answer

    @app.post(
        "/scored_data_list",
        openapi_extra=_json_body({"type": "array", "items": GROUP.json_schema()}),
    )
    async def scored_data_list(request: Request) -> dict[str, Any]:
        groups = await ingest(request, many=True)
        return {"status": "received", "groups_processed": len(groups)}

    @app.get("/batch")
    async def batch(
        lease: float | None = Query(
            None,
            gt=0,
            le=settings.max_lease_seconds,
            description="seconds to hold the batch (max_lease_seconds at most)",
        ),
        wait: float = Query(0, ge=0, le=MAX_WAIT, description="seconds to wait for a batch"),
    ) -> Response:
        def take() -> Delivery | None:
            reg = registration()
            store.mark_started()
            return store.take_batch(reg["batch_size"], lease)

        deadline = time.monotonic() + wait
        while (delivery := await db.call(take)) is None and time.monotonic() < deadline:
            await db.wait_for_change(deadline - time.monotonic())
        if delivery is None:
            return Response(b'{"batch":null}', media_type="application/json")
        db.changed()
        if delivery.batch_id is None:
            db.purge_soon()
        parts = [b'{"batch":[', b",".join(delivery.payloads), b"]"]
        if delivery.batch_id is not None:
            parts.append(f',"batch_id":"{delivery.batch_id}"'.encode())
        parts.append(b"}")
        return Response(b"".join(parts), media_type="application/json")

    @app.post("/batch/ack")
    async def ack(body: Ack) -> dict[str, Any]:
        outcome, step = await db.call(lambda: (store.ack(body.batch_id), store.current_step()))
        if outcome == "unknown":
            raise HTTPException(404, f"batch_id {body.batch_id!r} is not leased (acked already?)")
        if outcome == "expired":
            raise HTTPException(
                409, f"lease of batch {body.batch_id!r} expired; its groups went back to the queue"
            )
        db.changed()
        db.purge_soon()
        return {"status": "success", "current_step": step}

    @app.post("/served-version")
    async def served_version(body: ServedVersion) -> dict[str, str]:
        """The trainer's weight sync finished: environments tag what they sample from now
        with ``version`` (not the step, which runs ahead between syncs of ``sync_every`` >
        1), so off-policy lag is measured against the weights that sampled."""
        await db.call(lambda: store.set_served_version(body.version))
        return {"status": "success"}

    @app.get("/status")
    async def status() -> dict[str, int]:
        def read() -> dict[str, int]:
            store.expire_leases()
            pending = store.pending()
            return {
                "current_step": store.current_step(),
                "queue_size": len(pending),
                "queue_sequences": sum(p.size for p in pending),
                "leased_batches": store.leased_batches(),
            }

        return await db.call(read)

    edits = EditWatcher.for_role("api")

    def take_edits() -> None:
        """The run's live edits (``grpo_trainer.live_edits``), validated by the supervisor."""
        nonlocal settings
        changed = edits.poll()
        if changed:
            log.info("live edit: %s", changed)
            settings = settings.model_copy(update=changed)

    def status_for(env_id: int) -> dict[str, Any] | None:
        """What ``/status-env`` answers for ``env_id`` (None: not registered).

        Runs on the store's thread; expires overdue leases first, so every answer (from
        ``/status-env`` or a ``/scored_data?env_status=true``) counts the same queue.
        """
        env = store.env(env_id)
        if env is None:
            return None
        store.expire_leases()
        envs = store.envs()
        pending = store.pending()
        reg = store.registration() or {}
        batch_size = reg.get("batch_size", 0)
        total_weight = sum(e.max_token_length * max(0.0, e.weight) for e in envs if e.connected)
        share = env.max_token_length * env.weight / total_weight if total_weight else 1.0
        reserved = sum(e.min_batch_allocation or 0 for e in envs if e.connected)
        queued = sum(p.size for p in pending)
        own = sum(p.size for p in pending if p.env_id == env_id)
        queued_batches = queued / batch_size if batch_size else 0.0
        bound = settings.max_batches_offpolicy
        leased = store.leased_batches()
        full = queued_batches >= bound if bound else (queued_batches >= 1 or leased > 0)
        return {
            "current_step": store.current_step(),
            "served_version": store.served_version(),
            "queue_size": queued // env.group_size,
            "unallocated_fraction": 1.0 - min(reserved, 1.0),
            "self_queue_size": own // env.group_size,
            "max_group_size": max((p.size for p in pending), default=1),
            "env_weight": max(0.01, share),
            "queued_batches": queued_batches,
            "max_batches_offpolicy": bound,
            "leased_batches": leased,
            "pause": full,
        }

    async def read_env_status(env_id: int) -> dict[str, Any] | None:
        """Live edits taken, then ``status_for`` on the store's thread."""
        take_edits()
        return await db.call(status_for, env_id)

    @app.get("/status-env")
    async def status_env(
        request: Request,
        env_id: int | None = None,
        wait: float = Query(0, ge=0, le=MAX_WAIT, description="seconds to wait for room"),
    ) -> dict[str, Any]:
        if env_id is None:
            env_id = _parse(ENV_IDENTIFIER, await request.body()).env_id
        deadline = time.monotonic() + wait
        while True:
            answer = await read_env_status(env_id)
            if answer is None:
                raise HTTPException(404, f"env_id {env_id} is not registered")
            if not answer["pause"] or time.monotonic() >= deadline:
                return answer
            await db.wait_for_change(deadline - time.monotonic())

    @app.get("/latest_example")
    async def latest_example() -> Response:
        if "group" not in latest:
            return Response(json.dumps(EMPTY_EXAMPLE), media_type="application/json")
        return Response(latest["group"], media_type="application/json")

    @app.get("/reset_data", response_class=PlainTextResponse)
    async def reset_data() -> PlainTextResponse:
        dropped = await db.call(store.reset)
        db.changed()
        latest.clear()
        log.warning("reset: queue, envs, registration and step cleared (%d groups)", dropped)
        return PlainTextResponse("Reset successful")

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        def read() -> str:
            store.expire_leases()
            return render_metrics(store)

        text = await db.call(read)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # add_middleware wraps: the last added runs first (CORS, then token, then body).
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if settings.token is not None:
        app.add_middleware(TokenGuard, token=settings.token.get_secret_value())
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Content-Encoding"],
        )
    return app
