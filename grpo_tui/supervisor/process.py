"""One incarnation of a child: spawn it in its own session, pump its output, stop it for good.

Stopping follows the order a careful person would: the shutdown signal to the process group
(and to known descendants that left the group), wait up to the timeout, SIGKILL all of them,
then *confirm*: scan for anything still in the group or still carrying the process's tag
and kill it, and ``scancel`` its Slurm job steps if it runs as one (``spec.slurm_step``).
A stop that returns has left nothing behind, or says what survived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.steps import end_steps, running_steps, signal_steps
from grpo_tui.supervisor.tree import (
    alive,
    descendants,
    group_members,
    members,
    signal_all,
    signal_group,
)

GATE_ENV = "GRPO_START_GATE"
"""Set to ``stdin`` for a ``prestart`` child (read by ``grpo_trainer.start_gate``)."""
READ_CHUNK = 256 * 1024
KILL_WAIT = 5.0
LEFTOVER_GRACE = 0.5
"""Seconds what a leader left behind gets between the shutdown signal and SIGKILL: with the
leader gone nothing coordinates its shutdown, and the restart waits for it."""
POLL = 0.02


class SpawnError(Exception):
    """The child could not be started at all; ``reason`` is short and human. ``permanent``:
    starting it again cannot help (no such command or directory, no permission), so it is
    not retried; other OS errors (out of memory or processes) may pass."""

    def __init__(self, reason: str, *, permanent: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent


class Child(Protocol):
    """One incarnation as a process life and its standby see it: :class:`ChildProcess`,
    or a test's fake. ``sink`` and ``spec`` change when a standby is adopted."""

    spec: ProcessSpec
    sink: OutputSink
    started_at: float
    known: dict[int, psutil.Process]

    @property
    def pid(self) -> int | None:
        """Its pid; None for a process that is not ours (a server attached by URL)."""
        ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int:
        """Its exit code, once it and what it left behind are gone."""
        ...

    async def stop(self, sig: int, timeout: float) -> list[psutil.Process | str]:
        """Signal, wait ``timeout``, SIGKILL, confirm; what survived."""
        ...

    async def kill(self) -> list[psutil.Process | str]:
        """SIGKILL at once, confirm; what survived."""
        ...

    async def open_gate(self, command: list[str] | None = None) -> None:
        """Let a ``prestart`` child go on (with ``command``: an adopted standby's)."""
        ...

    def refresh_tree(self) -> list[psutil.Process]:
        """Its live descendants now."""
        ...


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class ChildProcess:
    """A spawned child; ``announce`` tells the watchdog about groups and pids to guard.

    ``tag`` is the process name in its environment (``GRPO_TUI_PROCESS``), which the stop's
    scan looks for: the spec's name, or a standby's own tag (``lifecycle.Standby``), so
    that stopping one incarnation never touches a standby waiting beside it. ``sink`` may
    be swapped while the child runs (a standby's output goes to the process's log once it
    is adopted).
    """

    spec: ProcessSpec
    run_id: str
    sink: OutputSink
    announce: Callable[[str], None]
    proc: asyncio.subprocess.Process
    tag: str
    started_at: float = field(default_factory=time.time)
    known: dict[int, psutil.Process] = field(default_factory=dict)
    _pump: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the child leads its own session and group

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @classmethod
    async def spawn(
        cls,
        spec: ProcessSpec,
        *,
        env: Mapping[str, str],
        run_id: str,
        sink: OutputSink,
        announce: Callable[[str], None],
        tag: str | None = None,
    ) -> ChildProcess:
        if spec.cwd is not None and not Path(spec.cwd).is_dir():
            raise SpawnError(f"working directory not found: {spec.cwd}")
        if spec.slurm_step is not None:
            announce(f"step {spec.slurm_step}")  # before srun exists: no window unguarded
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.command,
                stdin=asyncio.subprocess.PIPE if spec.prestart else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=spec.cwd,
                env=dict(env),
                start_new_session=True,
            )
        except FileNotFoundError:
            raise SpawnError(f"command not found: {spec.command[0]}") from None
        except PermissionError:
            raise SpawnError(f"permission denied: {spec.command[0]}") from None
        except OSError as exc:
            reason = f"cannot start {spec.command[0]}: {exc.strerror or exc}"
            raise SpawnError(reason, permanent=False) from None
        announce(f"pgid {proc.pid}")
        child = cls(
            spec=spec,
            run_id=run_id,
            sink=sink,
            announce=announce,
            proc=proc,
            tag=tag or spec.name,
        )
        child._pump = asyncio.create_task(child._pump_output(), name=f"output:{spec.name}")
        return child

    async def open_gate(self, command: list[str] | None = None) -> None:
        """Tell a ``prestart`` child that its dependencies are met (``start`` on its stdin);
        a standby is handed the ``command`` it is to run (``grpo_trainer.start_gate``)."""
        stdin = self.proc.stdin
        assert stdin is not None, "only a prestart child has a start gate"
        line = "start" if command is None else f"start {json.dumps(command)}"
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it died meanwhile
            stdin.write(f"{line}\n".encode())
            await stdin.drain()
        stdin.close()

    async def _pump_output(self) -> None:
        stream = self.proc.stdout
        assert stream is not None
        while chunk := await stream.read(READ_CHUNK):
            self.sink.feed(chunk)
        self.sink.end_of_stream()

    async def wait(self) -> int:
        """Exit code of the leader, once everything it left behind is stopped too.

        The leader's exit is watched on its pid (a pidfd), not on its output: asyncio's
        ``Process.wait`` returns only once the output pipe closes too, and a descendant
        that inherited it (vLLM's engine core) keeps it open after the leader died. What
        is left is ended at once (``LEFTOVER_GRACE``), which closes the pipe.
        """
        exited = asyncio.ensure_future(self.proc.wait())
        leader = asyncio.ensure_future(self._leader_gone())
        try:
            await asyncio.wait({exited, leader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            leader.cancel()
        if await self._scan():
            await self.stop(self.spec.shutdown.signum, LEFTOVER_GRACE)
        else:
            await self._clear_leftovers(scanned=[])
        return await exited

    async def _leader_gone(self) -> None:
        """Return once the leader process has exited (its pidfd turns readable)."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return  # exited and already reaped
        loop = asyncio.get_running_loop()
        gone = loop.create_future()

        def readable() -> None:
            if not gone.done():
                gone.set_result(None)

        loop.add_reader(pidfd, readable)
        try:
            await gone
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)

    async def send_signal(self, sig: int) -> bool:
        """``sig`` to the process: a Slurm step's tasks get it from Slurm on every node
        (``srun`` would make a SIGTERM a kill); any other child on its process group.
        True when Slurm delivered it (to every process of the step)."""
        if self.spec.slurm_step is not None:
            steps = await asyncio.to_thread(running_steps, {self.spec.slurm_step})
            if steps:
                await asyncio.to_thread(signal_steps, steps, sig)
                return True
        signal_group(self.pgid, sig)
        return False

    def refresh_tree(self) -> list[psutil.Process]:
        """Snapshot the live tree; new descendants are remembered (and told to the watchdog)."""
        tree = descendants(self.pid) if self.returncode is None else []
        for proc in tree:
            if proc.pid not in self.known:
                self.known[proc.pid] = proc
                try:
                    self.announce(f"pid {proc.pid} {proc.create_time()}")
                except psutil.Error:
                    continue
        return tree

    async def stop(self, sig: int, timeout: float) -> list[psutil.Process | str]:
        """Signal, wait ``timeout``, SIGKILL, confirm; returns survivors (normally empty)."""
        self.refresh_tree()
        others = self._outside_group(await self._scan())
        if sig == signal.SIGKILL:
            signal_group(self.pgid, sig)
            signal_all(others, sig)
        elif not await self.send_signal(sig):
            signal_all(others, sig)
        if not await self._gone_within(timeout, others):
            signal_group(self.pgid, signal.SIGKILL)
            signal_all(others, signal.SIGKILL)
            await self._gone_within(KILL_WAIT, others)
        return await self._clear_leftovers()

    async def kill(self) -> list[psutil.Process | str]:
        """SIGKILL at once (no grace), then confirm like ``stop``."""
        return await self.stop(signal.SIGKILL, KILL_WAIT)

    async def _clear_leftovers(
        self, scanned: list[psutil.Process] | None = None
    ) -> list[psutil.Process | str]:
        """SIGKILL anything still in the group or tagged with this process (``scanned``: a
        scan just made), cancel its job steps still running; wait; report what survived
        (processes, step ids)."""
        leftovers = await self._scan() if scanned is None else scanned
        if leftovers:
            signal_all(leftovers, signal.SIGKILL)
            await self._gone_within(KILL_WAIT, leftovers)
        steps: list[str] = []
        if self.spec.slurm_step is not None:
            steps = await asyncio.to_thread(end_steps, {self.spec.slurm_step})
        if self._pump is not None:
            try:
                async with asyncio.timeout(KILL_WAIT):
                    await asyncio.shield(self._pump)
            except TimeoutError:
                self._pump.cancel()
        survivors: list[psutil.Process | str] = [*alive(leftovers), *steps]
        if not survivors:
            self.announce(f"gone {self.pgid}")
        return survivors

    async def _scan(self) -> list[psutil.Process]:
        """Group members, tagged processes and remembered descendants still alive."""
        found = {p.pid: p for p in alive(self.known.values())}
        scanned = await asyncio.to_thread(members, self.pgid, self.run_id, self.tag)
        found.update({p.pid: p for p in scanned})
        return list(found.values())

    def _outside_group(self, procs: list[psutil.Process]) -> list[psutil.Process]:
        outside = []
        for proc in procs:
            try:
                if os.getpgid(proc.pid) != self.pgid:
                    outside.append(proc)
            except OSError:
                continue
        return outside

    async def _gone_within(self, seconds: float, others: list[psutil.Process]) -> bool:
        """Poll until the leader, its group and ``others`` are gone; False on timeout."""
        deadline = time.monotonic() + seconds
        while True:
            if self.returncode is not None and not alive(others) and self._group_empty():
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL)

    def _group_empty(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return not group_members(self.pgid)
