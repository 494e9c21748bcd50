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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grpo_trainer.records.rollout_writer import ROLLOUTS_DIR, env_names_path, pieces_path
from grpo_trainer.records.rollouts import INDEX_DTYPE, GroupRecord, decode, group_record
from grpo_trainer.records.segments import list_segments, read_after, segment_path

RANK_SUFFIX = re.compile(r"\.rank\d+$")


class RecordGone(LookupError):
    """The group's segment was deleted (the log keeps its newest segments only)."""


@dataclass
class _IndexFile:
    writer: int
    segment: int
    read: int = 0
    chunks: list[np.ndarray] = field(default_factory=list)
    """Rows as read (views of the bytes read, no copy)."""


class RolloutIndex:
    """Every group recorded under ``run_dir/rollouts``; ``rows[i]`` is group ``i``'s summary.

    Rows live in arrays that grow by doubling, so a poll copies only what is new; a deleted
    segment rebuilds them from what is kept.
    """

    def __init__(self, run_dir: Path) -> None:
        self.directory = run_dir / ROLLOUTS_DIR
        self.writers: list[str] = []
        self.envs: list[str] = []
        """Every environment name seen, in order; ``env[i]`` indexes it."""
        self._env_codes: dict[int, np.ndarray] = {}
        self._families: list[int] = []
        """Per writer: its family (a trainer's ranks share one)."""
        self._files: dict[tuple[str, int], _IndexFile] = {}
        self._pieces: dict[str, tuple[int, dict[int, str]]] = {}
        """Per writer: bytes of its vocabulary read so far, and the pieces."""
        self._split = False
        self._clear()

    def _clear(self) -> None:
        self._size = 0
        self._columns = {
            "rows": np.zeros(0, INDEX_DTYPE),
            "writer": np.zeros(0, np.uint16),
            "segment": np.zeros(0, np.int32),
            "env": np.zeros(0, np.int32),
            "family": np.zeros(0, np.uint16),
        }

    @property
    def rows(self) -> np.ndarray:
        return self._columns["rows"][: self._size]

    @property
    def writer(self) -> np.ndarray:
        return self._columns["writer"][: self._size]

    @property
    def segment(self) -> np.ndarray:
        return self._columns["segment"][: self._size]

    @property
    def env(self) -> np.ndarray:
        return self._columns["env"][: self._size]

    @property
    def family(self) -> np.ndarray:
        return self._columns["family"][: self._size]

    def __len__(self) -> int:
        return self._size

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
        if gone:
            self._clear()
            for entry in self._files.values():
                for chunk in entry.chunks:
                    self._append(entry, chunk)
        new = 0
        for stem, segment in sorted(present):
            entry = self._files.get((stem, segment))
            if entry is None:
                entry = self._files[(stem, segment)] = _IndexFile(self._writer(stem), segment)
            chunk = self._read_rows(stem, entry)
            if chunk is not None:
                self._append(entry, chunk)
                new += len(chunk)
        return new

    def _writer(self, stem: str) -> int:
        if stem not in self.writers:
            self.writers.append(stem)
            families = [RANK_SUFFIX.sub("", name) for name in self.writers]
            self._families = [sorted(set(families)).index(f) for f in families]
            self._split = len(set(families)) < len(self.writers)
            self._columns["family"][: self._size] = np.array(self._families, np.uint16)[self.writer]
        return self.writers.index(stem)

    def _read_rows(self, stem: str, entry: _IndexFile) -> np.ndarray | None:
        data = read_after(segment_path(self.directory, stem, entry.segment, "index"), entry.read)
        if data is None:
            return None
        whole = len(data) // INDEX_DTYPE.itemsize
        if not whole:
            return None
        chunk = np.frombuffer(data, INDEX_DTYPE, whole)
        entry.read += whole * INDEX_DTYPE.itemsize
        entry.chunks.append(chunk)
        return chunk

    def _append(self, entry: _IndexFile, chunk: np.ndarray) -> None:
        """Add ``chunk``'s rows at the end (growing the arrays by doubling)."""
        end = self._size + len(chunk)
        if end > len(self._columns["rows"]):
            capacity = max(end, 2 * len(self._columns["rows"]), 1024)
            for name, column in self._columns.items():
                grown = np.zeros(capacity, column.dtype)
                _copy(grown, 0, column[: self._size])
                self._columns[name] = grown
        at = slice(self._size, end)
        stem = self.writers[entry.writer]
        codes = self._global_env_codes(entry.writer, stem, int(chunk["env"].max()) + 1)
        _copy(self._columns["rows"], self._size, chunk)
        self._columns["writer"][at] = entry.writer
        self._columns["segment"][at] = entry.segment
        self._columns["env"][at] = codes[chunk["env"]]
        self._columns["family"][at] = self._families[entry.writer]
        self._size = end

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
        pieces: dict[int, str] = {}
        for i in parts:
            pieces |= self._vocabulary(self.writers[int(self.writer[i])])
        return group_record([decode(self._read(i)) for i in parts], pieces)

    def _vocabulary(self, stem: str) -> dict[int, str]:
        """The writer's token pieces (what it appended since the last call is read now)."""
        read, pieces = self._pieces.get(stem, (0, {}))
        data = read_after(pieces_path(self.directory, stem), read)
        if data is None:
            return pieces
        whole = data[: data.rfind(b"\n") + 1]
        for line in whole.splitlines():
            try:
                pieces |= {int(k): str(v) for k, v in json.loads(line).items()}
            except (ValueError, AttributeError):
                continue
        self._pieces[stem] = (read + len(whole), pieces)
        return pieces

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


def _copy(target: np.ndarray, at: int, rows: np.ndarray) -> None:
    """``target[at : at + len(rows)] = rows`` as a byte copy (numpy copies a packed record
    array field by field: 50 times slower)."""
    size = target.dtype.itemsize
    target.view(np.uint8)[at * size : (at + len(rows)) * size] = rows.view(np.uint8)
