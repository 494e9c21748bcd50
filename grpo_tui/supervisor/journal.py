"""Where the supervisor's events go: subscribers and the run directory.

Every event goes to the bus (any number of subscribers) and, except log lines and metrics
records, to ``events.jsonl``; every metrics record to the in-memory store and
``metrics.jsonl``. Process output reaches subscribers as one ``LogBatch`` per process at
most every 50 ms (the log files themselves are written as the bytes arrive).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_tui.supervisor.bus import EventBus, Subscription
from grpo_tui.supervisor.events import Event, LogBatch, MetricsRecord, Notice
from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.metrics import MetricsStore

BATCH_INTERVAL = 0.05


class JsonlWriter:
    """Appends one JSON object per line and flushes it, so a crash loses at most one line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._file.closed:
            return
        self._file.write(json.dumps(record, default=str, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class Journal:
    """The bus, the metrics store, the two JSON-lines files and the output batches of the
    processes whose sinks it is given (one per process, for the whole run)."""

    def __init__(self, sinks: Mapping[str, OutputSink]) -> None:
        self.metrics = MetricsStore()
        self._bus = EventBus()
        self._sinks = sinks
        self._events: JsonlWriter | None = None
        self._metrics: JsonlWriter | None = None
        self._dirty = asyncio.Event()

    def subscribe(self, max_pending: int) -> Subscription:
        return self._bus.subscribe(max_pending)

    def open(self, run_dir: Path) -> None:
        """Open ``events.jsonl`` and ``metrics.jsonl``; new output lines wake the batcher."""
        self._events = JsonlWriter(run_dir / "events.jsonl")
        self._metrics = JsonlWriter(run_dir / "metrics.jsonl")
        for sink in self._sinks.values():
            sink.on_lines = self._dirty.set

    def close(self) -> None:
        """Publish the last output lines, close the log files and the journals."""
        self.flush_logs()
        for sink in self._sinks.values():
            sink.close()
        for writer in (self._events, self._metrics):
            if writer is not None:
                writer.close()

    def publish(self, event: Event) -> None:
        self._bus.publish(event)
        if self._events is not None and not isinstance(event, LogBatch | MetricsRecord):
            self._events.write(event.to_json())

    def notice(self, message: str, level: str = "info") -> None:
        self.publish(Notice(level=level, message=message))

    def record_metrics(self, record: MetricsRecord) -> None:
        self.metrics.add(record.t, record.step, record.data)
        if self._metrics is not None:
            self._metrics.write(
                {
                    "type": "metrics",
                    "process": record.process,
                    "step": record.step,
                    "t": record.t,
                    "data": record.data,
                }
            )
        self.publish(record)

    async def batch_logs(self) -> None:
        """Publish pending output lines as one LogBatch per process, at most every 50 ms."""
        last = 0.0
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            wait = last + BATCH_INTERVAL - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            last = time.monotonic()
            self.flush_logs()

    def flush_logs(self) -> None:
        for name, sink in self._sinks.items():
            lines = sink.take_pending()
            if lines:
                self.publish(LogBatch(process=name, lines=tuple(lines)))
            sink.file.flush()
