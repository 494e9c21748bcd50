"""The in-memory metrics time series: bounded per name, newest value at hand for the UI."""

from __future__ import annotations

import math
from collections import deque

SERIES_POINTS = 10_000


class MetricsStore:
    """``name -> deque[(t, step, value)]``; each series keeps its last ``points`` samples."""

    def __init__(self, points: int = SERIES_POINTS) -> None:
        self.points = points
        self._series: dict[str, deque[tuple[float, int | None, float]]] = {}
        self._latest: dict[str, float] = {}

    def add(self, t: float, step: int | None, data: dict[str, float]) -> None:
        """Record numeric values; non-numbers and NaN/inf are skipped, not stored."""
        for name, value in data.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            value = float(value)
            if not math.isfinite(value):
                continue
            series = self._series.get(name)
            if series is None:
                series = self._series[name] = deque(maxlen=self.points)
            series.append((t, step, value))
            self._latest[name] = value

    def latest(self) -> dict[str, float]:
        return dict(self._latest)

    def series(self, name: str) -> list[tuple[float, int | None, float]]:
        return list(self._series.get(name, ()))

    def names(self) -> list[str]:
        return sorted(self._series)
