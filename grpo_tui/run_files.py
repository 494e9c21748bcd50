"""Rebuild a :class:`RunState` from a run directory (``grpo-tui view``), read-only.

Events come from ``events.jsonl`` (``ProcessPlanned`` records give each row its role and
port), metrics from ``metrics.jsonl`` (the complete record:
the event stream's metrics copies are skipped when it exists), and each process's output
from the tail of ``logs/<process>.log``. Lines that are not valid JSON are counted and
skipped: a run killed mid-write still opens.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from grpo_tui.run_state import RunState
from grpo_tui.supervisor import events as ev
from grpo_tui.supervisor.events import Event, MetricsRecord, State

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        ev.ProcessPlanned,
        ev.StateChanged,
        ev.ProbeResult,
        ev.LogBatch,
        ev.Restarting,
        ev.MetricsRecord,
        ev.RequestReceived,
        ev.ResourceSample,
        ev.GpuSample,
        ev.Notice,
        ev.NeedLost,
        ev.NeedRegained,
        ev.Stalled,
    )
}
TAIL_BYTES = 1 << 20
"""How much of the end of each log file the viewer reads."""


def event_from_json(record: dict[str, Any]) -> Event | None:
    """The typed event of one ``events.jsonl`` line (``None`` for an unknown type or a
    record missing a field)."""
    cls = EVENT_TYPES.get(str(record.get("type")))
    if cls is None:
        return None
    names = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in record.items() if k in names}
    try:
        if cls is ev.StateChanged:
            kwargs["old"], kwargs["new"] = State(kwargs["old"]), State(kwargs["new"])
        if cls is ev.LogBatch:
            kwargs["lines"] = tuple(kwargs.get("lines", ()))
        if cls is ev.ProcessPlanned:
            kwargs["command"] = tuple(kwargs.get("command", ()))
        if cls is ev.GpuSample:
            kwargs["holders"] = tuple(kwargs.get("holders", ()))
        if cls is ev.Stalled:
            kwargs["causes"] = tuple(kwargs.get("causes", ()))
        return cls(**kwargs)
    except (KeyError, TypeError, ValueError):
        return None


def _json_lines(path: Path) -> Iterator[dict[str, Any] | None]:
    if not path.is_file():
        return
    with path.open(encoding="utf-8", errors="replace") as file:
        for line in file:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                yield None
                continue
            yield record if isinstance(record, dict) else None


def _tail_lines(path: Path, limit: int) -> list[str]:
    with path.open("rb") as file:
        size = file.seek(0, os.SEEK_END)
        file.seek(max(0, size - TAIL_BYTES))
        data = file.read()
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first line is cut
    return lines[-limit:]


def load_run(run_dir: Path, *, max_log_lines: int = 5000) -> tuple[RunState, int]:
    """The state of a finished (or running) run, and how many bad JSON lines were skipped."""
    state = RunState(run_dir.name, max_log_lines=max_log_lines, run_dir=run_dir)
    bad = 0
    metrics_file = run_dir / "metrics.jsonl"
    events: list[Event] = []
    for record in _json_lines(run_dir / "events.jsonl"):
        event = event_from_json(record) if record is not None else None
        if event is None:
            bad += 1
        elif not isinstance(event, ev.LogBatch) and not (
            isinstance(event, MetricsRecord) and metrics_file.is_file()
        ):
            events.append(event)
    for record in _json_lines(metrics_file):
        if record is None or not isinstance(record.get("data"), dict):
            bad += 1
            continue
        events.append(
            MetricsRecord(
                t=float(record.get("t", 0.0)),
                process=str(record.get("process", "trainer")),
                step=record.get("step"),
                data=record["data"],
            )
        )
    events.sort(key=lambda event: event.t)
    for event in events:
        if isinstance(event, ev.ProcessPlanned):
            row = state.process(event.process)
            row.role, row.port, row.external = event.role, event.port, event.external
        state.apply(event)
    if events:
        state.finished_at = events[-1].t
    logs = run_dir / "logs"
    if logs.is_dir():
        for path in sorted(logs.glob("*.log")):
            state.log(path.stem).extend(_tail_lines(path, max_log_lines))
    state.mode = profile_mode(run_dir / "profile.toml")
    return state, bad


def profile_mode(path: Path) -> str | None:
    """``run.mode`` of a run directory's resolved ``profile.toml`` (None when unreadable)."""
    if not path.is_file():
        return None
    try:
        run = tomllib.loads(path.read_text(encoding="utf-8")).get("run", {})
    except tomllib.TOMLDecodeError:
        return None
    mode = run.get("mode") if isinstance(run, dict) else None
    return str(mode) if mode else None


class RunFollower:
    """Keeps a :class:`RunState` up to date with a running run's files (``grpo-tui attach``).

    Each ``poll`` reads what was appended since the last one: complete lines of
    ``events.jsonl`` and ``metrics.jsonl`` become events, new output of ``logs/*.log``
    becomes log lines (a log starts from its last ``TAIL_BYTES``). Nothing is re-read.
    """

    def __init__(self, run_dir: Path, state: RunState) -> None:
        self.run_dir = run_dir
        self.state = state
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def _new_lines(self, path: Path, start_tail: bool = False) -> list[str]:
        try:
            size = path.stat().st_size
        except OSError:
            return []
        offset = self._offsets.get(path)
        if offset is None:
            offset = max(0, size - TAIL_BYTES) if start_tail else 0
        if size < offset:  # rotated or truncated: start again
            offset, self._partial[path] = 0, b""
        if size == offset:
            self._offsets[path] = offset
            return []
        with path.open("rb") as file:
            file.seek(offset)
            data = self._partial.get(path, b"") + file.read(size - offset)
        self._offsets[path] = size
        *lines, self._partial[path] = data.split(b"\n")
        return [line.decode("utf-8", errors="replace") for line in lines]

    def poll(self) -> int:
        """Apply everything new; returns how many records and lines it applied."""
        applied = 0
        for line in self._new_lines(self.run_dir / "events.jsonl"):
            event = _parse_event(line)
            if event is None or isinstance(event, ev.LogBatch | MetricsRecord):
                continue
            if isinstance(event, ev.ProcessPlanned):
                row = self.state.process(event.process)
                row.role, row.port, row.external = event.role, event.port, event.external
            self.state.apply(event)
            applied += 1
        for line in self._new_lines(self.run_dir / "metrics.jsonl"):
            record = _parse_json(line)
            if record is None or not isinstance(record.get("data"), dict):
                continue
            self.state.apply(
                MetricsRecord(
                    t=float(record.get("t", 0.0)),
                    process=str(record.get("process", "trainer")),
                    step=record.get("step"),
                    data=record["data"],
                )
            )
            applied += 1
        logs = self.run_dir / "logs"
        for path in sorted(logs.glob("*.log")) if logs.is_dir() else []:
            lines = self._new_lines(path, start_tail=True)
            if lines:
                self.state.log(path.stem).extend(lines)
                applied += len(lines)
        return applied


def _parse_json(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _parse_event(line: str) -> Event | None:
    record = _parse_json(line)
    return event_from_json(record) if record is not None else None
