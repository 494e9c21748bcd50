"""Bearer-token check on every request, for APIs bound beyond loopback.

The queue accepts training data and hands it to the trainer: anyone who can reach it can
poison or steal a run. Off loopback the server refuses to start without a token (see
``ApiSettings``), and this middleware checks it on every request except ``GET /health``,
which readiness probes call without credentials and which discloses nothing.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/health"})
SERVER_OPEN_PATHS = frozenset({"/health", "/metrics"})
"""What an inference server (built-in or vLLM) answers without its key: readiness probes
and the supervisor's metrics scraper, which carry no credentials. Neither route changes
anything; ``/metrics`` discloses request counters only."""


class TokenGuard:
    """Answer 401 unless ``Authorization: Bearer <token>`` matches (constant-time compare)."""

    def __init__(self, app: ASGIApp, token: str, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":  # refuse the handshake (vLLM serves some)
            await send({"type": "websocket.close", "code": 1008})
        else:
            reason = "wrong bearer token" if given else "missing 'Authorization: Bearer' token"
            await JSONResponse({"detail": reason}, status_code=401)(scope, receive, send)
