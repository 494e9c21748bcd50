"""How an environment waits: exponential backoff, and the stop flag every wait ends on."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass


@dataclass
class Backoff:
    """Exponential backoff with a cap: 0.1 s, 0.2 s, ... up to ``cap``; reset on success."""

    first: float = 0.1
    cap: float = 5.0
    current: float = 0.0

    def next(self) -> float:
        self.current = self.first if self.current == 0 else min(self.current * 2, self.cap)
        return self.current

    def reset(self) -> None:
        self.current = 0.0


class StopFlag:
    """Set once the environment is asked to stop; :meth:`sleep` ends early on it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when the stop comes first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._event.wait()
