"""Fan-out of supervisor events to any number of subscribers, none of which can stall it.

Each subscriber has its own bounded queue. When a subscriber falls ``max_pending`` log lines
behind, further log lines for it are counted instead of queued, and it later receives a
``LogBatch`` whose ``dropped`` says how many it missed. Other events (state changes, probes,
metrics) are always queued; should a subscriber stop reading altogether, the oldest of those
are discarded past ``max_pending`` and counted in ``Subscription.lost``.
"""

from __future__ import annotations

import asyncio
from collections import deque

from grpo_tui.supervisor.events import Event, LogBatch


class Subscription:
    """An async iterator of events; ``close()`` (or ``async with``) ends it."""

    def __init__(self, bus: EventBus, max_pending: int) -> None:
        self._bus = bus
        self.max_pending = max_pending
        self._queue: deque[Event] = deque()
        self._log_lines = 0
        self._other = 0
        self._dropped: dict[str, int] = {}
        self._wakeup = asyncio.Event()
        self.closed = False
        self.lost = 0

    def offer(self, event: Event) -> None:
        """Called by the bus; never blocks."""
        if isinstance(event, LogBatch):
            if self._log_lines + len(event.lines) > self.max_pending:
                self._dropped[event.process] = self._dropped.get(event.process, 0) + len(
                    event.lines
                )
                self._wakeup.set()
                return
            if missed := self._dropped.pop(event.process, 0):
                event = LogBatch(
                    t=event.t, process=event.process, lines=event.lines, dropped=missed
                )
            self._log_lines += len(event.lines)
        else:
            self._other += 1
            if self._other > self.max_pending:
                self._discard_oldest_other()
        self._queue.append(event)
        self._wakeup.set()

    def _discard_oldest_other(self) -> None:
        for index, queued in enumerate(self._queue):
            if not isinstance(queued, LogBatch):
                del self._queue[index]
                self._other -= 1
                self.lost += 1
                return

    def _pop(self) -> Event | None:
        if self._queue:
            event = self._queue.popleft()
            if isinstance(event, LogBatch):
                self._log_lines -= len(event.lines)
            else:
                self._other -= 1
            return event
        if self._dropped:
            process, missed = next(iter(self._dropped.items()))
            del self._dropped[process]
            return LogBatch(process=process, lines=(), dropped=missed)
        return None

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        while True:
            event = self._pop()
            if event is not None:
                return event
            if self.closed:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()

    def close(self) -> None:
        """Stop receiving; events already queued are still delivered, then iteration ends."""
        if not self.closed:
            self.closed = True
            self._bus.remove(self)
            self._wakeup.set()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    """Publishes each event to every open subscription."""

    def __init__(self) -> None:
        self._subscriptions: list[Subscription] = []

    def subscribe(self, max_pending: int = 10_000) -> Subscription:
        subscription = Subscription(self, max_pending)
        self._subscriptions.append(subscription)
        return subscription

    def remove(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)

    def publish(self, event: Event) -> None:
        for subscription in self._subscriptions:
            subscription.offer(event)
