"""Run-end accounting: when a supervised run ends, and with which exit code and reason.

``exit_with`` completing ends the run with 0, failing for good with 1; without it the run
ends once every process has completed or failed for good; a process that cannot go on
without one that failed for good ends it with 1 (``needs.py``); ``shutdown()`` (a stop
someone asked for: the dashboard's quit, a control request) ends it with 0. The first of
these decides the outcome; from then on the run is closing and nothing starts again. A run
stopped by a signal ends with 128 + its number: the faces (headless) decide that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from grpo_tui.supervisor.events import State
from grpo_tui.supervisor.record import ProcessRecord


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int
    reason: str


class RunEnd:
    """The outcome so far, the ``closing`` flag, and ``done`` (set when the run must end)."""

    def __init__(self, exit_with: str | None) -> None:
        self.exit_with = exit_with
        self.outcome: RunOutcome | None = None
        self.closing = False
        self.done = asyncio.Event()

    def changed(self, life: ProcessRecord, lives: Iterable[ProcessRecord]) -> None:
        """After a state change of ``life``: does the run end now?"""
        if self.outcome is not None:
            return
        if life.name == self.exit_with:
            if life.state == State.COMPLETED:
                self._finish(RunOutcome(0, f"{life.name} completed successfully"))
            elif life.state is State.FAILED:
                self._finish(RunOutcome(1, f"{life.name} failed: {life.last_reason}"))
        elif self.exit_with is None:
            self.all_done(lives)

    def all_done(self, lives: Iterable[ProcessRecord]) -> None:
        """Without ``exit_with``: end the run once every process completed or gave up."""
        lives = list(lives)
        if self.exit_with is not None or self.outcome is not None or not lives:
            return
        if all(life.state in (State.COMPLETED, State.FAILED) for life in lives):
            failed = [life.name for life in lives if life.state is State.FAILED]
            if failed:
                self._finish(RunOutcome(1, f"failed: {', '.join(failed)}"))
            else:
                self._finish(RunOutcome(0, "all processes completed"))

    def cannot_go_on(self, reason: str) -> None:
        """A process the run needs failed for good: the run ends with 1, unless decided."""
        if self.outcome is None:
            self._finish(RunOutcome(1, reason))

    def shutdown(self, reason: str) -> None:
        """A shutdown was asked for: closing from now on; the outcome, unless already set."""
        self.closing = True
        if self.outcome is None:
            self.outcome = RunOutcome(0, f"shutdown: {reason}")

    def final(self) -> RunOutcome:
        """The run's outcome once it has ended (``interrupted`` if nothing decided it)."""
        return self.outcome or RunOutcome(1, "interrupted")

    def _finish(self, outcome: RunOutcome) -> None:
        self.outcome = outcome
        self.closing = True
        self.done.set()
