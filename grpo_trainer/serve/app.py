"""The HTTP surface of the built-in server: the vLLM endpoints the stack uses.

Answers are shaped like vLLM's (``choices[i].token_ids``, ``prompt_token_ids``,
``logprobs.token_logprobs``, ``finish_reason``, ``usage``) so that environments and the
trainer have one client path for both backends. Errors use vLLM's body
``{"error": {"message", "type", "param", "code"}}``; a bad request never stops the server.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from grpo_trainer.api.security import SERVER_OPEN_PATHS, TokenGuard
from grpo_trainer.serve.buckets import RPC_CHECK, RPC_LOAD, BucketError
from grpo_trainer.serve.cuda_ipc import RPC_METHODS, device_uuid, export_weights
from grpo_trainer.serve.engine import Engine, Sample
from grpo_trainer.serve.lora import AdapterError
from grpo_trainer.serve.prom import render_metrics
from grpo_trainer.serve.protocol import (
    CompletionRequest,
    LoadLoraRequest,
    RpcRequest,
    UnloadLoraRequest,
)
from grpo_trainer.serve.replicas import Replicas
from grpo_trainer.serve.sampling import SamplingParams
from grpo_trainer.serve.sleep import SleepError, SleepState
from grpo_trainer.serve.sleep import attach_router as attach_sleep_routes

ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


class ApiError(Exception):
    """A request the server refuses, with the HTTP status and the reason."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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


class ServerState:
    """What the routes share: the engine, the served names and the limits.

    ``engine`` answers for what every replica shares (tokenizer, limits, adapters);
    ``replicas`` (``--data-parallel-size``) are the engines requests run on.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        served_model_name: str,
        model_path: str,
        max_num_seqs: int,
        shared_weights: Path | None = None,
        enable_sleep_mode: bool = False,
        replicas: Replicas | None = None,
    ) -> None:
        self.engine = engine
        self.replicas = replicas or Replicas([engine])
        self.sleep = SleepState(engine.device, enabled=enable_sleep_mode)
        self.shared_weights = shared_weights
        self.served_model_name = served_model_name
        self.model_path = model_path
        self.max_num_seqs = max_num_seqs
        self.created = int(time.time())
        self._token_texts: dict[int, str] = {}

    def token_text(self, token: int) -> str:
        """``tokenizer.decode([token])``, remembered: the logprobs of every answer name
        each of their tokens, and decoding them one call each was ~8% of the server's CPU."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.engine.tokenizer.decode([token])
        return text

    def resolve_model(self, name: str | None) -> str | None:
        """The adapter serving ``name`` (None for the base); 404 for an unknown name."""
        if name is None or name == self.served_model_name:
            return None
        adapters = self.engine.adapters
        if adapters is not None and name in adapters.paths:
            return name
        raise ApiError(f"The model `{name}` does not exist.", status=404)

    def prompts(self, prompt: str | list[int] | list[str] | list[list[int]]) -> list[list[int]]:
        """The request's prompts as token-id lists, checked against the vocabulary."""
        tokenizer = self.engine.tokenizer
        if isinstance(prompt, str):
            items: list[str | list[int]] = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            items = [list(prompt)]  # type: ignore[arg-type]
        else:
            items = list(prompt)  # type: ignore[arg-type]
        if not items:
            raise ApiError("prompt must not be empty")
        result = []
        for item in items:
            ids = tokenizer.encode(item) if isinstance(item, str) else item
            if not ids:
                raise ApiError("prompt must not be empty")
            bad = [t for t in ids if not 0 <= t < self.engine.vocab_size]
            if bad:
                vocab = self.engine.vocab_size
                raise ApiError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
            result.append(ids)
        return result


def _token_text(state: ServerState, token: int, as_ids: bool) -> str:
    return f"token_id:{token}" if as_ids else state.token_text(token)


def _logprobs_block(
    state: ServerState,
    tokens: list[int],
    values: list[float | None],
    tops: list[dict[int, float] | None],
    *,
    as_ids: bool,
) -> dict[str, Any]:
    texts = [_token_text(state, t, as_ids) for t in tokens]
    offsets, position = [], 0
    for text in texts:
        offsets.append(position)
        position += len(text)
    return {
        "text_offset": offsets,
        "token_logprobs": values,
        "tokens": texts,
        "top_logprobs": [
            None if top is None else {_token_text(state, t, as_ids): v for t, v in top.items()}
            for top in tops
        ],
    }


