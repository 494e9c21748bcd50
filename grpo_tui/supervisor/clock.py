"""The time source of process lives and their probes: the wall clock and sleeps.

Lives measure how long an incarnation ran (``reset_after``), when it became ready, and
sleep through backoffs and probe periods with it; a test hands a life a fake one
(``tests/supervisor/fakes.py``) and moves time itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """``now()``: seconds since the epoch; ``sleep(seconds)``: wait that long."""

    now: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


WALL = Clock()
