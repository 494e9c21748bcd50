"""The run's lease on an inference server it attaches to (``[inference] url``, issue 37).

A kept server takes one run at a time (``grpo_trainer/serve/lease.py``). The run takes the
lease before anything starts, so that a server another run holds refuses it at once (exit
2, naming the holder) instead of after its model is built; it renews the lease every third
of its ``ttl`` while it runs, and lets it go at the end (the detach command does too, after
it has reset the server to the base). A renewal the server does not answer is left to the
attach command, which takes the lease again when the server is back; a renewal refused
because another run holds it ends the run: the server is no longer this run's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

import httpx

from grpo_trainer.serve.attach import LeaseHeld, release_lease, take_lease
from grpo_trainer.serve.external import Unreachable
from grpo_trainer.serve.settings import inference_headers
from grpo_tui.plan.roles import Plan
from grpo_tui.plan.specs import lease_holder
from grpo_tui.supervisor.supervisor import Supervisor

TIMEOUT = 5.0


class LeaseKeeper:
    """Takes, renews and lets go of one run's lease on the server at ``url``."""

    def __init__(
        self,
        url: str,
        holder: str,
        label: str,
        ttl: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url
        self.holder = holder
        self.label = label
        self.ttl = ttl
        self.headers = dict(headers or {})

    @classmethod
    def for_plan(cls, plan: Plan) -> LeaseKeeper | None:
        """The keeper of a plan whose inference is a server at a url (else None)."""
        inference = plan.roles.inference
        if inference is None or inference.url is None:
            return None
        holder, label = lease_holder(plan.roles.settings)
        return cls(inference.url, holder, label, inference.lease_ttl, inference_headers())

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=TIMEOUT)

    def _take(self) -> None:
        with self._client() as http:
            take_lease(http, self.holder, self.label, self.ttl)

    def _release(self) -> None:
        with self._client() as http:
            release_lease(http, self.holder)

    async def take(self) -> None:
        """Take the lease; ``LeaseHeld`` (naming the holder) or ``Unreachable``."""
        await asyncio.to_thread(self._take)

    async def keep(self, supervisor: Supervisor) -> None:
        """Renew every third of the ttl until cancelled or the run closes; a refusal
        (another run holds it) ends the run with the reason."""
        while not supervisor.closing:
            await asyncio.sleep(self.ttl / 3)
            if supervisor.closing:
                return
            try:
                await self.take()
            except Unreachable:
                continue  # the server is away: attaching again takes the lease back
            except LeaseHeld as error:
                reason = f"inference at {self.url} is no longer this run's: {error}"
                supervisor.notice(reason, "error")
                await supervisor.shutdown(reason)
                return

    async def release(self) -> None:
        """Let the lease go (nothing happens when another holds it or the server is gone)."""
        with contextlib.suppress(httpx.HTTPError):
            await asyncio.to_thread(self._release)
