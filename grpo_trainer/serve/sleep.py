"""Sleep mode of the built-in server: vLLM's ``/sleep``, ``/wake_up`` and ``/is_sleeping``.

``colocate`` time-shares one device between the trainer and the server: the trainer puts
the server to sleep before its training step and wakes it after the weight sync. While
asleep the server

- admits no generation: requests that arrive wait (they are held, never refused) and are
  served after the wake-up, like vLLM's paused scheduler;
- has released what it can: nothing of a finished request is kept (its KV cache lives only
  while it decodes), young reference cycles are collected, and on CUDA the caching
  allocator's free blocks go back to the driver (``torch.cuda.empty_cache``) so the
  trainer can use them.

The weights stay: in ``colocate`` they are the trainer's own (shared memory or CUDA IPC),
so level 2 (vLLM: discard the weights too) behaves like level 1 here. ``/wake_up`` takes
vLLM's ``tags`` (``weights``, ``kv_cache``; none = all): generation resumes once every tag
is awake. Needs ``--enable-sleep-mode``, as vLLM does.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import torch
from fastapi import APIRouter, FastAPI, Query

TAGS = ("weights", "kv_cache")


class SleepError(ValueError):
    """A sleep request the server refuses (sleep mode off, unknown tag)."""


class SleepState:
    """Admission of generation requests against the sleep state, on the event loop."""

    def __init__(self, device: torch.device, *, enabled: bool) -> None:
        self.device = device
        self.enabled = enabled
        self.level = 0
        self.asleep: set[str] = set()
        self.running = 0
        self.waiting = 0
        self.freed_bytes = 0
        self._cond = asyncio.Condition()

    @property
    def sleeping(self) -> bool:
        """True from ``sleep`` until every tag is awake again."""
        return bool(self.asleep)

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Hold a generation slot; waits while the server sleeps."""
        async with self._cond:
            self.waiting += 1
            try:
                await self._cond.wait_for(lambda: not self.asleep)
            finally:
                self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            async with self._cond:
                self.running -= 1
                self._cond.notify_all()

    async def sleep(self, level: int, mode: Literal["wait", "abort"]) -> dict[str, Any]:
        """Stop admitting requests, let the running ones finish, release memory.

        ``mode`` is accepted for vLLM's signature; the built-in server always lets running
        requests finish (a request is seconds at most on the tiny model).
        """
        if not self.enabled:
            raise SleepError("sleep mode is not enabled: start the server with --enable-sleep-mode")
        if level not in (1, 2):
            raise SleepError(f"level must be 1 or 2, got {level}")
        async with self._cond:
            self.asleep = set(TAGS)
            self.level = level
            await self._cond.wait_for(lambda: self.running == 0)
        self.freed_bytes = await asyncio.to_thread(self._release)
        return {"status": "sleeping", "level": level, "mode": mode, "freed_bytes": self.freed_bytes}

    def _release(self) -> int:
        """Drop what finished requests left behind; bytes returned to the device.

        A finished request's tensors (its KV cache) go by reference counting; a young-
        generation collection frees any caught in a cycle (16 ms; a full one took ~1 s
        with torch and transformers loaded, per step, for nothing more).
        """
        gc.collect(1)
        if self.device.type != "cuda":
            return 0
        before = torch.cuda.memory_reserved(self.device)
        torch.cuda.empty_cache()
        return before - torch.cuda.memory_reserved(self.device)

    async def wake_up(self, tags: list[str] | None) -> dict[str, Any]:
        """Wake ``tags`` (all when None); generation resumes once none is asleep."""
        if not self.enabled:
            raise SleepError("sleep mode is not enabled: start the server with --enable-sleep-mode")
        unknown = sorted(set(tags or ()) - set(TAGS))
        if unknown:
            raise SleepError(f"unknown tags {unknown}; known: {', '.join(TAGS)}")
        async with self._cond:
            self.asleep -= set(tags or TAGS)
            if not self.asleep:
                self.level = 0
            self._cond.notify_all()
        return {"status": "sleeping" if self.asleep else "awake", "asleep": sorted(self.asleep)}


def attach_router(app: FastAPI, state: SleepState) -> None:
    """Add ``/sleep``, ``/wake_up`` and ``/is_sleeping`` (vLLM's dev-mode routes)."""
    router = APIRouter()

    @router.post("/sleep")
    async def sleep(level: int = 1, mode: Literal["wait", "abort"] = "wait") -> dict[str, Any]:
        return await state.sleep(level, mode)

    @router.post("/wake_up")
    async def wake_up(tags: Annotated[list[str] | None, Query()] = None) -> dict[str, Any]:
        return await state.wake_up(tags)

    @router.get("/is_sleeping")
    async def is_sleeping() -> dict[str, Any]:
        return {
            "is_sleeping": state.sleeping,
            "level": state.level,
            "asleep": sorted(state.asleep),
            "waiting": state.waiting,
        }

    app.include_router(router)
