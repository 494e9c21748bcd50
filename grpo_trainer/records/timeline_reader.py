"""Reads a run's timeline (``timeline.py``): every process's spans, incrementally, by lane.

A lane is one writer (a process, or one rank of a multi-GPU trainer). Steps are the
trainer's: step N's window runs from the first to the last span any trainer lane wrote for
it (its wait for the batch to its sync). :meth:`Timeline.breakdown` says where a step's time
went on each lane: the seconds of each phase inside the window, and what is left, idle;
the parts add up to the window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grpo_trainer.records.segments import list_segments, read_after, segment_path
from grpo_trainer.records.timeline import PHASES, TIMELINE_DIR

PHASE_NAMES = tuple(PHASES)
IDLE = "idle"


@dataclass
class Lane:
    """One writer's spans, in the order written (start times ascending)."""

    name: str
    role: str
    _rows: list[tuple[int, float, float, int]] = field(default_factory=list)
    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, step: int, spans: list[list[object]]) -> None:
        for phase, start, end in spans:
            if phase in PHASES:
                self._rows.append((PHASE_NAMES.index(str(phase)), float(start), float(end), step))  # type: ignore[arg-type]
        self._arrays = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(phase code, start, end, step)`` arrays, sorted by start."""
        if self._arrays is None:
            rows = sorted(self._rows, key=lambda r: r[1])
            table = np.array(rows, dtype=float).reshape(-1, 4)
            self._arrays = (
                table[:, 0].astype(np.int16),
                table[:, 1],
                table[:, 2],
                table[:, 3].astype(np.int64),
            )
        return self._arrays

    def window(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(phase, start, end)`` of the spans that overlap ``[t0, t1]``."""
        phase, start, end, _ = self.arrays()
        last = np.searchsorted(start, t1, side="right")
        first = max(0, np.searchsorted(start, t0, side="left") - 64)  # a long span may start
        chosen = slice(first, last)  # earlier: look back a few spans, then test the end
        keep = end[chosen] > t0
        return phase[chosen][keep], start[chosen][keep], end[chosen][keep]

    def __len__(self) -> int:
        return len(self._rows)


class Timeline:
    """Every lane of ``run_dir/timeline``; :meth:`poll` reads what was appended since."""

    def __init__(self, run_dir: Path) -> None:
        self.directory = run_dir / TIMELINE_DIR
        self.lanes: dict[str, Lane] = {}
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._steps: dict[int, tuple[float, float]] = {}

    def poll(self) -> int:
        """Read new lines of every segment; returns how many."""
        new = 0
        for stem, segments in sorted(list_segments(self.directory, "jsonl").items()):
            for segment in segments:
                path = segment_path(self.directory, stem, segment, "jsonl")
                for line in self._new_lines(path):
                    new += self._apply(stem, line)
        if new:
            self.lanes = dict(sorted(self.lanes.items(), key=lambda kv: _lane_order(kv[1])))
        return new

    def _new_lines(self, path: Path) -> list[bytes]:
        offset = self._offsets.get(path, 0)
        data = read_after(path, offset)
        if data is None:
            return []
        self._offsets[path] = offset + len(data)
        *lines, self._partial[path] = (self._partial.get(path, b"") + data).split(b"\n")
        return lines

    def _apply(self, stem: str, line: bytes) -> int:
        try:
            record = json.loads(line)
            step, role, spans = int(record["step"]), str(record["role"]), record["spans"]
        except (ValueError, KeyError, TypeError):
            return 0
        lane = self.lanes.get(stem)
        if lane is None:
            lane = self.lanes[stem] = Lane(stem, role)
        lane.add(step, spans)
        if role == "trainer" and spans:
            low = min(float(s[1]) for s in spans)
            high = max(float(s[2]) for s in spans)
            old = self._steps.get(step)
            self._steps[step] = (
                (low, high) if old is None else (min(old[0], low), max(old[1], high))
            )
        return 1

    def steps(self) -> list[int]:
        """The trainer's steps, ascending."""
        return sorted(self._steps)

    def step_window(self, step: int) -> tuple[float, float]:
        return self._steps[step]

    def span_of(self, first: int, last: int) -> tuple[float, float]:
        """The time from the start of step ``first`` to the end of step ``last``."""
        windows = [w for s, w in self._steps.items() if first <= s <= last]
        return min(w[0] for w in windows), max(w[1] for w in windows)

    def breakdown(self, t0: float, t1: float) -> dict[str, dict[str, float]]:
        """Seconds of each phase on each lane within ``[t0, t1]``, and ``idle``: the seconds
        no phase covered. A breakdown: the parts add up to the window. A phase's overlapping
        spans (an environment's concurrent requests) count once, and an instant two phases
        cover (an environment generating while it waits for room in the queue) counts for
        the first of them in ``PHASES`` order."""
        result: dict[str, dict[str, float]] = {}
        for name, lane in self.lanes.items():
            phase, start, end = lane.window(t0, t1)
            clipped_start, clipped_end = np.maximum(start, t0), np.minimum(end, t1)
            spent = {}
            covered = np.zeros(0, dtype=bool)
            busy = 0.0
            for code in np.unique(phase).tolist():  # ascending: PHASES order
                covered = covered | (phase == code) if len(covered) else phase == code
                now_busy = _union_length(clipped_start[covered], clipped_end[covered])
                if now_busy > busy:
                    spent[PHASE_NAMES[code]] = now_busy - busy
                busy = now_busy
            spent[IDLE] = max(0.0, (t1 - t0) - busy)
            result[name] = spent
        return result


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    if not len(starts):
        return 0.0
    order = np.argsort(starts)
    total, current_start, current_end = 0.0, starts[order[0]], ends[order[0]]
    for s, e in zip(starts[order[1:]], ends[order[1:]], strict=True):
        if s > current_end:
            total += current_end - current_start
            current_start, current_end = s, e
        else:
            current_end = max(current_end, e)
    return float(total + current_end - current_start)


def _lane_order(lane: Lane) -> tuple[int, str]:
    return (0 if lane.role == "trainer" else 1, lane.name)
