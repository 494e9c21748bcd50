"""One process's records: its rollout log (optional) and its timeline, one writer thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np

from grpo_trainer.records.background import BackgroundWriter
from grpo_trainer.records.rollout_writer import RolloutWriter
from grpo_trainer.records.timeline import SpanRecorder

Decode = Callable[[list[int]], str]


class ProcessRecords:
    """The logs a trainer rank or an environment writes, and the token texts it decoded.

    ``max_mb`` 0 records no groups (the timeline is kept: it is a line per step).
    """

    role: ClassVar[str]
    """The timeline's role of the lane: ``trainer`` lanes define the steps."""

    def __init__(
        self,
        run_dir: Path,
        stem: str,
        decode: Decode,
        *,
        max_mb: float,
        every: int = 1,
        on_error: Callable[[str], None] = lambda message: None,
        idle: threading.Event | None = None,
    ) -> None:
        self.background = BackgroundWriter(stem, on_error=on_error, idle=idle)
        self.rollouts = (
            RolloutWriter(run_dir, stem, max_mb=max_mb, every=every, background=self.background)
            if max_mb > 0
            else None
        )
        self.timeline = SpanRecorder(run_dir, stem, self.role, self.background)
        self.decode = decode
        self._pieces: dict[int, str] = {}

    def pieces_of(self, tokens: np.ndarray) -> dict[int, str]:
        """The text of each token id in ``tokens`` not decoded before (each id is decoded
        once per process and recorded once in the writer's vocabulary; called on the
        writer's thread)."""
        new = {}
        for token in np.unique(tokens).tolist():
            if token not in self._pieces:
                new[token] = self._pieces[token] = self.decode([token])
        return new

    @property
    def dropped(self) -> int:
        """Recording jobs dropped because the writer fell behind."""
        return self.background.dropped

    def close(self) -> None:
        """Write what is queued (bounded wait) and close the files."""
        self.background.close()
        if self.rollouts is not None:
            self.rollouts.close()
        self.timeline.close()
