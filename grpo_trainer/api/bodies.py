"""Request bodies read whole, size-capped and un-gzipped before any handler sees them.

Atropos environments may send ``Content-Encoding: gzip``. A gzip body is inflated in
bounded steps and refused as soon as it would pass ``max_bytes`` (a gzip bomb of a few KiB
can inflate to gigabytes), so memory stays bounded by the limit whatever the sender does.
"""

from __future__ import annotations

import zlib

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CHUNK = 1 << 20


class BodyTooLarge(Exception):
    """The body, as sent or once inflated, is over the limit."""


def gunzip_capped(data: bytes, max_bytes: int) -> bytes:
    """Inflate a gzip member, raising BodyTooLarge past ``max_bytes`` (ValueError if bad)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = bytearray()
    pending = data
    try:
        while pending:
            out += inflater.decompress(pending, CHUNK)
            if len(out) > max_bytes:
                raise BodyTooLarge(f"gzip body inflates beyond the {max_bytes}-byte limit")
            pending = inflater.unconsumed_tail
        out += inflater.flush()
    except zlib.error as exc:
        raise ValueError(f"invalid gzip body: {exc}") from exc
    if len(out) > max_bytes:
        raise BodyTooLarge(f"gzip body inflates beyond the {max_bytes}-byte limit")
    if not inflater.eof:
        raise ValueError("invalid gzip body: truncated stream")
    return bytes(out)


class BodyLimit:
    """Buffer each request body (at most ``max_bytes``), inflate gzip, pass it on plain."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"0")
        encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").lower()
        try:
            if declared.isdigit() and int(declared) > self.max_bytes:
                raise BodyTooLarge(f"body of {int(declared)} bytes is over the limit")
            body = await self._read(receive)
            if encoding == "gzip":
                body = gunzip_capped(body, self.max_bytes)
            elif encoding != "identity":
                await self._refuse(scope, send, 415, f"unsupported Content-Encoding {encoding!r}")
                return
        except BodyTooLarge as exc:
            await self._refuse(scope, send, 413, f"{exc} ({self.max_bytes} bytes)")
            return
        except ValueError as exc:
            await self._refuse(scope, send, 400, str(exc))
            return

        scope = dict(scope)
        scope["headers"] = [
            (k, v) for k, v in scope["headers"] if k not in (b"content-length", b"content-encoding")
        ] + [(b"content-length", str(len(body)).encode())]
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise BodyTooLarge("body is over the limit")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    @staticmethod
    async def _refuse(scope: Scope, send: Send, status: int, reason: str) -> None:
        async def no_body() -> Message:
            return {"type": "http.disconnect"}

        await JSONResponse({"detail": reason}, status_code=status)(scope, no_body, send)
