"""Pause / resume of generation, with vLLM's three pause modes.

- ``wait``: admit no new request; return once the running ones have finished. Used
  around an in-place weight update so no sequence mixes two policies.
- ``keep``: admit no new request and freeze the running ones between decode steps;
  they continue on resume.
- ``abort``: admit no new request; the running ones end at their next decode step with
  ``finish_reason="abort"``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

PauseMode = Literal["abort", "wait", "keep"]


class Aborted(Exception):
    """A running request was aborted by ``pause(mode="abort")``."""


class GenerationGate:
    """Admission control for requests and a checkpoint between decode steps."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._paused = False
        self._freeze = False
        self._abort = False
        self.running = 0
        self.waiting = 0

    @property
    def paused(self) -> bool:
        """True between ``pause`` and ``resume``."""
        return self._paused

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Hold a request slot; blocks while paused."""
        with self._cond:
            self.waiting += 1
            self._cond.wait_for(lambda: not self._paused)
            self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            self.leave()

    def try_enter(self) -> bool:
        """Take a request slot unless paused, without blocking (for an event loop);
        the holder gives it back with ``leave``."""
        with self._cond:
            if self._paused:
                return False
            self.running += 1
            return True

    def leave(self) -> None:
        """Give back a request slot taken by ``admit`` or ``try_enter``."""
        with self._cond:
            self.running -= 1
            self._cond.notify_all()

    def checkpoint(self) -> None:
        """Called between decode steps: blocks while frozen, raises ``Aborted`` on abort."""
        with self._cond:
            self._cond.wait_for(lambda: not self._freeze)
            if self._abort:
                raise Aborted

    def pause(self, mode: PauseMode, timeout: float | None = None) -> bool:
        """Stop admitting requests; for ``wait``/``abort`` wait until none is running.

        Returns False if ``timeout`` passed with requests still running.
        """
        with self._cond:
            self._paused = True
            self._freeze = mode == "keep"
            self._abort = mode == "abort"
            self._cond.notify_all()
            if mode == "keep":
                return True
            done = self._cond.wait_for(lambda: self.running == 0, timeout=timeout)
            self._abort = False
            return done

    def resume(self) -> None:
        """Admit requests again and unfreeze the running ones."""
        with self._cond:
            self._paused = False
            self._freeze = False
            self._abort = False
            self._cond.notify_all()
