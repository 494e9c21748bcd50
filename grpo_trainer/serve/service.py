"""The built-in server's rules and state, callable without HTTP: ``InferenceService``.

Each endpoint is one method; the app's routes only parse a request, call it and turn an
``ApiError`` (or an adapter, bucket or sleep error) into vLLM's error body.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from starlette.concurrency import run_in_threadpool

from grpo_trainer.serve.buckets import RPC_CHECK, RPC_LOAD
from grpo_trainer.serve.completions import Echo, completion_body, sampling_params
from grpo_trainer.serve.cuda_ipc import RPC_METHODS, device_uuid, export_weights
from grpo_trainer.serve.engine import Engine, Sample
from grpo_trainer.serve.lora import AdapterSet
from grpo_trainer.serve.prom import render_metrics
from grpo_trainer.serve.protocol import (
    ApiError,
    CompletionRequest,
    LoadLoraRequest,
    RpcRequest,
    UnloadLoraRequest,
)
from grpo_trainer.serve.replicas import Replicas
from grpo_trainer.serve.sleep import SleepState
from grpo_trainer.serve.weights import reload_from_disk

BUCKET_METHODS = (RPC_LOAD, RPC_CHECK, "grpo_weight_layout")
"""``/collective_rpc`` methods of a server that owns its weights (replicas loaded from a
multi-rank trainer's buckets, ``serve/buckets.py``), as vLLM's worker extension has them."""
RELOAD_METHOD = "grpo_reload_weights"
"""Mode ``none`` in place: ``kwargs.weights_path`` names full weights on disk, loaded into the
running model, as our vLLM worker extension's method of that name does with vLLM's own
``reload_weights`` (``sync/vllm_worker.py``)."""
HAZARD = (
    "vLLM's engine can die when an adapter is reloaded in place under running requests "
    "(vllm-project/vllm#13698)"
)


class InferenceService:
    """The engine, the served names and the limits, and what each endpoint does with them.

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
        self.adapters_in_use: Counter[str] = Counter()
        """Requests admitted per adapter and not finished (the event loop's count)."""
        self._token_texts: dict[int, str] = {}

    @contextmanager
    def using(self, adapter: str | None) -> Iterator[None]:
        """Count a request on ``adapter`` while it is admitted (adapter reloads check it)."""
        if adapter is not None:
            self.adapters_in_use[adapter] += 1
        try:
            yield
        finally:
            if adapter is not None:
                self.adapters_in_use[adapter] -= 1

    def _refuse_in_use(self, name: str, what: str) -> None:
        """409 while requests run on adapter ``name``: ``what`` would change it under them."""
        if running := self.adapters_in_use[name]:
            raise ApiError(f"adapter {name!r} is in use by {running} requests: {what}", 409)

    def token_text(self, token: int) -> str:
        """``tokenizer.decode([token])``, remembered: the logprobs of every answer name
        each of their tokens, and decoding them one call each was ~8% of the server's CPU."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.engine.tokenizer.decode([token])
        return text

    def prompt_text(self, ids: list[int]) -> str:
        """A prompt's text, as ``echo`` puts it before the completion."""
        return self.engine.tokenizer.decode(ids, skip_special_tokens=True)

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

    def models(self) -> dict[str, Any]:
        """``/v1/models``: the base model and every loaded adapter."""
        entry = {"object": "model", "created": self.created, "owned_by": "grpo-trainer"}
        data = [
            {
                "id": self.served_model_name,
                "root": self.model_path,
                "parent": None,
                "max_model_len": self.engine.max_model_len,
                **entry,
            }
        ]
        if self.engine.adapters is not None:
            data += [
                {"id": name, "root": path, "parent": self.served_model_name, **entry}
                for name, path in self.engine.adapters.paths.items()
            ]
        return {"object": "list", "data": data}

    async def complete(self, request: CompletionRequest) -> dict[str, Any]:
        """``/v1/completions`` on the least busy replica; waits while the server sleeps."""
        async with self.sleep.admit():
            with self.replicas.lease() as replica:
                return await self._complete(replica, request)

    async def _complete(self, engine: Engine, request: CompletionRequest) -> dict[str, Any]:
        if request.stream:
            raise ApiError("stream=true is not supported by the built-in server")
        if request.n > self.max_num_seqs:
            raise ApiError(f"n={request.n} exceeds --max-num-seqs {self.max_num_seqs}")
        adapter = self.resolve_model(request.model)
        with self.using(adapter):
            return await self._generate(engine, request, adapter)

    async def _generate(
        self, engine: Engine, request: CompletionRequest, adapter: str | None
    ) -> dict[str, Any]:
        prompts = self.prompts(request.prompt)
        max_tokens = 16 if request.max_tokens is None else request.max_tokens
        if max_tokens == 0 and not request.echo:
            raise ApiError("max_tokens must be at least 1 (0 is only allowed with echo=true)")
        limit = self.engine.max_model_len
        for ids in prompts:
            if len(ids) + max_tokens > limit:
                raise ApiError(
                    f"This model's maximum context length is {limit} tokens. However, you "
                    f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, "
                    f"{max_tokens} in the completion). Please reduce the length."
                )
        params = sampling_params(request, max_tokens)

        async def one(ids: list[int]) -> tuple[list[Sample], Echo | None]:
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
        model = request.model or self.served_model_name
        return completion_body(self, request, model, prompts, list(results))

    def metrics(self) -> str:
        """Prometheus text over every replica."""
        return render_metrics(self.replicas.engines, self.served_model_name)

    def _adapters(self) -> AdapterSet:
        if self.engine.adapters is None:
            raise ApiError("LoRA is not enabled: start the server with --enable-lora")
        return self.engine.adapters

    async def load_lora(self, request: LoadLoraRequest) -> None:
        """Load (or, ``load_inplace``, replace) an adapter under ``lora_name``."""
        adapters = self._adapters()
        if request.lora_name == self.served_model_name:
            raise ApiError(f"{request.lora_name!r} is the base model's served name")
        if request.load_inplace:
            self._refuse_in_use(
                request.lora_name, f"{HAZARD}; load the new weights under a new name instead"
            )

        def load() -> None:
            with self.engine.lock:
                adapters.load(request.lora_name, request.lora_path, inplace=request.load_inplace)

        await run_in_threadpool(load)

    async def unload_lora(self, request: UnloadLoraRequest) -> None:
        """Unload the adapter ``lora_name`` (409 while requests run on it)."""
        adapters = self._adapters()
        self._refuse_in_use(request.lora_name, "unload it once they have finished")

        def unload() -> None:
            with self.engine.lock:
                adapters.unload(request.lora_name)

        await run_in_threadpool(unload)

    def server_info(self) -> dict[str, Any]:
        """``/server_info``: what a run attaching to this server needs to know, under vLLM's
        names where vLLM has them (``vllm_config``, as vLLM's dev-mode route with
        ``config_format=json``), so one probe reads both (``serve/external.py``)."""
        adapters = self.engine.adapters
        lora = None if adapters is None else {"max_lora_rank": adapters.max_rank}
        shared = None
        if self.shared_weights is not None:
            shared = self.shared_weights_transport()["transport"]
        return {
            "vllm_config": {
                "model_config": {
                    "model": self.model_path,
                    "served_model_name": self.served_model_name,
                    "enable_sleep_mode": self.sleep.enabled,
                    "max_model_len": self.engine.max_model_len,
                    "hf_config": self.engine.model.config.to_dict(),
                },
                "lora_config": lora,
                "parallel_config": {"data_parallel_size": len(self.replicas)},
            },
            "grpo_server": {
                "backend": "builtin",
                "device": str(self.engine.device),
                "shared_weights": shared,
                "rpc_methods": [RELOAD_METHOD, *BUCKET_METHODS, *RPC_METHODS],
            },
        }

    def shared_weights_transport(self) -> dict[str, str]:
        """How a trainer reaches the shared weights: CUDA IPC, or the file's directory."""
        if self.shared_weights is None:
            raise ApiError("not started with --shared-weights", status=404)
        if self.engine.device.type == "cuda":
            return {"transport": "cuda_ipc"}
        return {"transport": "file", "directory": str(self.shared_weights.resolve())}

    async def collective_rpc(self, request: RpcRequest) -> list[Any]:
        """vLLM's worker methods this server has: the bucket methods (a server owning its
        weights), or the CUDA IPC export (one sharing them on a CUDA device); and the full
        weights reload of mode ``none`` in place."""
        if request.method == RELOAD_METHOD:
            return await run_in_threadpool(self._reload, request)
        if request.method in BUCKET_METHODS:
            return [await run_in_threadpool(self._bucket_rpc, request)]
        if self.shared_weights is None or self.engine.device.type != "cuda":
            raise ApiError("collective_rpc needs --shared-weights on a CUDA device", status=404)
        if request.method not in RPC_METHODS:
            raise ApiError(f"unknown method {request.method!r}; known: {', '.join(RPC_METHODS)}")
        method = device_uuid if request.method == "grpo_device_uuid" else export_weights
        return [await run_in_threadpool(method, self.engine.model)]

    def _reload(self, request: RpcRequest) -> list[None]:
        """``grpo_reload_weights`` on every replica (vLLM answers one ``null`` per worker);
        the trainer pauses generation around it."""
        path = request.kwargs.get("weights_path")
        if not isinstance(path, str) or not path:
            raise ApiError(f"{RELOAD_METHOD} needs kwargs.weights_path, a folder of full weights")
        for engine in self.replicas.engines:
            with engine.lock:
                try:
                    reload_from_disk(engine.model, Path(path))
                except (OSError, ValueError) as error:
                    raise ApiError(f"{RELOAD_METHOD}: {error}") from None
        self.model_path = path  # what it serves now (vLLM's model_config.model moves too)
        return [None] * len(self.replicas)

    def _bucket_rpc(self, request: RpcRequest) -> Any:
        """Run one bucket method on every replica (a server sharing the trainer's weights has
        nothing to load: refused)."""
        if self.shared_weights is not None:
            raise ApiError(f"{request.method}: the weights are shared with the trainer here", 404)
        replicas = self.replicas
        if request.method == RPC_LOAD:
            (payloads,) = request.args
            return replicas.load_bucket(str(payloads))
        if request.method == RPC_CHECK:
            name, values = request.args
            replicas.check_parameter(str(name), list(values))
            return None
        return replicas.layout()

    async def pause(self, mode: Literal["abort", "wait", "keep"]) -> None:
        """Pause generation on every replica (``mode`` as vLLM's)."""
        for replica in self.replicas.engines:
            await run_in_threadpool(replica.gate.pause, mode)

    def resume(self) -> None:
        """Resume generation on every replica."""
        for replica in self.replicas.engines:
            replica.gate.resume()

    @property
    def paused(self) -> bool:
        return self.engine.gate.paused
