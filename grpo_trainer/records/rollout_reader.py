"""Reads a run's rollout records: every writer's index, incrementally, and one group at a time.

:meth:`RolloutIndex.poll` reads the index rows appended since the last poll (whole rows
only: a writer may be mid-row) and forgets segments their writer deleted. Rows live in
numpy arrays, so filtering a hundred thousand groups is a few array operations, and
:meth:`RolloutIndex.open` reads one record (or, for a multi-GPU trainer, one part per
rank) from its data file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grpo_trainer.records.rollout_writer import ROLLOUTS_DIR, env_names_path
from grpo_trainer.records.rollouts import INDEX_DTYPE, GroupRecord, decode, group_record
from grpo_trainer.records.segments import list_segments, segment_path

RANK_SUFFIX = re.compile(r"\.rank\d+$")


class RecordGone(LookupError):
    """The group's segment was deleted (the log keeps its newest segments only)."""


@dataclass
class _IndexFile:
    writer: int
    segment: int
    read: int = 0
    rows: np.ndarray | None = None


class RolloutIndex:
    """Every group recorded under ``run_dir/rollouts``; ``rows[i]`` is group ``i``'s summary."""

    def __init__(self, run_dir: Path) -> None:
        self.directory = run_dir / ROLLOUTS_DIR
        self.writers: list[str] = []
        self.envs: list[str] = []
        """Every environment name seen, in order; ``env[i]`` indexes it."""
        self._env_codes: dict[int, np.ndarray] = {}
        self._files: dict[tuple[str, int], _IndexFile] = {}
        self._split = False
        self._clear()

    def _clear(self) -> None:
        self.rows = np.zeros(0, INDEX_DTYPE)
        self.writer = np.zeros(0, np.uint16)
        self.segment = np.zeros(0, np.int32)
        self.env = np.zeros(0, np.int32)
        self.family = np.zeros(0, np.uint16)

    def __len__(self) -> int:
        return len(self.rows)

    def poll(self) -> int:
        """Read what was appended since the last call; returns how many rows are new."""
        present = {
            (stem, segment)
            for stem, segments in list_segments(self.directory, "index").items()
            for segment in segments
        }
        gone = [key for key in self._files if key not in present]
        for key in gone:
            del self._files[key]
        new = 0
        for stem, segment in sorted(present):
            entry = self._files.get((stem, segment))
            if entry is None:
                entry = self._files[(stem, segment)] = _IndexFile(self._writer(stem), segment)
            new += self._read_rows(stem, entry)
        if new or gone:
            self._rebuild()
        return new

    def _writer(self, stem: str) -> int:
        if stem not in self.writers:
            self.writers.append(stem)
        return self.writers.index(stem)

    def _read_rows(self, stem: str, entry: _IndexFile) -> int:
        path = segment_path(self.directory, stem, entry.segment, "index")
        try:
            with path.open("rb") as handle:
                handle.seek(entry.read)
                data = handle.read()
        except FileNotFoundError:
            return 0
        whole = len(data) // INDEX_DTYPE.itemsize
        if not whole:
            return 0
        rows = np.frombuffer(data[: whole * INDEX_DTYPE.itemsize], INDEX_DTYPE).copy()
        entry.read += whole * INDEX_DTYPE.itemsize
        entry.rows = rows if entry.rows is None else np.concatenate([entry.rows, rows])
        return whole

    def _rebuild(self) -> None:
        entries = [e for _, e in sorted(self._files.items()) if e.rows is not None]
        if not entries:
            self._clear()
            return
        self.rows = np.concatenate([e.rows for e in entries if e.rows is not None])
        self.writer = np.concatenate(
            [np.full(len(e.rows), e.writer, np.uint16) for e in entries if e.rows is not None]
        )
        self.segment = np.concatenate(
            [np.full(len(e.rows), e.segment, np.int32) for e in entries if e.rows is not None]
        )
        families = [RANK_SUFFIX.sub("", stem) for stem in self.writers]
        unique = sorted(set(families))
        self.family = np.array([unique.index(f) for f in families], np.uint16)[self.writer]
        self._split = len(unique) < len(self.writers)
        self.env = np.zeros(len(self.rows), np.int32)
        for writer, stem in enumerate(self.writers):
            codes = self._global_env_codes(writer, stem, int(self.rows["env"].max()) + 1)
            mine = self.writer == writer
            self.env[mine] = codes[self.rows["env"][mine]]

    def _global_env_codes(self, writer: int, stem: str, needed: int) -> np.ndarray:
        codes = self._env_codes.get(writer)
        if codes is None or len(codes) < needed:
            path = env_names_path(self.directory, stem)
            try:
                names = json.loads(path.read_text()) if path.is_file() else []
            except (OSError, ValueError):
                names = []
            names += [f"env?{i}" for i in range(len(names), needed)]
            for name in names:
                if name not in self.envs:
                    self.envs.append(name)
            codes = self._env_codes[writer] = np.array([self.envs.index(n) for n in names])
        return codes

    def groups(self) -> np.ndarray:
        """Row numbers with one row per group (a multi-GPU trainer's ranks each wrote a
        part), oldest first."""
        if not self._split:
            return np.arange(len(self.rows))
        keys = np.stack(
            [
                self.family,
                self.rows["session"],
                self.rows["kind"],
                self.rows["step"],
                self.rows["group"],
            ],
            axis=1,
        )
        _, first = np.unique(keys, axis=0, return_index=True)
        return np.sort(first)

    def env_name(self, row: int) -> str:
        return self.envs[int(self.env[row])]

    def open(self, row: int) -> GroupRecord:
        """The whole group of index row ``row`` (every rank's part of it)."""
        if not self._split:
            parts = [row]
        else:
            r = self.rows[row]
            parts = np.flatnonzero(
                (self.family == self.family[row])
                & (self.rows["session"] == r["session"])
                & (self.rows["kind"] == r["kind"])
                & (self.rows["step"] == r["step"])
                & (self.rows["group"] == r["group"])
            ).tolist()
        return group_record([decode(self._read(i)) for i in parts])

    def _read(self, row: int) -> bytes:
        stem = self.writers[int(self.writer[row])]
        path = segment_path(self.directory, stem, int(self.segment[row]), "data")
        offset, length = int(self.rows["offset"][row]), int(self.rows["length"][row])
        try:
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read(length)
        except FileNotFoundError:
            raise RecordGone(f"{path.name} was deleted (the log keeps its newest part)") from None
        if len(data) != length:
            raise RecordGone(f"{path.name} ends before this record")
        return data
