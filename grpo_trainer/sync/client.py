"""HTTP calls from a sync strategy to the inference server, with retry and backoff.

A sync that fails because inference is down or slow is retried (exponential backoff) and
then raised as ``SyncError`` with the reason, so training never continues silently
against stale weights: the caller decides whether to stop or to retry at the next step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from grpo_trainer.serve.settings import inference_headers


class SyncError(RuntimeError):
    """A weight sync did not complete; the server may still serve older weights."""


class InferenceUnreachable(SyncError):
    """No attempt found a server listening, or each lost its connection: it is down or
    gone. A timeout is not this: a slow server is alive."""


GONE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)
"""Transport errors that mean nothing serves at the address (refused, dropped)."""


class InferenceClient:
    """Talks to one inference server (built-in or vLLM) at ``base_url``."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 60.0,
        attempts: int = 4,
        backoff: float = 0.5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.attempts = attempts
        self.backoff = backoff
        self.http = httpx.Client(
            base_url=self.base_url, headers=inference_headers(), timeout=timeout
        )

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> httpx.Response:
        """Send a request; retry transport errors and 5xx; raise ``SyncError`` at the end.

        A 4xx is the server refusing the request (bad adapter, unknown name): not retried.
        """
        first = last = ""
        alive = False  # some attempt got an answer or timed out
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self.http.request(method, path, json=json, params=params)
            except httpx.HTTPError as error:
                alive = alive or not isinstance(error, GONE)
                last = f"{type(error).__name__}: {error}"
                first = first or last
                continue
            if response.status_code < 400:
                return response
            alive = True
            last = f"HTTP {response.status_code}: {response.text[:500]}"
            first = first or last
            if response.status_code < 500:
                break
        # A retried call can fail differently the second time (a server that reset its
        # state after the first error): the first error is the cause, so it is kept.
        cause = last if first in ("", last) else f"{last} (first attempt: {first})"
        failed = SyncError if alive else InferenceUnreachable
        raise failed(f"{method} {self.base_url}{path} failed: {cause}")

    def post(self, path: str, json: Any = None, **params: Any) -> httpx.Response:
        """``POST path`` with optional JSON body and query parameters."""
        return self.call("POST", path, json=json, params=params or None)

    def get(self, path: str) -> httpx.Response:
        """``GET path``."""
        return self.call("GET", path)

    def wait_healthy(
        self, timeout: float, say: Callable[[float], None] | None = None, every: float = 15.0
    ) -> float:
        """Poll ``/health`` until 200; returns the seconds waited, raises ``SyncError``.
        ``say(seconds so far)`` is called when the first poll fails and then every ``every``
        seconds while it waits."""
        start = time.monotonic()
        deadline = start + timeout
        told = start - every
        last = "no answer yet"
        while True:
            try:
                status = self.http.get("/health", timeout=2.0).status_code
                if status == 200:
                    return time.monotonic() - start
                last = f"HTTP {status}"
            except httpx.HTTPError as error:
                last = f"{type(error).__name__}: {error}"
            now = time.monotonic()
            if now > deadline:
                raise SyncError(
                    f"{self.base_url}/health not 200 within {timeout:.0f} s (last: {last})"
                )
            if say is not None and now - told >= every:
                told = now
                say(now - start)
            time.sleep(0.1)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()


def base_model_name(client: InferenceClient) -> str:
    """The name the server serves its base model under (``/v1/models``: the first model
    without a ``parent``; adapters name theirs). It depends on the mode the server started
    in (``<name>-base`` in a LoRA mode), so the trainer asks instead of assuming."""
    models = client.get("/v1/models").json().get("data") or []
    for model in models:
        if isinstance(model, dict) and model.get("id") and not model.get("parent"):
            return str(model["id"])
    raise SyncError(f"{client.base_url}/v1/models lists no base model: {models}")
