"""The step timeline's records: what each process did, and when, as wall-clock spans.

Each process (each rank of a multi-GPU trainer) appends lines to its own bounded log
``timeline/<process>[.rank<r>].<NNNNNN>.jsonl``::

    {"step": 12, "role": "trainer", "spans": [["wait", 1.7e9, 1.7e9], ["forward_backward", ...]]}

Times are ``time.time()`` seconds, so every process's bars sit on one axis (hosts of a
cluster keep their clocks in step with NTP, to a few milliseconds). The trainer writes one
line per optimizer step; an environment one per report period, its overlapping requests
merged into busy intervals. :class:`SpanRecorder` collects spans on the caller's thread
(two clock reads and a list append each) and writes on the background writer's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from grpo_trainer.records.background import BackgroundWriter
from grpo_trainer.records.segments import SegmentedLog

TIMELINE_DIR = "timeline"
PHASES: dict[str, str] = {
    "generate": "generation",
    "room": "queue full",
    "wait": "data wait",
    "sleep": "sleep",
    "forward_backward": "forward+backward",
    "pause": "pause",
    "optimizer": "optimizer",
    "resume": "resume",
    "transfer": "sync transfer",
    "finish": "sync finish",
    "wake": "wake",
}
"""Phase name -> label. ``generate``: an environment's completion requests in flight;
``room``: an environment waiting for the queue to have room (back-pressure); ``wait``: the
trainer waiting for its batch; ``sleep`` / ``wake``: inference releasing / taking back the
device (``colocate``); ``pause`` / ``resume``: generation held around a weight update;
``transfer``: the rest of a weight sync (the copy, a save, a reload or a restart);
``finish``: the server making what it received its weights (vLLM's
``/finish_weight_update``)."""
SYNC_SPLIT = ("wake", "pause", "transfer", "finish", "resume")
"""The phases a weight sync is split into, in the order they happen."""
TIMELINE_MB = 64

Span = tuple[str, float, float]


def sync_split(sync_time: float, phases: dict[str, float]) -> dict[str, float]:
    """A sync's seconds by :data:`SYNC_SPLIT` phase, in order: a strategy's own ``wake``,
    ``pause``, ``finish`` and ``resume`` (``SyncResult.phases``) and ``transfer``, the rest
    of ``sync_time`` (its other named phases: vLLM's ``start`` and ``transfer``, a save, a
    load, a push). Phases that took no time are left out, ``transfer`` only when nothing
    was left for it."""
    named = {name: phases[name] for name in SYNC_SPLIT if name != "transfer" and name in phases}
    rest = sync_time - sum(named.values())
    split = {**named, "transfer": rest} if rest > 0 else named
    return {name: split[name] for name in SYNC_SPLIT if split.get(name, 0.0) > 0}


def merge(spans: list[Span]) -> list[Span]:
    """Overlapping spans of one phase joined into busy intervals (sorted by start)."""
    merged: list[Span] = []
    for phase, start, end in sorted(spans, key=lambda s: (s[0], s[1])):
        last = merged[-1] if merged else None
        if last is not None and last[0] == phase and start <= last[2]:
            merged[-1] = (phase, last[1], max(last[2], end))
        else:
            merged.append((phase, start, end))
    return sorted(merged, key=lambda s: s[1])


class SpanRecorder:
    """Collects one process's spans and writes them, a line per :meth:`flush`."""

    def __init__(
        self,
        run_dir: Path,
        stem: str,
        role: str,
        background: BackgroundWriter,
        *,
        max_mb: float = TIMELINE_MB,
    ) -> None:
        self.role = role
        self.background = background
        self.log = SegmentedLog(
            run_dir / TIMELINE_DIR, stem, ("jsonl",), max_bytes=int(max_mb * 2**20)
        )
        self.spans: list[Span] = []

    @contextmanager
    def span(self, phase: str) -> Iterator[None]:
        """Time the ``with`` body as one span of ``phase``."""
        start = time.time()
        try:
            yield
        finally:
            self.spans.append((phase, start, time.time()))

    def add(self, phase: str, start: float, end: float) -> None:
        self.spans.append((phase, start, end))

    def flush(self, step: int, *, merged: bool = False) -> None:
        """Write the spans collected since the last flush as ``step``'s line (``merged``:
        overlapping spans of a phase joined first)."""
        spans, self.spans = self.spans, []
        if not spans:
            return
        line = {"step": step, "role": self.role, "spans": spans}

        def write() -> None:
            if merged:
                line["spans"] = merge(spans)
            self.log.offsets()
            self.log.write({"jsonl": (json.dumps(line, separators=(",", ":")) + "\n").encode()})

        self.background.submit(write)

    def close(self) -> None:
        self.log.close()
