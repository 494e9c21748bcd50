"""Per-cell results of a sweep (or of one run) from the run directories' ``metrics.jsonl``.

One :class:`RunResults` per run directory reads its metrics file incrementally (a live
sweep polls it every second) into a :class:`SeriesStore`, and summarises it as a
:class:`Summary`: step, reward (mean of the last :data:`REWARD_WINDOW` ``reward/mean``
values), the latest ``eval/mean@k``, KL, and the time and step at which the windowed
reward first reached the threshold. The sweep screen and the HTML report draw these.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_tui.run_state import SeriesStore
from grpo_tui.sweep.store import CellState, CellStatus, SweepDir

REWARD = "reward/mean"
KL = "kl"
EVAL_PREFIX = "eval/mean@"
REWARD_WINDOW = 5
"""Steps averaged for the reward column and the threshold (the quickstart's 5-step mean)."""

CURVE_METRICS = (REWARD, EVAL_PREFIX, KL, "loss", "mean_ratio", "tokens_per_s")
"""Metrics offered for the overlaid curves, in this order (a prefix ends with ``@``)."""


@dataclass
class Summary:
    """One row of the comparison table."""

    id: str
    overrides: dict[str, Any]
    state: CellState | str
    attempts: int
    step: int | None
    total_steps: int | None
    reward: float | None
    eval_name: str | None
    eval_value: float | None
    kl: float | None
    threshold_s: float | None
    threshold_step: int | None
    started_at: float | None
    elapsed_s: float | None
    job: str | None = None
    """The Slurm job id of a cell run as a batch job."""


class RunResults:
    """A run directory's metrics, read incrementally."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.store = SeriesStore(max_points=100_000)
        self.step: int | None = None
        self.total_steps: int | None = None
        self.first_t: float | None = None
        self.last_t: float | None = None
        self._offset = 0
        self._window: deque[float] = deque(maxlen=REWARD_WINDOW)
        self.reached: tuple[float, int | None] | None = None
        self._threshold: float | None = None

    def poll(self, threshold: float) -> bool:
        """Read what was appended since the last call; True when something new arrived."""
        if threshold != self._threshold:
            self._threshold = threshold
            self.reached = None
            self._window.clear()
            for t, step, value in self.store.series(REWARD):
                self._reward(t, step, value)
        path = self.run_dir / "metrics.jsonl"
        try:
            with path.open("rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return False
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self._offset += end
        for line in data[:end].splitlines():
            self._record(line)
        return end > 0

    def _record(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return
        if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
            return
        t = float(record.get("t", 0.0))
        step = record.get("step") if isinstance(record.get("step"), int) else None
        self.first_t = t if self.first_t is None else min(self.first_t, t)
        self.last_t = t if self.last_t is None else max(self.last_t, t)
        for name, value in record["data"].items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            self.store.add(name, t, step, float(value))
            if name == "training_steps":
                self.total_steps = int(value)
            elif name == REWARD:
                self._reward(t, step, float(value))
        if step is not None and "loss" in record["data"]:
            self.step = step if self.step is None else max(self.step, step)

    def _reward(self, t: float, step: int | None, value: float) -> None:
        self._window.append(value)
        full = len(self._window) == REWARD_WINDOW
        mean = sum(self._window) / len(self._window)
        if (
            self.reached is None
            and full
            and self._threshold is not None
            and mean >= self._threshold
        ):
            self.reached = (t, step)

    @property
    def reward(self) -> float | None:
        return sum(self._window) / len(self._window) if self._window else None

    def latest(self, name: str) -> float | None:
        return self.store.latest.get(name)

    def eval_metric(self) -> tuple[str | None, float | None]:
        """The latest ``eval/mean@k`` (largest k if several)."""
        names = [n for n in self.store.names() if n.startswith(EVAL_PREFIX)]
        if not names:
            return None, None
        name = max(names, key=lambda n: int(n.removeprefix(EVAL_PREFIX) or 0))
        return name, self.store.latest[name]

    def summary(
        self, id: str, overrides: dict[str, Any], status: CellStatus | None, now: float
    ) -> Summary:
        started = status.started_at if status is not None else None
        started = started or self.first_t  # a Slurm job seen only once it had ended
        ended = status.ended_at if status is not None else self.last_t
        if status is not None and status.state == "interrupted":
            ended = self.last_t
        elapsed = None
        if started is not None:
            elapsed = (ended or now) - started
        threshold_s = threshold_step = None
        if self.reached is not None and started is not None:
            threshold_s = self.reached[0] - started
            threshold_step = self.reached[1]
        eval_name, eval_value = self.eval_metric()
        return Summary(
            id=id,
            overrides=overrides,
            state=status.state if status is not None else ("done" if self.step else "-"),
            attempts=status.attempts if status is not None else 1,
            step=self.step,
            total_steps=self.total_steps,
            reward=self.reward,
            eval_name=eval_name,
            eval_value=eval_value,
            kl=self.latest(KL),
            threshold_s=threshold_s,
            threshold_step=threshold_step,
            started_at=started,
            elapsed_s=elapsed,
            job=status.job if status is not None else None,
        )


class SweepResults:
    """Every cell of a sweep: journal states plus each run directory's metrics."""

    def __init__(self, sweep: SweepDir) -> None:
        self.sweep = sweep
        self.record = sweep.read()
        self.cells = {c.id: RunResults(sweep.run_dir(c.id)) for c in self.record.cells}
        self.statuses: dict[str, CellStatus] = {}
        self._attempts: dict[str, int] = {}

    def poll(self, threshold: float) -> None:
        """Re-read the journal and whatever the run directories appended."""
        self.statuses = self.sweep.statuses()
        for cell_id, results in self.cells.items():
            attempts = self.statuses[cell_id].attempts
            if self._attempts.get(cell_id, attempts) != attempts:
                results = self.cells[cell_id] = RunResults(results.run_dir)  # a new attempt
            self._attempts[cell_id] = attempts
            results.poll(threshold)

    def summaries(self, now: float) -> list[Summary]:
        return [
            self.cells[c.id].summary(c.id, c.overrides, self.statuses.get(c.id), now)
            for c in self.record.cells
        ]

    def curves(self, metric: str) -> dict[str, list[tuple[float, int | None, float]]]:
        """``metric`` per cell (a prefix such as ``eval/mean@`` takes the largest k)."""
        out = {}
        for cell_id, results in self.cells.items():
            name = results.eval_metric()[0] if metric == EVAL_PREFIX else metric
            points = results.store.series(name) if name else []
            if points:
                out[cell_id] = points
        return out

    def metrics(self) -> list[str]:
        """The curve metrics at least one cell has, in :data:`CURVE_METRICS` order."""
        names = {n for r in self.cells.values() for n in r.store.names()}
        return [
            m
            for m in CURVE_METRICS
            if m in names or (m == EVAL_PREFIX and any(n.startswith(m) for n in names))
        ]
