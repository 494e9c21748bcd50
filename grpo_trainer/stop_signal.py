"""A requested stop (SIGTERM / SIGINT) ends a server process with status 0.

uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the handler
that was there before it: this one, so ``finally`` blocks run and the exit reads as the
clean stop it was (not ``exit -15``). Before uvicorn runs (loading a model) the same
handler ends the process at once, also with status 0.
"""

from __future__ import annotations

import signal
from types import FrameType


def _exit_zero(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def exit_zero_on_stop() -> None:
    """Install the handler for SIGTERM and SIGINT (call from the main thread)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_zero)
