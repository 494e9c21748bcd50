"""Runs the store off the event loop, one call at a time, with group commit for ingest.

Every database call goes to one worker thread, in arrival order: state changes stay
atomic without locks, and the event loop keeps parsing and validating other requests
while SQLite writes and fsyncs (the sqlite3 module releases the GIL while it works).

Group commit: groups posted while a commit is in flight wait together and go into the
next transaction, so N concurrent posts cost one fsync, not N. Each poster still gets its
answer only after the transaction holding its group has committed.

Change signal: ``changed()`` wakes every ``wait_for_change`` caller; the app calls it
after any change of the queue (groups committed, a batch taken or acked, a reset), which
lets ``GET /batch?wait=`` and ``GET /status-env?wait=`` answer the moment their answer
would differ instead of being polled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from grpo_trainer.api.store import Store

T = TypeVar("T")
Row = tuple[int | None, int, bytes]


class StoreRunner:
    """The only way the app touches ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._waiting: list[tuple[list[Row], asyncio.Future[None]]] = []
        self._committing = False
        self._purge_due = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._change = asyncio.Event()

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` on the store's thread and return its result."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def changed(self) -> None:
        """Wake everyone waiting for a queue change."""
        self._change.set()
        self._change = asyncio.Event()

    async def wait_for_change(self, timeout: float) -> None:
        """Return at the next ``changed()`` or after ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._change.wait()

    async def add_groups(self, rows: list[Row]) -> None:
        """Queue ``rows``; returns once they are committed (sharing the commit with others)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((rows, done))
        if not self._committing:
            self._committing = True
            self._spawn(self._commit_waiting())
        await done

    async def _commit_waiting(self) -> None:
        try:
            while self._waiting:
                taken, self._waiting = self._waiting, []
                rows = [row for part, _ in taken for row in part]
                try:
                    await self.call(self.store.add_groups, rows)
                except Exception as exc:  # every waiter learns that its commit failed
                    for _, done in taken:
                        if not done.done():
                            done.set_exception(exc)
                    continue
                for _, done in taken:
                    if not done.done():  # a cancelled poster's groups are committed anyway
                        done.set_result(None)
                self.changed()
        finally:
            self._committing = False

    def purge_soon(self) -> None:
        """Delete consumed payloads after the current answer (coalesced)."""
        if self._purge_due:
            return
        self._purge_due = True
        self._spawn(self._purge())

    async def _purge(self) -> None:
        self._purge_due = False
        await self.call(self.store.purge)

    def _spawn(self, work: Coroutine[None, None, None]) -> None:
        """Run ``work`` in the background, holding a reference until it finishes."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.store.close()
