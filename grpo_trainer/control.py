"""Client of the supervisor's control socket (see docs/control-socket.md).

A child reports metrics, events and its own health, and asks the supervisor to act
(restart the inference server on a new checkpoint), over newline-delimited JSON on the
Unix socket named by ``GRPO_TUI_SOCKET`` (or, for a child on another node of a cluster,
``tcp://host:port``, proving itself with ``GRPO_TUI_CONTROL_TOKEN`` in its hello).
Reporting never blocks training: records go through a bounded queue to a background
thread, which drops records when the queue is full and reconnects when the socket comes
back. Requests block their caller until the matching reply or a timeout.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

SOCKET_ENV = "GRPO_TUI_SOCKET"
PROCESS_ENV = "GRPO_TUI_PROCESS"
RUN_DIR_ENV = "GRPO_TUI_RUN_DIR"
TOKEN_ENV = "GRPO_TUI_CONTROL_TOKEN"
TCP_SCHEME = "tcp://"


SHUTTING_DOWN = "supervisor is shutting down"
"""How the supervisor's refusal starts once the run's shutdown has begun."""


class ControlError(RuntimeError):
    """A request was refused by the supervisor, or got no reply in time.

    ``reason`` is the supervisor's own words for a refusal (the message otherwise).
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


class SupervisorShuttingDown(ControlError):
    """The supervisor refused because the run is stopping: asking again cannot help."""


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None


