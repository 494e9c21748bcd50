"""The rollout API's HTTP surface: Atropos endpoints and answers, our fixes behind them.

Endpoints and field names are Atropos's (so its environments and trainers work unchanged);
``/batch?lease=``, ``/batch/ack``, ``/health`` and ``/metrics`` are ours. Every refusal is
a 4xx whose ``detail`` says what was wrong; a refused request changes nothing. The routes
only parse, call ``RolloutService`` (the rules, ``service.py``) and answer; a ``Refused``
becomes its status and ``detail``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import TypeAdapter

from grpo_trainer.api.bodies import BodyLimit
from grpo_trainer.api.runner import StoreRunner
from grpo_trainer.api.schemas import (
    GROUP,
    Ack,
    EnvIdentifier,
    Problem,
    RegisterEnv,
    Registration,
    ServedVersion,
)
from grpo_trainer.api.security import TokenGuard
from grpo_trainer.api.service import RolloutService
from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.api.validation import Refused, parse

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


def create_app(settings: ApiSettings, db: StoreRunner) -> FastAPI:
    """Build the ASGI app over ``db``; middleware enforces token and body limits."""
    app = FastAPI(title="grpo-tui rollout API", docs_url=None, redoc_url=None, responses=ERRORS)
    service = RolloutService(settings, db)

    @app.exception_handler(Refused)
    async def refused(_: Request, error: Refused) -> JSONResponse:
        return JSONResponse({"detail": error.detail}, status_code=error.status)

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"message": "AtroposLib API"}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/register")
    async def register(body: Registration) -> dict[str, int]:
        return {"uuid": await service.register(body)}

    @app.post("/register-env")
    async def register_env(body: RegisterEnv) -> dict[str, Any]:
        return await service.register_env(body)

    @app.post("/disconnect-env")
    async def disconnect_env(body: EnvIdentifier) -> dict[str, str]:
        await service.disconnect_env(body.env_id)
        return {"status": "success"}

    @app.get("/info")
    async def info() -> dict[str, int]:
        reg = await service.registration()
        if reg is None:
            return {"batch_size": -1, "max_token_len": -1}
        return {"batch_size": reg["batch_size"], "max_token_len": reg["max_token_len"]}

    @app.get("/wandb_info")
    async def wandb_info() -> dict[str, str | None]:
        reg = await service.registration() or {}
        return {
            "group": reg.get("wandb_group"),
            "project": reg.get("wandb_project"),
            "zmq_port": None,
        }

    env_status_query = Query(
        False,
        description="also answer the environment's /status-env (as env_status), read after "
        "its groups were queued: saves the environment a request per post",
    )

    @app.post("/scored_data", openapi_extra=_json_body(GROUP.json_schema()))
    async def scored_data(request: Request, env_status: bool = env_status_query) -> dict[str, Any]:
        return await service.scored_data(await request.body(), env_status=env_status)

    @app.post(
        "/scored_data_list",
        openapi_extra=_json_body({"type": "array", "items": GROUP.json_schema()}),
    )
    async def scored_data_list(
        request: Request, env_status: bool = env_status_query
    ) -> dict[str, Any]:
        return await service.scored_data(await request.body(), many=True, env_status=env_status)

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
        delivery = await service.next_batch(lease, wait)
        if delivery is None:
            return Response(b'{"batch":null}', media_type="application/json")
        parts = [b'{"batch":[', b",".join(delivery.payloads), b"]"]
        if delivery.batch_id is not None:
            parts.append(f',"batch_id":"{delivery.batch_id}"'.encode())
        parts.append(b"}")
        return Response(b"".join(parts), media_type="application/json")

    @app.post("/batch/ack")
    async def ack(body: Ack) -> dict[str, Any]:
        return {"status": "success", "current_step": await service.ack(body.batch_id)}

    @app.post("/served-version")
    async def served_version(body: ServedVersion) -> dict[str, str]:
        """The trainer's weight sync finished: environments tag what they sample from now
        with ``version`` (not the step, which runs ahead between syncs of ``sync_every`` >
        1), so off-policy lag is measured against the weights that sampled, and ask
        inference for ``model``. An ``incarnation`` ends a hold (``inference_held``)."""
        await service.set_served_version(body.version, body.model, body.incarnation)
        return {"status": "success"}

    @app.get("/status")
    async def status() -> dict[str, Any]:
        return await service.status()

    @app.get("/status-env")
    async def status_env(
        request: Request,
        env_id: int | None = None,
        wait: float = Query(0, ge=0, le=MAX_WAIT, description="seconds to wait for room"),
    ) -> dict[str, Any]:
        if env_id is None:
            env_id = parse(ENV_IDENTIFIER, await request.body()).env_id
        return await service.env_status(env_id, wait)

    @app.get("/latest_example")
    async def latest_example() -> Response:
        return Response(service.latest_example(), media_type="application/json")

    @app.get("/reset_data", response_class=PlainTextResponse)
    async def reset_data() -> PlainTextResponse:
        await service.reset()
        return PlainTextResponse("Reset successful")

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        text = await service.metrics()
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
