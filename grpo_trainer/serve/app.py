"""The HTTP surface of the built-in server: the vLLM endpoints the stack uses.

Answers are shaped like vLLM's (``choices[i].token_ids``, ``prompt_token_ids``,
``logprobs.token_logprobs``, ``finish_reason``, ``usage``) so that environments and the
trainer have one client path for both backends. Errors use vLLM's body
``{"error": {"message", "type", "param", "code"}}``; a bad request never stops the server.
The routes only parse, call ``InferenceService`` (the rules, ``service.py``) and answer.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from grpo_trainer.api.security import SERVER_OPEN_PATHS, TokenGuard
from grpo_trainer.serve.buckets import BucketError
from grpo_trainer.serve.lease import LeaseMiddleware
from grpo_trainer.serve.lora import AdapterError
from grpo_trainer.serve.protocol import (
    ApiError,
    CompletionRequest,
    LoadLoraRequest,
    RpcRequest,
    UnloadLoraRequest,
)
from grpo_trainer.serve.service import InferenceService
from grpo_trainer.serve.sleep import SleepError
from grpo_trainer.serve.sleep import attach_router as attach_sleep_routes

ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    409: "ConflictError",
    500: "InternalServerError",
}


def error_response(message: str, status: int) -> JSONResponse:
    """vLLM's error body."""
    body = {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "BadRequestError"),
            "param": None,
            "code": status,
        }
    }
    return JSONResponse(body, status_code=status)


def _validation_message(error: RequestValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        parts.append(f"{where}: {item.get('msg')}" if where else str(item.get("msg")))
    return "; ".join(parts)


def create_app(service: InferenceService, api_key: str | None = None) -> FastAPI:
    """The FastAPI application over ``service``; with ``api_key`` every request but
    ``/health`` and ``/metrics`` (what probes and scrapers read) needs it as a bearer token.
    It keeps a lease for the run attached to it (``serve/lease.py``), behind the token."""
    app = FastAPI(title="grpo-trainer built-in inference server")
    app.add_middleware(LeaseMiddleware)  # added first: the token guard is outside it
    if api_key is not None:
        app.add_middleware(TokenGuard, token=api_key, open_paths=SERVER_OPEN_PATHS)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, error: ApiError) -> JSONResponse:
        return error_response(str(error), error.status)

    @app.exception_handler(AdapterError)
    async def _adapter_error(_: Request, error: AdapterError) -> JSONResponse:
        return error_response(str(error), error.status)

    @app.exception_handler(BucketError)
    async def _bucket_error(_: Request, error: BucketError) -> JSONResponse:
        return error_response(str(error), 400)

    @app.exception_handler(SleepError)
    async def _sleep_error(_: Request, error: SleepError) -> JSONResponse:
        return error_response(str(error), 400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(_validation_message(error), 400)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return service.models()

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> JSONResponse:
        # Plain JSON types already: skipping FastAPI's jsonable_encoder saves ~7 ms
        return JSONResponse(await service.complete(request))

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics())

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: LoadLoraRequest) -> PlainTextResponse:
        await service.load_lora(request)
        return PlainTextResponse(f"Success: LoRA adapter '{request.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: UnloadLoraRequest) -> PlainTextResponse:
        await service.unload_lora(request)
        return PlainTextResponse(
            f"Success: LoRA adapter '{request.lora_name}' removed successfully."
        )

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        return service.server_info()

    @app.get("/v1/shared_weights")
    async def shared_weights() -> dict[str, str]:
        return service.shared_weights_transport()

    @app.post("/collective_rpc")
    async def collective_rpc(request: RpcRequest) -> dict[str, list[Any]]:
        return {"results": await service.collective_rpc(request)}

    @app.post("/pause")
    async def pause(mode: Literal["abort", "wait", "keep"] = "abort") -> dict[str, Any]:
        await service.pause(mode)
        return {"status": "paused", "mode": mode}

    @app.post("/resume")
    async def resume() -> dict[str, Any]:
        service.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": service.paused}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        return Response(status_code=200)

    attach_sleep_routes(app, service.sleep)
    return app
