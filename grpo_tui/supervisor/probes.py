"""Readiness, liveness and progress probes: http / tcp / exec checks on a schedule,
log-line matches, and a request for a little work once a process seems idle.

Thresholds are enforced (unlike process-compose's ``success_threshold``): readiness needs
``success_threshold`` consecutive passes, liveness gives up after ``failure_threshold``
consecutive failures. A log-line probe is not polled: it passes the moment the line is
printed. ``report`` is called with each result that differs from the previous one, so a
probe failing every 100 ms while a server loads is one event, not hundreds. What a probe
does over the network goes through a :class:`Prober` and its waits through a
:class:`~grpo_tui.supervisor.clock.Clock`, so a test can hand in its own of both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from grpo_tui.supervisor.clock import Clock
from grpo_tui.supervisor.samplers import SCRAPE_TIMEOUT, counter_total
from grpo_tui.supervisor.spec import (
    ExecProbe,
    HttpProbe,
    LogLineProbe,
    Probe,
    ProgressProbe,
    TcpProbe,
)

Report = Callable[[bool, str], None]


class LogMatcher:
    """Watches output lines for a log-line probe's pattern (stops looking once matched)."""

    def __init__(self, pattern: str) -> None:
        self._regex = re.compile(pattern)
        self.matched = asyncio.Event()
        self.line = ""

    def __call__(self, line: str) -> None:
        if not self.matched.is_set() and self._regex.search(line):
            self.line = line
            self.matched.set()


class Prober(Protocol):
    """What probes do over the network (or the process table)."""

    async def check(self, probe: Probe) -> tuple[bool, str]:
        """Run a polled probe once; (passed, short message)."""
        ...

    async def counter(self, probe: ProgressProbe) -> float | None:
        """The sum of ``probe.counters`` now (None when it cannot be read)."""
        ...

    async def ask(self, probe: ProgressProbe, token: str | None) -> tuple[bool, str]:
        """Send the progress probe's request; (answered 2xx in time, what it saw)."""
        ...


class HttpProber:
    """The supervisor's prober: the run's HTTP client (``https`` probes, metrics, work
    requests) and bare connections for the rest."""

    def __init__(self, client: Callable[[], asyncio.Future[httpx.AsyncClient]]) -> None:
        self._client = client
        """The run's client, once it is open (it is built in a thread at the run's start)."""

    async def check(self, probe: Probe) -> tuple[bool, str]:
        return await check(probe, self._client())

    async def counter(self, probe: ProgressProbe) -> float | None:
        client = await asyncio.shield(self._client())
        try:
            response = await client.get(probe.metrics_url, timeout=SCRAPE_TIMEOUT)
        except httpx.HTTPError:
            return None
        return counter_total(response.text, probe.counters) if response.is_success else None

    async def ask(self, probe: ProgressProbe, token: str | None) -> tuple[bool, str]:
        client = await asyncio.shield(self._client())
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            response = await client.post(
                probe.url, json=probe.body, headers=headers, timeout=probe.timeout
            )
        except httpx.TimeoutException:
            return False, f"it timed out after {probe.timeout:g} s"
        except httpx.HTTPError as exc:
            return False, f"it failed: {type(exc).__name__}"
        if response.is_success:
            return True, f"it answered HTTP {response.status_code}"
        return False, f"it answered HTTP {response.status_code}: {response.text[:200]}"


async def check(probe: Probe, client: asyncio.Future[httpx.AsyncClient]) -> tuple[bool, str]:
    """Run a polled probe once; (passed, short message)."""
    try:
        match probe:
            case HttpProbe() if probe.url.startswith("http://"):
                return await _plain_http(probe)
            case HttpProbe():
                response = await (await asyncio.shield(client)).get(
                    probe.url, timeout=probe.timeout
                )
                return 200 <= response.status_code < 400, f"HTTP {response.status_code}"
            case TcpProbe():
                return await _tcp(probe)
            case ExecProbe():
                return await _exec(probe)
            case LogLineProbe():
                raise TypeError("log-line probes are awaited, not polled")
    except httpx.TimeoutException:
        return False, f"timed out after {probe.timeout:g} s"
    except httpx.HTTPError as exc:
        return False, type(exc).__name__
    raise AssertionError(f"unknown probe {probe!r}")


