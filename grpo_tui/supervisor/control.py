"""The control socket: children report metrics and their health, and ask for actions
(docs/control-socket.md).

NDJSON over a Unix domain socket. Each connection is identified by its peer's pid
(``SO_PEERCRED``), so a child that never says ``hello`` is still known by name. On a
cluster, children on other nodes cannot reach a Unix socket: the server then also listens
on TCP (``ControlEndpoint``), where a connection's first record must be a ``hello`` with
the run's token (compared in constant time) and names the process. Requests run
in their own task, so a restart that takes a minute never holds up the metrics stream on the
same connection; the reply goes back on that connection when the action is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import socket
import struct
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from grpo_tui.supervisor.events import Event, MetricsRecord, Notice, RequestReceived

MAX_RECORD = 16 * 1024 * 1024
SUN_PATH_MAX = 100  # sockaddr_un.sun_path holds 108 bytes; keep a margin


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Hello(_Record):
    type: Literal["hello"]
    process: str | None = None
    pid: int | None = None
    token: str | None = None


@dataclass(frozen=True)
class ControlEndpoint:
    """The TCP side of the control socket, for children on other nodes.

    Listens on ``bind:port``; children reach it at ``address:port`` and prove themselves
    with ``token`` (``GRPO_TUI_CONTROL_TOKEN``).
    """

    address: str
    port: int
    token: str
    bind: str = "0.0.0.0"

    @property
    def url(self) -> str:
        return f"tcp://{self.address}:{self.port}"


HELLO_TIMEOUT = 10.0


class Metrics(_Record):
    type: Literal["metrics"]
    step: int | None = None
    t: float | None = None
    data: dict[str, float | None]


class EventIn(_Record):
    type: Literal["event"]
    t: float | None = None
    level: Literal["info", "warning", "error"] = "info"
    message: str
    code: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class HealthIn(_Record):
    """A child's own word on its health (``health.py``): failing, with why, or ok again."""

    type: Literal["health"]
    ok: bool
    reason: str = ""


class Request(_Record):
    type: Literal["request"]
    id: str
    action: str
    process: str | None = None
    role: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)


Incoming = TypeAdapter(
    Annotated[Hello | Metrics | EventIn | HealthIn | Request, Field(discriminator="type")]
)

OnRequest = Callable[[str, str, str | None, dict[str, Any]], Awaitable[dict[str, Any]]]


CONTROL_SOCKET = "control.sock"


def socket_path(run_dir: Path, run_id: str) -> Path:
    """``run_dir/control.sock``, or a short path under the temp dir when that is too long
    (then linked from ``run_dir/control.sock``: ``RunResources``)."""
    path = run_dir.resolve() / CONTROL_SOCKET
    if len(str(path).encode()) <= SUN_PATH_MAX:
        return path
    return Path(tempfile.gettempdir()) / f"grpo-tui-{run_id[:12]}.sock"


def _peer_pid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, _, _ = struct.unpack("3i", creds)
    return pid or None


