"""One daemon thread that runs recording jobs off the hot path, never blocking the caller.

Observability must never slow or kill training: :meth:`BackgroundWriter.submit` only puts a
job on a bounded queue (a full queue drops the job and counts it), the thread does the
encoding and the writes, and the first error (a full disk, say) is reported once and stops
the recording, not the process.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

Job = Callable[[], None]
QUEUE_JOBS = 256
CLOSE_TIMEOUT = 10.0


class _Marker:
    """A point in the queue that :meth:`BackgroundWriter.flush` waits for (runs even after a
    failure)."""

    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def __call__(self) -> None:
        self.done.set()


class BackgroundWriter:
    """Runs submitted jobs in order on one thread; ``on_error`` hears of the first failure."""

    def __init__(
        self,
        name: str,
        *,
        on_error: Callable[[str], None] = lambda message: None,
        queue_jobs: int = QUEUE_JOBS,
    ) -> None:
        self.name = name
        self.on_error = on_error
        self.dropped = 0
        self.failed: str | None = None
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_jobs)
        self._thread = threading.Thread(target=self._run, name=f"record-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> bool:
        """Queue ``job``; False (counted in ``dropped``) when the queue is full or writing
        failed earlier."""
        if self.failed is not None:
            return False
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            if self.failed is not None and not isinstance(job, _Marker):
                continue
            try:
                job()
            except Exception as exc:  # any failure of a recording job ends recording only
                self.failed = f"{type(exc).__name__}: {exc}"
                self.on_error(f"recording {self.name} stopped: {self.failed}")

    def flush(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Wait (bounded) until every job queued so far ran; False on timeout."""
        done = threading.Event()
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_Marker(done), timeout=timeout)
        except queue.Full:
            return False
        return done.wait(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Run what is queued (waiting at most ``timeout`` s), then stop the thread."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._queue.put(None, timeout=0.05)
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    return  # a daemon thread: it dies with the process
        self._thread.join(max(0.0, deadline - time.monotonic()))