async def _plain_http(probe: HttpProbe) -> tuple[bool, str]:
    """``GET`` over a bare asyncio connection: the common loopback ``http://`` health check
    needs no TLS, so it need not wait for an HTTP client to load CA certificates."""
    url = urlsplit(probe.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    try:
        async with asyncio.timeout(probe.timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(
                    f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                    "Connection: close\r\n\r\n".encode()
                )
                status_line = await reader.readline()
            finally:
                writer.close()
    except TimeoutError:
        return False, f"timed out after {probe.timeout:g} s"
    except OSError as exc:
        return False, exc.strerror or type(exc).__name__
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        return False, "not an HTTP response"
    status = int(parts[1])
    return 200 <= status < 400, f"HTTP {status}"


async def _tcp(probe: TcpProbe) -> tuple[bool, str]:
    try:
        async with asyncio.timeout(probe.timeout):
            _, writer = await asyncio.open_connection(probe.host, probe.port)
    except TimeoutError:
        return False, f"timed out after {probe.timeout:g} s"
    except OSError as exc:
        return False, exc.strerror or str(exc)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True, f"connected to {probe.host}:{probe.port}"


async def _exec(probe: ExecProbe) -> tuple[bool, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            *probe.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        return False, f"cannot run {probe.command[0]}: {exc.strerror or exc}"
    try:
        async with asyncio.timeout(probe.timeout):
            code = await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return False, f"timed out after {probe.timeout:g} s"
    return code == 0, f"exit code {code}"


class _Changes:
    """Forwards a result to ``report`` only when it differs from the last one."""

    def __init__(self, report: Report) -> None:
        self._report = report
        self._last: tuple[bool, str] | None = None

    def __call__(self, ok: bool, message: str) -> None:
        if (ok, message) != self._last:
            self._last = (ok, message)
            self._report(ok, message)


async def wait_ready(
    probe: Probe,
    prober: Prober,
    report: Report,
    matcher: LogMatcher | None,
    clock: Clock,
) -> None:
    """Return once the probe passed ``success_threshold`` times in a row."""
    await clock.sleep(probe.initial_delay)
    if isinstance(probe, LogLineProbe):
        assert matcher is not None
        await matcher.matched.wait()
        report(True, f"matched: {matcher.line[:200]}")
        return
    changes = _Changes(report)
    streak = 0
    while True:
        ok, message = await prober.check(probe)
        changes(ok, message)
        streak = streak + 1 if ok else 0
        if streak >= probe.success_threshold:
            return
        await clock.sleep(probe.period)


async def watch_liveness(probe: Probe, prober: Prober, report: Report, clock: Clock) -> str:
    """Probe forever; return the last message once ``failure_threshold`` checks failed in a row.

    A log-line liveness probe only asks that the line was seen once, so it never fails here.
    """
    if isinstance(probe, LogLineProbe):
        await asyncio.Event().wait()
    await clock.sleep(probe.initial_delay)
    changes = _Changes(report)
    misses = 0
    while True:
        ok, message = await prober.check(probe)
        changes(ok, message)
        misses = 0 if ok else misses + 1
        if misses >= probe.failure_threshold:
            return message
        await clock.sleep(probe.period)


async def watch_progress(
    probe: ProgressProbe, prober: Prober, report: Report, clock: Clock, token: str | None
) -> str:
    """Probe forever; return what it saw once ``failure_threshold`` requests for work in a
    row failed, each sent after ``idle_after`` s in which the counters did not grow.

    The idle time counts from the start of the watch (the process just became ready), the
    counters' last growth, or the last request that passed, whichever is latest.
    """
    await clock.sleep(probe.initial_delay)
    changes = _Changes(report)
    progress_at = clock.now()
    last: float | None = None
    misses = 0
    while True:
        total = await prober.counter(probe)
        if total is not None:
            if last is not None and total > last:
                if misses:  # it works again: its health says so before the next request
                    changes(True, "requests completed again")
                progress_at, misses = clock.now(), 0
            last = total
        idle = clock.now() - progress_at
        if idle >= probe.idle_after:
            ok, message = await prober.ask(probe, token)
            if ok:
                progress_at, misses = clock.now(), 0
                changes(True, f"asked for work after {probe.idle_after:g} s idle, {message}")
            else:
                misses += 1
                saw = f"no request completed for {idle:.0f} s; asked for work, {message}"
                changes(False, saw)
                if misses >= probe.failure_threshold:
                    return saw
        await clock.sleep(probe.period)