class SupervisorLink:
    """One connection to the supervisor, owned by a daemon thread."""

    def __init__(
        self,
        path: str,
        *,
        process: str = "unknown",
        queue_size: int = 1000,
        reconnect_max: float = 2.0,
        send_timeout: float = 5.0,
    ) -> None:
        self.path = path
        self.process = process
        self.dropped = 0
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=queue_size)
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._reconnect_max = reconnect_max
        self._send_timeout = send_timeout
        self._health: dict[str, Any] | None = None
        """The last health record. A state, not an event: it bypasses the queue (which
        drops records), sent when it changes and again on each new connection."""
        self._health_changed = threading.Event()
        self._closed = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor-link", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls) -> SupervisorLink | None:
        """A link to ``$GRPO_TUI_SOCKET``, or None when no supervisor runs us."""
        path = os.environ.get(SOCKET_ENV)
        if not path:
            return None
        return cls(path, process=os.environ.get(PROCESS_ENV, "unknown"))

    @property
    def connected(self) -> bool:
        """True while a connection to the supervisor is open."""
        return self._connected.is_set()

    def send_metrics(self, step: int | None, data: dict[str, float]) -> None:
        """Queue one metrics record; dropped (counted) when the queue is full."""
        self._offer({"type": "metrics", "step": step, "t": time.time(), "data": data})

    def send_event(
        self, level: str, message: str, code: str = "", data: dict[str, Any] | None = None
    ) -> None:
        """Queue an event for the supervisor's event log (``info``/``warning``/``error``);
        ``code`` and ``data`` say what happened for programs (the supervisor's ``Notice``)."""
        event = {"type": "event", "t": time.time(), "level": level, "message": message}
        self._offer({**event, "code": code, "data": data or {}})

    def send_health(self, ok: bool, reason: str = "") -> None:
        """Say whether this process is healthy (``reason``: why not); the supervisor shows
        it as the process's health until the next report. Kept, and sent again after a
        reconnection."""
        self._health = {"type": "health", "ok": ok, "reason": reason}
        self._health_changed.set()

    def request(
        self,
        action: str,
        process: str | None = None,
        args: dict[str, Any] | None = None,
        timeout: float = 300.0,
    ) -> dict[str, Any]:
        """Ask the supervisor to act and wait for its reply; returns the reply's ``result``.

        Raises ``ControlError`` when the supervisor refuses (``ok`` false) or no reply
        arrives within ``timeout`` seconds (including while the socket is down);
        ``SupervisorShuttingDown``, a subclass, when it refuses because the run is stopping.
        """
        request_id = f"{os.getpid()}-{next(self._ids)}"
        pending = _Pending()
        with self._lock:
            self._pending[request_id] = pending
        record = {"type": "request", "id": request_id, "action": action, "args": args or {}}
        if process is not None:
            record["process"] = process
        try:
            self._queue.put(record, timeout=timeout)
            if not pending.done.wait(timeout):
                state = "connected" if self.connected else "not connected"
                raise ControlError(
                    f"no reply to {action!r} from the supervisor within {timeout:.0f} s "
                    f"({state} to {self.path})"
                )
        finally:
            with self._lock:
                self._pending.pop(request_id, None)
        reply = pending.reply or {}
        if not reply.get("ok"):
            error = str(reply.get("error"))
            refusal = SupervisorShuttingDown if error.startswith(SHUTTING_DOWN) else ControlError
            raise refusal(f"supervisor refused {action!r}: {error}", reason=error)
        return dict(reply.get("result") or {})

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the queue (and a new health record) is sent (or ``timeout``); True
        when it emptied."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            health_pending = self._health_changed.is_set() and self.connected
            if self._queue.unfinished_tasks == 0 and not health_pending:
                return True
            time.sleep(0.01)
        return False

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (up to ``timeout``) and stop the thread."""
        if self.connected:
            self.flush(timeout)
        self._closed.set()
        self._thread.join(timeout)

    def _offer(self, record: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        delay = 0.05
        while not self._closed.is_set():
            try:
                conn = self._connect()
            except OSError:
                self._discard_while_down(delay)
                delay = min(delay * 2, self._reconnect_max)
                continue
            delay = 0.05
            self._connected.set()
            try:
                self._serve(conn)
            except OSError as exc:
                # the process's log says it (the link itself is what broke); records queued
                # meanwhile are dropped and counted, requests wait for the next connection
                print(
                    f"[warning] supervisor link lost ({exc}); reconnecting",
                    file=sys.stderr,
                    flush=True,
                )
            finally:
                self._connected.clear()
                conn.close()

    def _connect(self) -> socket.socket:
        """A connection to the supervisor: its Unix socket, or ``tcp://host:port``."""
        if self.path.startswith(TCP_SCHEME):
            host, _, port = self.path.removeprefix(TCP_SCHEME).rpartition(":")
            conn = socket.create_connection((host, int(port)), timeout=self._send_timeout)
            conn.settimeout(self._send_timeout)
            return conn
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(self._send_timeout)
        try:
            conn.connect(self.path)
        except OSError:
            conn.close()
            raise
        return conn

    def _discard_while_down(self, wait: float) -> None:
        """While disconnected, keep metrics flowing out of the queue so it never fills
        with stale records; requests stay queued for the next connection."""
        keep = []
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                record = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if record["type"] == "request":
                keep.append(record)
            else:
                self.dropped += 1
                self._queue.task_done()
        for record in keep:
            self._queue.task_done()
            self._offer(record)

    def _serve(self, conn: socket.socket) -> None:
        hello = {"type": "hello", "process": self.process, "pid": os.getpid()}
        if self.path.startswith(TCP_SCHEME):
            hello["token"] = os.environ.get(TOKEN_ENV, "")
        conn.sendall(_line(hello))
        self._health_changed.set()  # this connection has not heard it yet
        reader = threading.Thread(target=self._read_replies, args=(conn,), daemon=True)
        reader.start()
        while not self._closed.is_set() and reader.is_alive():
            if self._health_changed.is_set():
                self._health_changed.clear()  # before reading it: a newer one sets it again
                if (health := self._health) is not None:
                    conn.sendall(_line(health))
            try:
                record = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                conn.sendall(_line(record))
            finally:
                self._queue.task_done()

    def _read_replies(self, conn: socket.socket) -> None:
        buffer = b""
        while not self._closed.is_set():
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                self._deliver(raw)

    def _deliver(self, raw: bytes) -> None:
        try:
            message = json.loads(raw)
        except json.JSONDecodeError:
            return
        if not isinstance(message, dict) or message.get("type") != "reply":
            return
        with self._lock:
            pending = self._pending.get(str(message.get("id")))
        if pending is not None:
            pending.reply = message
            pending.done.set()


def report_event(
    link: SupervisorLink | None,
    level: str,
    message: str,
    code: str = "",
    data: dict[str, Any] | None = None,
) -> None:
    """Something a person should see: stderr (the process's log) and, when a supervisor
    runs us, its event log (``info``/``warning``/``error``; ``code`` and ``data``: what
    happened, for programs)."""
    print(f"[{level}] {message}", file=sys.stderr, flush=True)
    if link is not None:
        link.send_event(level, message, code, data)


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"
