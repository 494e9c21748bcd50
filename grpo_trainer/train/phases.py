"""What the trainer's device is doing now, and how long each phase took in the last step.

The device cycles through ``generating`` (inference samples; the trainer waits for a
batch), ``sleeping`` (``colocate``: inference releases its memory), ``training`` (forward,
backward, optimizer step), ``syncing`` (weights to inference) and ``waking`` (``colocate``:
inference takes its memory back). Each change goes at once to the supervisor as a metrics
record ``{"phase/current": index into PHASES}`` (the dashboard shows it live); each step's
record carries ``phase/<name>_s``, the seconds spent in each phase since the last step.

Several ranks (one per GPU): every phase starts at a collective (the batch broadcast, the
sleep, the sync), so rank 0's current phase is every rank's device's; what differs is the
time each device spends in it (a rank that finishes training first waits in the sync), so
each step also carries ``phase/<name>_s/rank<r>`` for every rank (``per_rank``).
Torch-free: the dashboard imports ``PHASES`` to name the index.
"""

from __future__ import annotations

import time
from collections.abc import Callable

PHASES = ("generating", "sleeping", "training", "syncing", "waking")
CURRENT = "phase/current"


class PhaseClock:
    """Times phases; ``send`` gets ``(step, {"phase/current": index})`` on every change."""

    def __init__(self, send: Callable[[int, dict[str, float]], None], step: int) -> None:
        self.send = send
        self.current = "generating"
        self.since = time.perf_counter()
        self.totals: dict[str, float] = {}
        self.send(step, {CURRENT: float(PHASES.index(self.current))})

    def enter(self, phase: str, step: int) -> None:
        """Close the current phase and start ``phase`` (reported when it changes)."""
        now = time.perf_counter()
        self.totals[self.current] = self.totals.get(self.current, 0.0) + now - self.since
        self.since = now
        if phase != self.current:
            self.current = phase
            self.send(step, {CURRENT: float(PHASES.index(phase))})

    def move(self, seconds: float, source: str, target: str) -> None:
        """Re-attribute ``seconds`` already counted in ``source`` to ``target``.

        The sync's wake-up happens inside ``strategy.sync``; the strategy times it and the
        loop moves that time from ``syncing`` to ``waking``.
        """
        seconds = min(seconds, self.totals.get(source, 0.0))
        self.totals[source] = self.totals.get(source, 0.0) - seconds
        self.totals[target] = self.totals.get(target, 0.0) + seconds

    def take(self) -> dict[str, float]:
        """``phase/<name>_s`` for every phase this step went through; starts a new step."""
        totals, self.totals = self.totals, {}
        return {f"phase/{name}_s": seconds for name, seconds in totals.items()}


def per_rank(totals: list[dict[str, float]]) -> dict[str, float]:
    """``phase/<name>_s/rank<r>`` from every rank's ``PhaseClock.take()``, in rank order."""
    return {
        f"{key}/rank{rank}": seconds
        for rank, phases in enumerate(totals)
        for key, seconds in phases.items()
    }


def rank_times(latest: dict[str, float], name: str) -> list[float]:
    """The per-rank seconds of phase ``name`` in a step record, in rank order."""
    times = []
    while (value := latest.get(f"phase/{name}_s/rank{len(times)}")) is not None:
        times.append(value)
    return times
