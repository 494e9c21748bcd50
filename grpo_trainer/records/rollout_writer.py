"""Appends group records to one writer's bounded log (``rollouts.py`` is the format).

:meth:`RolloutWriter.add` takes a function that builds the records, and the background
thread calls it: converting tensors to arrays, decoding token texts and encoding all happen
off the caller's thread. ``every`` samples: only every n-th call records (a trainer passes
its step, an environment its count of dropped groups).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from grpo_trainer.control import PROCESS_ENV, RUN_DIR_ENV
from grpo_trainer.records.background import BackgroundWriter
from grpo_trainer.records.rollouts import GroupParts, encode
from grpo_trainer.records.segments import SegmentedLog

ROLLOUTS_DIR = "rollouts"
MB = 2**20


def env_names_path(directory: Path, stem: str) -> Path:
    """The writer's environment names, by the code its index rows carry."""
    return directory / f"{stem}.envs.json"


def pieces_path(directory: Path, stem: str) -> Path:
    """The writer's vocabulary: lines of ``{"token id": "text"}``, each id once."""
    return directory / f"{stem}.pieces.jsonl"


def run_directory(fallback: Path | None = None) -> Path | None:
    """Where records go: the supervisor's run directory (``$GRPO_TUI_RUN_DIR``), else
    ``fallback`` (None: nowhere, recording is off)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    return Path(run_dir) if run_dir else fallback


def writer_stem(default: str, rank: int = 0) -> str:
    """The writer's file name stem: its process name (``$GRPO_TUI_PROCESS``, else
    ``default``), with ``.rank<r>`` for ranks after the first of a multi-GPU trainer."""
    name = os.environ.get(PROCESS_ENV) or default
    return name if rank == 0 else f"{name}.rank{rank}"


class RolloutWriter:
    """One process's rollout log, at most ``max_mb``, written on ``background``'s thread."""

    def __init__(
        self,
        run_dir: Path,
        stem: str,
        *,
        max_mb: float,
        every: int = 1,
        background: BackgroundWriter,
    ) -> None:
        self.directory = run_dir / ROLLOUTS_DIR
        self.stem = stem
        self.every = max(1, every)
        self.log = SegmentedLog(
            self.directory, stem, ("data", "index"), max_bytes=max(1, int(max_mb * MB))
        )
        names = env_names_path(self.directory, stem)
        self.env_names: list[str] = json.loads(names.read_text()) if names.is_file() else []
        self.background = background
        self.written = 0
        self._pieces: set[int] = set()

    def due(self, count: int) -> bool:
        """Whether the ``count``-th step or group is sampled (every ``every``-th one)."""
        return count % self.every == 0

    def add(self, build: Callable[[], Iterable[GroupParts]]) -> bool:
        """Record what ``build`` returns, built and written on the background thread; False
        when the queue is full (counted in :attr:`dropped`) or recording failed."""
        return self.background.submit(lambda: self._write(build()))

    def _write(self, groups: Iterable[GroupParts]) -> None:
        """Encode every group, then append them with one write per file (data first)."""
        offset = self.log.offsets()["data"]
        data, index, pieces = [], [], {}
        for parts in groups:
            pieces |= {k: v for k, v in parts.pieces.items() if k not in self._pieces}
            record, row = encode(parts, self._env_code(parts.env))
            row["offset"] = offset
            offset += len(record)
            data.append(record)
            index.append(row.tobytes())
        if pieces:  # before the rows that use them
            with pieces_path(self.directory, self.stem).open("a") as handle:
                handle.write(json.dumps({str(k): v for k, v in pieces.items()}) + "\n")
            self._pieces |= set(pieces)
        if data:
            self.log.write({"data": b"".join(data), "index": b"".join(index)})
            self.written += len(data)

    def _env_code(self, name: str) -> int:
        if name not in self.env_names:
            self.env_names.append(name)
            path = env_names_path(self.directory, self.stem)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.env_names))
            tmp.replace(path)
        return self.env_names.index(name)

    def close(self) -> None:
        """Close the files (after the background writer ran what was queued)."""
        self.log.close()
