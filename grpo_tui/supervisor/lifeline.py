"""The supervisor's end of the watchdog's lifeline (the watchdog itself: ``watchdog.py``).

``start`` runs the watchdog in its own session, handing it the read end of a pipe whose
write end only this object holds; ``announce`` tells it, line by line, which process groups,
pids and Slurm job steps to end should the supervisor die; ``close`` closes the pipe, which
the watchdog reads as "the supervisor is gone": it ends what is left and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

from grpo_tui.supervisor.tree import RUN_ID_VAR

CLOSE_TIMEOUT = 10.0
"""Seconds ``close`` waits for the watchdog to finish its sweep and exit."""


class Lifeline:
    """The pipe to one run's watchdog process."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._watchdog: asyncio.subprocess.Process | None = None

    async def start(self, run_dir: Path, run_id: str) -> None:
        """Start the watchdog for ``run_id``; its errors go to ``logs/watchdog.log``."""
        read_end, write_end = os.pipe()
        errors = (run_dir / "logs" / "watchdog.log").open("ab")
        try:
            self._watchdog = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "grpo_tui.supervisor.watchdog",
                "--fd",
                str(read_end),
                "--run-id",
                run_id,
                pass_fds=(read_end,),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,
                # not tagged by whatever runs us (a test run, an outer supervisor): a sweep
                # of that tag must leave it alive to end our children once we are gone
                env={k: v for k, v in os.environ.items() if k != RUN_ID_VAR},
            )
        finally:
            os.close(read_end)
            errors.close()
        os.set_blocking(write_end, False)
        self._fd = write_end

    def announce(self, line: str) -> None:
        """Tell the watchdog about a group or pid; never blocks (a full pipe drops the line)."""
        if self._fd is None:
            return
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self._fd, line.encode() + b"\n")

    async def close(self) -> None:
        """Close the pipe and wait (bounded) for the watchdog to exit."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._watchdog is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self._watchdog.wait()