def _choice(
    state: ServerState,
    request: CompletionRequest,
    index: int,
    prompt_ids: list[int],
    sample: Sample,
    echo: tuple[list[float | None], list[dict[int, float] | None]] | None,
) -> dict[str, Any]:
    as_ids = bool(request.return_tokens_as_token_ids)
    text = sample.text
    logprobs = None
    if request.logprobs is not None:
        tokens, values, tops = sample.token_ids, list(sample.logprobs), list(sample.top_logprobs)
        if echo is not None:
            tokens = [*prompt_ids, *tokens]
            values = [*echo[0], *values]
            tops = [*echo[1], *tops]
        logprobs = _logprobs_block(state, tokens, values, tops, as_ids=as_ids)
    if echo is not None:
        text = state.engine.tokenizer.decode(prompt_ids, skip_special_tokens=True) + text
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": sample.finish_reason,
        "stop_reason": sample.stop_reason,
        "prompt_logprobs": None,
    }
    if request.return_token_ids:
        choice["token_ids"] = sample.token_ids
        choice["prompt_token_ids"] = prompt_ids
    return choice


def _sampling_params(request: CompletionRequest, max_tokens: int) -> SamplingParams:
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    return SamplingParams(
        n=request.n,
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        seed=request.seed,
        stop=stop,
        stop_token_ids=tuple(request.stop_token_ids or ()),
        ignore_eos=request.ignore_eos,
        top_logprobs=request.logprobs or 0,
    )


async def _complete(
    state: ServerState, engine: Engine, request: CompletionRequest
) -> dict[str, Any]:
    if request.stream:
        raise ApiError("stream=true is not supported by the built-in server")
    if request.n > state.max_num_seqs:
        raise ApiError(f"n={request.n} exceeds --max-num-seqs {state.max_num_seqs}")
    adapter = state.resolve_model(request.model)
    prompts = state.prompts(request.prompt)
    max_tokens = 16 if request.max_tokens is None else request.max_tokens
    if max_tokens == 0 and not request.echo:
        raise ApiError("max_tokens must be at least 1 (0 is only allowed with echo=true)")
    limit = state.engine.max_model_len
    for ids in prompts:
        if len(ids) + max_tokens > limit:
            raise ApiError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, "
                f"{max_tokens} in the completion). Please reduce the length."
            )
    params = _sampling_params(request, max_tokens)

    async def one(ids: list[int]) -> tuple[list[Sample], Any]:
        echo = None
        if request.echo:
            echo = await run_in_threadpool(
                lambda: engine.score(
                    ids,
                    temperature=request.temperature,
                    adapter=adapter,
                    top_logprobs=request.logprobs or 0,
                )
            )
        if max_tokens == 0:
            return [Sample(finish_reason="length") for _ in range(request.n)], echo
        queued = engine.submit(ids, params, adapter)
        if queued is None:  # paused: wait for the resume in a thread, not on the loop
            return await run_in_threadpool(engine.generate, ids, params, adapter), echo
        samples, done = queued
        await asyncio.wrap_future(done)
        return samples, echo

    # The prompts of one request go to the engine together, so they share a batch.
    results = await asyncio.gather(*(one(ids) for ids in prompts))
    choices = []
    completion_tokens = 0
    for p, (ids, (samples, echo)) in enumerate(zip(prompts, results, strict=True)):
        for i, sample in enumerate(samples):
            completion_tokens += len(sample.token_ids)
            choices.append(_choice(state, request, p * request.n + i, ids, sample, echo))
    prompt_tokens = sum(len(ids) for ids in prompts)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": request.model or state.served_model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        },
        "system_fingerprint": None,
        "kv_transfer_params": None,
    }


BUCKET_METHODS = (RPC_LOAD, RPC_CHECK, "grpo_weight_layout")
"""``/collective_rpc`` methods of a server that owns its weights (replicas loaded from a
multi-rank trainer's buckets, ``serve/buckets.py``), as vLLM's worker extension has them."""


