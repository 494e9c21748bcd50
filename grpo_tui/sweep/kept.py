"""One inference server kept for a whole sweep (``grpo-tui sweep --keep-server``, issue 37).

The sweep starts ``grpo-tui serve PROFILE`` once, before its first cell, in its own
session (its output in ``SWEEP/server/console.log``, its run directory
``SWEEP/server/run``); every cell then runs attached to it (``--inference-url``), one after
another (the server's lease takes one run at a time), each reset to the base at its start.
After the last cell (or on a stop) the server gets SIGINT, the Ctrl-C ``serve`` stops in
order on, and the sweep waits for it. If the sweep itself dies, the kernel sends ``serve``
SIGTERM (``PR_SET_PDEATHSIG``, as for cells), and its supervisor stops its server.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from grpo_trainer.serve.lease import LEASE_PATH

START_TIMEOUT = 900.0
"""Seconds the server may take to answer (vLLM: imports, weights, compile, graphs)."""
SAY_EVERY = 15.0
STOP_TIMEOUT = 120.0


class KeptServer:
    """``grpo-tui serve PROFILE`` for the length of a sweep."""

    def __init__(
        self,
        profile: Path,
        url: str,
        directory: Path,
        log: Callable[[str], None],
    ) -> None:
        self.profile = profile
        self.url = url
        self.directory = directory
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, preexec: Callable[[], None] | None = None) -> None:
        """Start ``serve`` and wait until its server answers with its lease route; raises
        ``RuntimeError`` (with the end of its console) when it exits or takes too long.
        ``preexec``: run in the child before exec (the sweep's parent-death signal)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        run_dir = self.directory / "run"
        if run_dir.exists():  # a sweep started again keeps the last server's files aside
            run_dir.rename(self.directory / f"run-{time.strftime('%Y%m%d-%H%M%S')}")
        command = [sys.executable, "-m", "grpo_tui", "serve", str(self.profile)]
        command += ["--run-dir", str(run_dir)]
        with (self.directory / "console.log").open("ab") as output:
            self.proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        self.log(f"kept server starting (pid {self.proc.pid}): {self.url}")
        began = time.monotonic()
        said = began
        async with httpx.AsyncClient(timeout=2.0) as http:
            while not await self._answers(http):
                if self.proc.returncode is not None:
                    raise RuntimeError(
                        f"grpo-tui serve exited {self.proc.returncode}: {self._tail()}"
                    )
                now = time.monotonic()
                if now - began > START_TIMEOUT:
                    await self.stop()
                    raise RuntimeError(f"no server at {self.url} after {START_TIMEOUT:.0f} s")
                if now - said >= SAY_EVERY:
                    said = now
                    self.log(f"waiting for the kept server at {self.url} ({now - began:.0f} s)")
                await asyncio.sleep(0.25)
        self.log(f"kept server ready at {self.url} after {time.monotonic() - began:.0f}s")

    async def _answers(self, http: httpx.AsyncClient) -> bool:
        try:
            return (await http.get(f"{self.url}{LEASE_PATH}")).status_code == 200
        except httpx.HTTPError:
            return False

    async def stop(self) -> int | None:
        """Ctrl-C to ``serve`` (an ordered stop), SIGKILL to its group if it lingers."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                code = await proc.wait()
        except TimeoutError:
            proc.kill()
            code = await proc.wait()
        self.log(f"kept server stopped (exit {code})")
        return code

    def _tail(self) -> str:
        console = self.directory / "console.log"
        text = console.read_text(errors="replace") if console.exists() else ""
        return text[-2000:]
