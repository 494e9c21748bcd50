"""Batching of concurrent generation requests into one decode, as vLLM's scheduler does.

Requests are ``submit``-ted (from the server's event loop, or a thread while paused) and
wait on a future; one scheduler thread takes every request queued at that moment (when it
found the queue empty, after waiting for company until ``window`` seconds pass without a
new arrival, at most ``max_wait``) and runs them as one batch through ``run_batch``.
Requests that arrive while a batch decodes queue for the next one, so under load batches
fill by themselves. A batch holds requests of one adapter only (the active adapter is
per-model state) and at most ``max_rows`` sequences; the rest wait, in arrival order.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

ItemT = TypeVar("ItemT")


@dataclass(eq=False)
class Pending(Generic[ItemT]):
    """One submitted request: what to run, its adapter, its rows and its future."""

    item: ItemT
    adapter: str | None
    rows: int
    future: Future[None] = field(default_factory=Future)


class BatchScheduler(Generic[ItemT]):
    """A queue and the thread that drains it batch by batch into ``run_batch``.

    ``run_batch`` gets the batch's requests and resolves each future (it may do so
    early, when a request is done before the rest); any future it leaves unresolved
    gets the exception it raised.
    """

    def __init__(
        self,
        run_batch: Callable[[list[Pending[ItemT]]], None],
        *,
        max_rows: int,
        window: float,
        max_wait: float,
        name: str = "batch-scheduler",
    ) -> None:
        self.run_batch = run_batch
        self.max_rows = max_rows
        self.window = window
        self.max_wait = max_wait
        self.batches = 0
        self._queue: deque[Pending[ItemT]] = deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: ItemT, *, adapter: str | None, rows: int) -> Future[None]:
        """Queue ``item`` (``rows`` sequences); its future resolves when it is done.

        The future is running from the start, so it cannot be cancelled (an awaiting
        task that is cancelled does not pull the request out of the batch that decodes it).
        """
        pending = Pending(item, adapter, rows)
        pending.future.set_running_or_notify_cancel()
        with self._cond:
            self._queue.append(pending)
            self._cond.notify_all()
        return pending.future

    @property
    def queued(self) -> int:
        """Requests waiting for a batch."""
        return len(self._queue)

    def _full(self) -> bool:
        return sum(p.rows for p in self._queue) >= self.max_rows

    def _gather(self) -> None:
        """Wait (lock held) while requests keep arriving: until ``window`` seconds pass
        without a new one, the batch is full, or ``max_wait`` seconds have passed.

        Concurrent requests reach the queue one HTTP parse apart (about 2 ms of CPU each
        on a 2-core machine), so a fixed window split 16 of them into 2-3 batches of the
        same decode length, each paying every decode step's forward pass.
        """
        deadline = time.monotonic() + self.max_wait
        seen = len(self._queue)
        while not self._full():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(timeout=min(self.window, remaining))
            if len(self._queue) == seen:
                return  # quiet for a window: nobody else is coming
            seen = len(self._queue)

    def _take(self) -> list[Pending[ItemT]]:
        """The next batch: queued requests of the first one's adapter, up to ``max_rows``."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._queue))
            if self.window > 0:
                self._gather()
            adapter = self._queue[0].adapter
            batch: list[Pending[ItemT]] = []
            rows = 0
            kept: deque[Pending[ItemT]] = deque()
            while self._queue:
                pending = self._queue.popleft()
                fits = not batch or rows + pending.rows <= self.max_rows
                if pending.adapter == adapter and fits:
                    batch.append(pending)
                    rows += pending.rows
                else:
                    kept.append(pending)
            self._queue = kept
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            self.batches += 1
            try:
                self.run_batch(batch)
            except BaseException as exc:  # handed to the waiting requests, not lost
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