def _bucket_rpc(state: ServerState, request: RpcRequest) -> Any:
    """Run one bucket method on every replica (a server sharing the trainer's weights has
    nothing to load: refused)."""
    if state.shared_weights is not None:
        raise ApiError(f"{request.method}: the weights are shared with the trainer here", 404)
    replicas = state.replicas
    if request.method == RPC_LOAD:
        (payloads,) = request.args
        return replicas.load_bucket(str(payloads))
    if request.method == RPC_CHECK:
        name, values = request.args
        replicas.check_parameter(str(name), list(values))
        return None
    return replicas.layout()


def create_app(state: ServerState, api_key: str | None = None) -> FastAPI:
    """The FastAPI application over ``state``; with ``api_key`` every request but
    ``/health`` and ``/metrics`` (what probes and scrapers read) needs it as a bearer token."""
    app = FastAPI(title="grpo-trainer built-in inference server")
    if api_key is not None:
        app.add_middleware(TokenGuard, token=api_key, open_paths=SERVER_OPEN_PATHS)
    engine = state.engine

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
        entry = {"object": "model", "created": state.created, "owned_by": "grpo-trainer"}
        data = [
            {
                "id": state.served_model_name,
                "root": state.model_path,
                "parent": None,
                "max_model_len": engine.max_model_len,
                **entry,
            }
        ]
        if engine.adapters is not None:
            data += [
                {"id": name, "root": path, "parent": state.served_model_name, **entry}
                for name, path in engine.adapters.paths.items()
            ]
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> JSONResponse:
        async with state.sleep.admit():
            with state.replicas.lease() as replica:
                # Plain JSON types already: skipping FastAPI's jsonable_encoder saves ~7 ms
                return JSONResponse(await _complete(state, replica, request))

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(state.replicas.engines, state.served_model_name))

    def _adapters() -> Any:
        if engine.adapters is None:
            raise ApiError("LoRA is not enabled: start the server with --enable-lora")
        return engine.adapters

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: LoadLoraRequest) -> PlainTextResponse:
        adapters = _adapters()
        if request.lora_name == state.served_model_name:
            raise ApiError(f"{request.lora_name!r} is the base model's served name")

        def load() -> None:
            with engine.lock:
                adapters.load(request.lora_name, request.lora_path, inplace=request.load_inplace)

        await run_in_threadpool(load)
        return PlainTextResponse(f"Success: LoRA adapter '{request.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: UnloadLoraRequest) -> PlainTextResponse:
        adapters = _adapters()

        def unload() -> None:
            with engine.lock:
                adapters.unload(request.lora_name)

        await run_in_threadpool(unload)
        return PlainTextResponse(
            f"Success: LoRA adapter '{request.lora_name}' removed successfully."
        )

    @app.get("/v1/shared_weights")
    async def shared_weights() -> dict[str, str]:
        if state.shared_weights is None:
            raise ApiError("not started with --shared-weights", status=404)
        if engine.device.type == "cuda":
            return {"transport": "cuda_ipc"}
        return {"transport": "file", "directory": str(state.shared_weights.resolve())}

    @app.post("/collective_rpc")
    async def collective_rpc(request: RpcRequest) -> dict[str, list[Any]]:
        if request.method in BUCKET_METHODS:
            return {"results": [await run_in_threadpool(_bucket_rpc, state, request)]}
        if state.shared_weights is None or engine.device.type != "cuda":
            raise ApiError("collective_rpc needs --shared-weights on a CUDA device", status=404)
        if request.method not in RPC_METHODS:
            raise ApiError(f"unknown method {request.method!r}; known: {', '.join(RPC_METHODS)}")
        method = device_uuid if request.method == "grpo_device_uuid" else export_weights
        return {"results": [await run_in_threadpool(method, engine.model)]}

    @app.post("/pause")
    async def pause(mode: Literal["abort", "wait", "keep"] = "abort") -> dict[str, Any]:
        for replica in state.replicas.engines:
            await run_in_threadpool(replica.gate.pause, mode)
        return {"status": "paused", "mode": mode}

    @app.post("/resume")
    async def resume() -> dict[str, Any]:
        for replica in state.replicas.engines:
            replica.gate.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": engine.gate.paused}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        return Response(status_code=200)

    attach_sleep_routes(app, state.sleep)
    return app
