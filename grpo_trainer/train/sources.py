"""Where a step's groups come from: the rollout API, or a JSONL file of groups (offline).

A source hands out one batch per optimizer step (``step_batch_size`` sequences, whole
groups) and is told when the step is done, so that the API can consume a leased batch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from grpo_trainer.train.api_client import ApiClient, LeasedBatch, Registration
from grpo_trainer.train.data import DataError


class BatchSource(Protocol):
    """One batch of raw groups per optimizer step."""

    def start(self, step: int) -> None:
        """Connect / position the source for a run resuming after ``step`` steps."""

    def next_batch(self, step: int, should_stop: Callable[[], bool]) -> LeasedBatch | None:
        """The groups of optimizer step ``step + 1``; None when asked to stop first."""

    def done(self, batch: LeasedBatch, step: int) -> None:
        """The optimizer step on ``batch`` finished; ``step`` steps are now complete."""

    def served(
        self, version: int, model: str | None = None, incarnation: int | None = None
    ) -> None:
        """Inference now serves the weights of step ``version`` under ``model``, pushed to
        inference ``incarnation`` (start-up, each sync, each re-attach)."""

    def close(self) -> None:
        """Release connections."""


class ApiSource:
    """Batches leased from the rollout API."""

    def __init__(self, client: ApiClient, registration: Registration) -> None:
        self.client = client
        self.registration = registration

    def start(self, step: int) -> None:
        self.client.register(self.registration, step)

    def next_batch(self, step: int, should_stop: Callable[[], bool]) -> LeasedBatch | None:
        return self.client.next_batch(should_stop)

    def done(self, batch: LeasedBatch, step: int) -> None:
        self.client.ack(batch, step)

    def served(
        self, version: int, model: str | None = None, incarnation: int | None = None
    ) -> None:
        self.client.served(version, model, incarnation)

    def close(self) -> None:
        self.client.close()


class FileSource:
    """``--batches-file``: one ScoredData group per JSONL line, cut into step batches in order.

    Batch ``k`` is always the same groups, so a resumed run sees exactly the data the
    straight run saw. When the file holds fewer batches than needed, the source waits for
    it to grow (another process may be appending) up to ``wait`` seconds, then fails with
    a clear error.
    """

    def __init__(self, path: str | Path, step_batch_size: int, *, wait: float = 60.0) -> None:
        self.path = Path(path)
        self.step_batch_size = step_batch_size
        self.wait = wait
        self._groups: list[dict[str, Any]] = []
        self._offset = 0
        self._bounds: list[int] = [0]

    def start(self, step: int) -> None:
        if not self.path.is_file():
            raise DataError(f"--batches-file {self.path} does not exist")

    def _read_more(self) -> None:
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for number, line in enumerate(complete.splitlines(), start=len(self._groups) + 1):
            if not line.strip():
                continue
            try:
                self._groups.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{self.path} line {number} is not JSON: {exc}") from None
        self._cut()

    def _cut(self) -> None:
        """Extend batch boundaries over the groups read so far."""
        start = self._bounds[-1]
        size = 0
        for index in range(start, len(self._groups)):
            size += len(self._groups[index].get("tokens", []))
            if size == self.step_batch_size:
                self._bounds.append(index + 1)
                size = 0
            elif size > self.step_batch_size:
                raise DataError(
                    f"{self.path}: group {index} does not fit in a batch of "
                    f"{self.step_batch_size} sequences (groups are never split)"
                )

    def next_batch(self, step: int, should_stop: Callable[[], bool]) -> LeasedBatch | None:
        deadline = time.monotonic() + self.wait
        while len(self._bounds) <= step + 1:
            if should_stop():
                return None
            self._read_more()
            if len(self._bounds) > step + 1:
                break
            if time.monotonic() >= deadline:
                raise DataError(
                    f"{self.path} holds {len(self._bounds) - 1} batches of "
                    f"{self.step_batch_size} sequences; step {step + 1} needs one more"
                )
            time.sleep(0.05)
        groups = self._groups[self._bounds[step] : self._bounds[step + 1]]
        return LeasedBatch(groups=groups, batch_id=None)

    def done(self, batch: LeasedBatch, step: int) -> None:
        """Nothing to acknowledge in a file."""

    def served(
        self, version: int, model: str | None = None, incarnation: int | None = None
    ) -> None:
        """Nobody samples from a file."""

    def close(self) -> None:
        """Nothing to close."""
