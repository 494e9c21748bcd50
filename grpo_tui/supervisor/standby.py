"""A standby: the next incarnation of a process, spawned and gated while the current one runs.

A process whose start is mostly imports (vLLM's CLI: 20-30 s) restarts in seconds if the
interpreter of its next incarnation has done them already. With ``spec.standby`` (which
needs ``prestart``) the process's life spawns one more incarnation once the current one is
ready, or, where the current one is itself an adopted standby (a restart), once it is
past its gate: restarts may follow each other soon (vLLM's imports take 16-20 s, a
``lora_restart`` sync comes every ~25 s on an H200) and the next one should find the
imports done. It does its imports and waits at its start gate (stdin), touching no
accelerator (its program's promise: ``grpo_trainer.start_gate``). The next start adopts
it: its output goes to the process's log from then on, and its gate opens with the spec's
command (the arguments may have changed, e.g. a restart onto a new adapter), so that it
becomes that incarnation. It is adopted only for a spec with the environment and working
directory it was spawned with (a running process cannot change either); otherwise it is
stopped and the start spawns afresh, as without a standby.

A standby that exits while it waits is reported and not replaced before the next
incarnation starts. It is stopped with its process (stop, kill, failure for good, end of
the run), never by a restart, which is what it is for. Its environment names it
``<name>~standby<N>``: the stop of one incarnation never touches it, and the watchdog and
the run's sweep find it by the run's tag like every other child.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from grpo_tui.supervisor.events import Notice
from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.process import Child, SpawnError, describe_exit
from grpo_tui.supervisor.spec import ProcessSpec

Spawn = Callable[[ProcessSpec, OutputSink, str | None], Awaitable[Child]]
Adopted = tuple[Child, "asyncio.Future[int]", list[str] | None]
"""An adopted standby: the child, the task that waits for its exit, and the command to hand
it at its gate (None: the one it was spawned with)."""

STOP_WAIT = 10.0
"""Seconds a standby (at its gate, nothing to save) has to exit on SIGTERM before SIGKILL."""
STANDBY_ADOPTED = "standby_adopted"
"""``Notice.code`` of a start that adopted the standby (``data``: its ``pid``, ``waited_s``
since it was spawned)."""


class Standby:
    """At most one gated spare incarnation of one process (see the module docstring)."""

    def __init__(
        self, name: str, log: Path, spawn: Spawn, publish: Callable[[Notice], None]
    ) -> None:
        self.name = name
        self.log = log
        self._spawn = spawn
        self._publish = publish
        self.child: Child | None = None
        self._exited: asyncio.Task[int] | None = None
        self._spawning: asyncio.Task[None] | None = None
        self._discarding: asyncio.Task[None] | None = None
        self._count = 0

    @property
    def waiting(self) -> bool:
        """A standby is spawned (or being spawned) and waits at its gate."""
        return self.child is not None or self._spawning is not None

    def keep(self, spec: ProcessSpec) -> None:
        """Spawn a standby for ``spec`` unless one waits or is being spawned."""
        if not self.waiting and self._discarding is None:
            self._spawning = asyncio.create_task(self._spawn_one(spec), name=f"standby:{self.name}")

    async def adopt(self, spec: ProcessSpec, sink: OutputSink) -> Adopted | None:
        """The standby as the next incarnation of ``spec``, its output now going to ``sink``;
        None when there is none, or it cannot run ``spec`` (then it is stopped)."""
        if self._spawning is not None:
            await asyncio.shield(self._spawning)
        child, exited = self.child, self._exited
        if child is None or exited is None:
            return None
        if exited.done() or not _fits(child.spec, spec):
            why = "it exited" if exited.done() else "the environment or directory changed"
            self._note(f"standby (pid {child.pid}) not used: {why}; spawning afresh")
            await self.discard()
            return None
        self.child = self._exited = None
        command = None if spec.command == child.spec.command else list(spec.command)
        spare, child.sink = child.sink, sink
        spare.end_of_stream()
        spare.close()
        waited = time.time() - child.started_at
        child.spec = spec
        child.started_at = time.time()
        self._note(
            f"adopting its standby (pid {child.pid}, spawned {waited:.1f} s ago)",
            code=STANDBY_ADOPTED,
            data={"pid": child.pid, "waited_s": round(waited, 1)},
        )
        return child, exited, command

    async def discard(self, sig: int = signal.SIGTERM) -> None:
        """Stop the standby (and one being spawned); returns once it is gone."""
        if self._discarding is None:
            self._discarding = asyncio.create_task(self._discard(sig))
        try:
            await asyncio.shield(self._discarding)
        finally:
            self._discarding = None

    async def _discard(self, sig: int) -> None:
        if self._spawning is not None:
            await asyncio.shield(self._spawning)  # it says itself what went wrong
        child, exited = self.child, self._exited
        self.child = self._exited = None
        if child is None or exited is None:
            return
        survivors = await child.stop(sig, STOP_WAIT)
        await exited
        child.sink.close()
        if survivors:
            pids = ", ".join(str(getattr(p, "pid", p)) for p in survivors)
            self._note(f"could not kill its standby's pids {pids}", "error")

    async def _spawn_one(self, spec: ProcessSpec) -> None:
        self._count += 1
        tag = f"{self.name}~standby{self._count}"
        sink = OutputSink(self.log)
        try:
            child = await self._spawn(spec, sink, tag)
        except SpawnError as error:
            self._note(f"standby not spawned: {error.reason}", "warning")
            return
        except Exception as error:  # a spare is best effort: the next start spawns afresh
            self._note(f"standby not spawned: {type(error).__name__}: {error}", "error")
            return
        finally:
            self._spawning = None
        self.child = child
        self._exited = asyncio.create_task(child.wait(), name=f"standby-exit:{self.name}")
        self._exited.add_done_callback(lambda task: self._gone(child, task))
        self._note(
            f"standby spawned (pid {child.pid}, output in {self.log.name}): it imports now "
            "and waits at its start gate; the next start adopts it"
        )

    def _gone(self, child: Child, task: asyncio.Task[int]) -> None:
        """A standby that exits while it waits: say so; the next start spawns afresh."""
        if self.child is not child or task.cancelled():
            return
        self.child = self._exited = None
        child.sink.close()
        code = task.exception() or describe_exit(task.result())
        tail = " | ".join(list(child.sink.ring)[-3:])
        self._note(f"standby (pid {child.pid}) {code} while it waited: {tail}", "warning")

    def _note(
        self, message: str, level: str = "info", code: str = "", data: dict[str, Any] | None = None
    ) -> None:
        notice = Notice(level=level, message=f"{self.name}: {message}", code=code, data=data or {})
        self._publish(notice)


def _fits(spawned: ProcessSpec, spec: ProcessSpec) -> bool:
    """A process spawned for ``spawned`` can become an incarnation of ``spec``."""
    return spec.standby and spawned.env == spec.env and spawned.cwd == spec.cwd