class ControlServer:
    """Serves the control socket at ``path`` and hands records to the supervisor."""

    def __init__(
        self,
        path: Path,
        *,
        on_metrics: Callable[[MetricsRecord], None],
        on_event: Callable[[Event], None],
        on_request: OnRequest,
        identify: Callable[[int], str | None],
        on_health: Callable[[str, bool, str], None],
        tcp: ControlEndpoint | None = None,
    ) -> None:
        self.path = path
        self.tcp = tcp
        self._tcp_server: asyncio.Server | None = None
        self._on_metrics = on_metrics
        self._on_event = on_event
        self._on_request = on_request
        self._on_health = on_health
        self._identify = identify
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=MAX_RECORD
        )
        if self.tcp is not None:
            self._tcp_server = await asyncio.start_server(
                self._serve_tcp, host=self.tcp.bind, port=self.tcp.port, limit=MAX_RECORD
            )

    async def close(self) -> None:
        for server in (self._server, self._tcp_server):
            if server is not None:
                server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid = _peer_pid(writer)
        await self._converse(reader, writer, (self._identify(pid) if pid else None) or "unknown")

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A TCP peer: its first record must be a hello carrying the run's token."""
        assert self.tcp is not None
        peer = writer.get_extra_info("peername")
        try:
            async with asyncio.timeout(HELLO_TIMEOUT):
                first = await reader.readline()
            hello = Hello.model_validate_json(first)
        except (TimeoutError, ValueError, ConnectionError, ValidationError):
            hello = None
        expected = self.tcp.token.encode()
        if hello is None or not hmac.compare_digest((hello.token or "").encode(), expected):
            self._warn(f"control socket: refused a TCP peer {peer} (no valid token)")
            writer.close()
            return
        await self._converse(reader, writer, hello.process or "unknown")

    async def _converse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        lock = asyncio.Lock()
        requests: set[asyncio.Task[None]] = set()
        try:
            while line := await reader.readline():
                if not line.strip():
                    continue
                name = self._handle(line, name, writer, lock, requests)
        except ValueError:
            self._warn(f"control socket: a record from {name} exceeds {MAX_RECORD} bytes")
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if requests:
                await asyncio.gather(*requests, return_exceptions=True)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
            self._tasks.discard(task)

    def _handle(
        self,
        line: bytes,
        name: str,
        writer: asyncio.StreamWriter,
        lock: asyncio.Lock,
        requests: set[asyncio.Task[None]],
    ) -> str:
        """Act on one record; returns the connection's (possibly new) process name."""
        try:
            record = Incoming.validate_python(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as exc:
            self._warn(f"control socket: bad record from {name}: {_short(exc)}")
            request_id = _request_id(line)
            if request_id is not None:
                reply = _reply(request_id, ok=False, error=f"bad request: {_short(exc)}")
                requests.add(asyncio.create_task(self._send(writer, lock, reply)))
            return name
        match record:
            case Hello():
                return record.process or name
            case Metrics():
                data = {k: v for k, v in record.data.items() if v is not None}
                self._on_metrics(
                    MetricsRecord(
                        t=record.t or time.time(), process=name, step=record.step, data=data
                    )
                )
            case EventIn():
                self._on_event(
                    Notice(
                        t=record.t or time.time(),
                        level=record.level,
                        message=f"{name}: {record.message}",
                        code=record.code,
                        data=record.data,
                    )
                )
            case HealthIn():
                self._on_health(name, record.ok, record.reason)
            case Request():
                target = record.process or record.role
                self._on_event(
                    RequestReceived(
                        process=name, action=record.action, target=target, args=record.args
                    )
                )
                task = asyncio.create_task(self._answer(record, name, target, writer, lock))
                requests.add(task)
                task.add_done_callback(requests.discard)
        return name

    async def _answer(
        self,
        request: Request,
        name: str,
        target: str | None,
        writer: asyncio.StreamWriter,
        lock: asyncio.Lock,
    ) -> None:
        try:
            result = await self._on_request(name, request.action, target, request.args)
            reply = _reply(request.id, ok=True, result=result)
        except Exception as exc:  # any failure of the action is the requester's answer
            reply = _reply(request.id, ok=False, error=str(exc) or type(exc).__name__)
        await self._send(writer, lock, reply)

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, lock: asyncio.Lock, reply: bytes) -> None:
        async with lock:
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(reply)
                await writer.drain()

    def _warn(self, message: str) -> None:
        self._on_event(Notice(level="warning", message=message))


def _reply(
    request_id: str, *, ok: bool, error: str | None = None, result: dict[str, Any] | None = None
) -> bytes:
    record = {"type": "reply", "id": request_id, "ok": ok, "error": error, "result": result or {}}
    return json.dumps(record, default=str).encode() + b"\n"


def _request_id(line: bytes) -> str | None:
    """The id of a malformed request, if one can be read, so the requester is not left hanging."""
    with contextlib.suppress(ValueError, AttributeError):
        record = json.loads(line)
        if record.get("type") == "request" and isinstance(record.get("id"), str):
            return record["id"]
    return None


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(part) for part in err['loc'])}: {err['msg']}"
            for err in exc.errors()[:3]
        )
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
