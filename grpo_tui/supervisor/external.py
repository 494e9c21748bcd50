"""A process that is not ours, as a life sees it: attached, probed, never signalled.

A spec with ``external`` (``spec.External``) names a process someone else runs, at a URL
(a server kept between runs). Its life is like any other's, with another spawn:
"spawning" runs the spec's ``command``, the attach command, which is ours; the incarnation
is the attachment, which lasts until the life lets it go. So the table needs no new state:
PENDING -> STARTING (attaching) -> READY (its readiness probe passed: the attach command
said it is attached) -> UNHEALTHY when its liveness probe fails (it is unreachable) ->
BACKOFF -> STARTING (attaching again) ...; a stop is STOPPING -> STOPPED without a signal
to it. :class:`ExternalChild` is that incarnation: no pid of ours (``pid`` None); ``wait``
ends when the attach command fails or the attachment is let go; ``stop`` and ``kill``
signal only the attach command if it still runs, and let go; ``stop`` at the run's end
(and only then: not on a restart or a loss) first runs ``External.detach`` to completion,
bounded by the spec's shutdown timeout; the detach command must leave alone a process
the run no longer has a claim on (the external process is the detach command's business).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import psutil

from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.process import Child, SpawnError
from grpo_tui.supervisor.spec import ProcessSpec

SpawnProcess = Callable[[ProcessSpec, OutputSink, "str | None"], Awaitable[Child]]
"""Spawns one of our processes (``RunResources.spawn``)."""


@dataclass
class ExternalChild:
    """One attachment to an external process (see the module docstring)."""

    spec: ProcessSpec
    sink: OutputSink
    attaching: Child
    """The attach command (ours), which ends once attached or on failure."""
    spawn_process: SpawnProcess
    closing: Callable[[], bool]
    """True once the run's shutdown has begun: a stop then runs the detach command."""
    started_at: float = field(default_factory=time.time)
    _released: asyncio.Event = field(default_factory=asyncio.Event)
    _code: int | None = None

    @classmethod
    async def attach(
        cls,
        spec: ProcessSpec,
        sink: OutputSink,
        spawn_process: SpawnProcess,
        closing: Callable[[], bool],
    ) -> ExternalChild:
        """Start attaching: the attach command runs, its output in the process's log."""
        if spec.external is None:
            raise ValueError(f"{spec.name} is not external")
        command = await spawn_process(spec, sink, None)
        return cls(spec, sink, command, spawn_process, closing)

    @property
    def pid(self) -> None:
        """No process of ours."""
        return None

    @property
    def known(self) -> dict[int, psutil.Process]:
        return self.attaching.known

    @property
    def returncode(self) -> int | None:
        """None while attaching or attached; the attach command's code when it failed,
        0 once let go."""
        return self._code

    async def wait(self) -> int:
        """The attach command's exit code when it failed; else 0 once the attachment is
        let go (``stop``, ``kill``)."""
        code = await self.attaching.wait()
        if code != 0 and self._code is None:
            self._code = code
            return code
        await self._released.wait()
        return self._code or 0

    async def stop(self, sig: int, timeout: float) -> list[psutil.Process | str]:
        """Stop the attach command if it still runs; at the run's end run the detach
        command (whatever the attach command got to: it may have changed the process
        before it was stopped); let go. Nothing is ever sent to the external process."""
        survivors: list[psutil.Process | str] = []
        if self.attaching.returncode is None:
            survivors += await self.attaching.stop(sig, timeout)
        if self.closing():
            survivors += await self._detach(timeout)
        self._let_go()
        return survivors

    async def kill(self) -> list[psutil.Process | str]:
        """Kill the attach command if it still runs (no detach command: a kill is now)."""
        survivors: list[psutil.Process | str] = []
        if self.attaching.returncode is None:
            survivors = await self.attaching.kill()
        self._let_go()
        return survivors

    async def send_signal(self, sig: int) -> bool:
        raise ProcessLookupError(f"{self.spec.name} is external: not ours to signal")

    async def open_gate(self, command: list[str] | None = None) -> None:
        """No start gate: an external process is never prestarted."""

    def refresh_tree(self) -> list[psutil.Process]:
        """The attach command's tree while it runs (nothing of the external process)."""
        return self.attaching.refresh_tree() if self.attaching.returncode is None else []

    def _let_go(self) -> None:
        if self._code is None:
            self._code = 0
        self._released.set()

    async def _detach(self, timeout: float) -> list[psutil.Process | str]:
        """Run the spec's detach command to completion, at most ``timeout`` seconds."""
        external = self.spec.external
        assert external is not None
        if not external.detach:
            return []
        spec = self.spec.model_copy(update={"command": external.detach, "external": None})
        try:
            command = await self.spawn_process(spec, self.sink, None)
        except SpawnError as error:
            self.sink.feed(f"detach command could not start: {error.reason}\n".encode())
            return []
        try:
            async with asyncio.timeout(timeout):
                await command.wait()
        except TimeoutError:
            self.sink.feed(f"detach command still running after {timeout:g} s: stopped\n".encode())
            return await command.stop(self.spec.shutdown.signum, 1.0)
        return []
