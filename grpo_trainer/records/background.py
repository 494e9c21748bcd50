"""One daemon thread that runs recording jobs off the hot path, never blocking the caller.

Observability must never slow or kill training: :meth:`BackgroundWriter.submit` only puts a
job on a bounded queue (a full queue drops the job and counts it), the thread does the
encoding and the writes, and the first error (a full disk, say) is reported once and stops
the recording, not the process. With an ``idle`` event the thread waits for it before a
job (a trainer sets it while it waits for its next batch, so the recording's Python work
never competes with a step for the GIL), unless the queue is half full or the job has
waited :data:`MAX_DELAY` seconds.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

Job = Callable[[], None]
QUEUE_JOBS = 256
CLOSE_TIMEOUT = 10.0
MAX_DELAY = 5.0
"""Seconds a job waits for the ``idle`` event at most."""


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
        idle: threading.Event | None = None,
    ) -> None:
        self.name = name
        self.on_error = on_error
        self.idle = idle
        self._closing = False
        self.dropped = 0
        self.failed: str | None = None
        self.busy = 0.0
        """CPU seconds the thread spent in jobs (what recording costs the process)."""
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
            self._wait_for_idle()
            started = time.thread_time()
            try:
                job()
            except Exception as exc:  # any failure of a recording job ends recording only
                self.failed = f"{type(exc).__name__}: {exc}"
                self.on_error(f"recording {self.name} stopped: {self.failed}")
            self.busy += time.thread_time() - started

    def _wait_for_idle(self) -> None:
        """Hold the next job until the caller is idle (bounded: see the module doc)."""
        if self.idle is None:
            return
        deadline = time.monotonic() + MAX_DELAY
        while not (self.idle.is_set() or self._closing):
            if self._queue.qsize() * 2 >= self._queue.maxsize or time.monotonic() >= deadline:
                return
            self.idle.wait(0.05)

    def flush(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Wait (bounded) until every job queued so far ran; False on timeout."""
        self._closing = True  # run what is queued now, idle or not
        done = threading.Event()
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_Marker(done), timeout=timeout)
        except queue.Full:
            return False
        finished = done.wait(max(0.0, deadline - time.monotonic()))
        self._closing = False
        return finished

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Run what is queued (waiting at most ``timeout`` s), then stop the thread."""
        self._closing = True
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._queue.put(None, timeout=0.05)
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    return  # a daemon thread: it dies with the process
        self._thread.join(max(0.0, deadline - time.monotonic()))
