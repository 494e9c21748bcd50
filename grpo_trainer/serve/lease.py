"""A kept inference server's lease: one run at a time (issue 37).

A server kept between runs (``grpo-tui serve``) takes one run at a time: the run holds a
lease under its id, renews it while it lives, and lets it go at its end. A second run is
refused with the holder named; the lease of a run that crashed (nothing renews it) expires
after its ``ttl``.

The lease lives in the server's own HTTP process, as an ASGI middleware that answers
``/grpo/lease`` and passes every other request through:

- the built-in server adds it to its app (``serve/app.py``);
- vLLM has no lease of its own, and no route a plugin could add, but it loads ASGI
  middleware classes named by ``--middleware`` (its official extension point, as for the
  bearer-token guard ``sync/vllm_guard.py``): our command lines add
  ``--middleware grpo_trainer.serve.lease.LeaseMiddleware`` to every in-place server.

Why there and not in a sidecar or a file: it needs nothing beside the server (one URL, no
second process to keep alive or to find), a file would not reach a server on another host,
and the lease dies with the server, so a restarted server starts free and the run that
held it takes it again when it re-attaches. One lease per HTTP process: a vLLM started with
several API server processes (``--api-server-count``) would keep one in each.

Routes (JSON): ``GET`` the holder (``holder`` null when free); ``POST {holder, label, ttl}``
takes it when free, expired or already this holder's (a renewal), else 409 naming the
holder; ``DELETE ?holder=ID`` lets it go (409 when another holds it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

LEASE_PATH = "/grpo/lease"
DEFAULT_TTL = 30.0
"""Seconds a lease lasts unless renewed; its holder renews it every third of that."""


class LeaseRequest(BaseModel):
    """``POST /grpo/lease``: who takes it, what to call them, for how long."""

    model_config = ConfigDict(extra="forbid")

    holder: str = Field(min_length=1, max_length=500)
    label: str = Field("", max_length=500)
    ttl: float = Field(DEFAULT_TTL, gt=0, le=3600)


@dataclass
class Holding:
    holder: str
    label: str
    since: float
    expires_at: float


class LeaseBook:
    """The lease's state and rules; ``clock`` is monotonic seconds (a test passes a fake)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.holding: Holding | None = None

    def current(self) -> Holding | None:
        """The holding in force (an expired one is dropped)."""
        if self.holding is not None and self.holding.expires_at <= self.clock():
            self.holding = None
        return self.holding

    def describe(self) -> dict[str, Any]:
        """The state as the routes answer it."""
        held = self.current()
        if held is None:
            return {"holder": None, "label": "", "held_for": 0.0, "expires_in": 0.0}
        now = self.clock()
        return {
            "holder": held.holder,
            "label": held.label,
            "held_for": round(now - held.since, 3),
            "expires_in": round(held.expires_at - now, 3),
        }

    def refusal(self) -> str:
        """Why a holder other than the current one is refused."""
        state = self.describe()
        return (
            f"the server is leased to {state['label'] or state['holder']} (holder "
            f"{state['holder']}, for {state['held_for']:.0f} s; it expires in "
            f"{state['expires_in']:.0f} s unless renewed)"
        )

    def take(self, request: LeaseRequest) -> bool:
        """Take or renew the lease; False when another holder has it."""
        held, now = self.current(), self.clock()
        if held is not None and held.holder != request.holder:
            return False
        since = held.since if held is not None else now
        self.holding = Holding(request.holder, request.label, since, now + request.ttl)
        return True

    def release(self, holder: str) -> bool:
        """Let the lease go; False when another holder has it (nothing held is fine)."""
        held = self.current()
        if held is None:
            return True
        if held.holder != holder:
            return False
        self.holding = None
        return True


def _conflict(book: LeaseBook) -> JSONResponse:
    """409 with vLLM's error body and the holding beside it."""
    error = {"message": book.refusal(), "type": "ConflictError", "param": None, "code": 409}
    return JSONResponse({"error": error, **book.describe()}, status_code=409)


def _bad(message: str, status: int = 400) -> JSONResponse:
    error = {"message": message, "type": "BadRequestError", "param": None, "code": status}
    return JSONResponse({"error": error}, status_code=status)


class LeaseMiddleware:
    """ASGI middleware answering ``/grpo/lease`` (see the module docstring); one book per
    app, so per HTTP server process."""

    def __init__(self, app: ASGIApp, book: LeaseBook | None = None) -> None:
        self.app = app
        self.book = book or LeaseBook()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != LEASE_PATH:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        response = await self.answer(request)
        await response(scope, receive, send)

    async def answer(self, request: Request) -> JSONResponse:
        book = self.book
        if request.method == "GET":
            return JSONResponse(book.describe())
        if request.method == "POST":
            try:
                asked = LeaseRequest.model_validate_json(await request.body())
            except ValidationError as error:
                return _bad(f"a lease request is {{holder, label, ttl}}: {error.errors()[0]}")
            if not book.take(asked):
                return _conflict(book)
            return JSONResponse(book.describe())
        if request.method == "DELETE":
            holder = request.query_params.get("holder")
            if not holder:
                return _bad("DELETE /grpo/lease needs ?holder=ID")
            if not book.release(holder):
                return _conflict(book)
            return JSONResponse(book.describe())
        return _bad(f"{request.method} {LEASE_PATH}: GET, POST or DELETE", 405)
