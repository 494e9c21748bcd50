"""The environment's client of the rollout API (the Atropos environment side).

``POST /register-env`` until the API stops answering "wait for trainer to start" (then
``grpo-env registered`` is printed: the supervisor's readiness probe), ``GET /info`` for
the batch shape, ``GET /status-env`` for the queue and the versions it reports, ``POST
/scored_data`` for each group, ``POST /disconnect-env`` at the end. An API that forgot us
(a reset) is registered with again; an unreachable one is retried with backoff.

Delivery is **at most once**: a group is re-posted only when the API provably did not
queue it (connection refused, 503, or rejected unread for an unknown ``env_id``); when the
connection drops after the request went out, the group is counted in
``env/groups_unconfirmed`` and not re-sent, so the queue never holds a duplicate.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from grpo_trainer.envs.groups import Group
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.envs.stats import EnvStats
from grpo_trainer.envs.waits import Backoff, StopFlag

log = logging.getLogger("grpo_trainer.envs")

READY_LINE = "grpo-env registered"
NOT_DELIVERED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError)
FORGOTTEN = (400, 404, 422)
"""Statuses with which the API rejects a request for an ``env_id`` it does not know."""


class FatalEnvError(RuntimeError):
    """Something retrying cannot fix (e.g. the API refuses our registration)."""


class RolloutApi:
    """One environment's registration with the rollout API and its requests to it."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: EnvSettings,
        stats: EnvStats,
        stop: StopFlag,
    ) -> None:
        self.http = http
        self.settings = settings
        self.stats = stats
        self.stop = stop
        self.env_id: int | None = None
        self.batch_size = 0
        self.max_token_len = settings.max_token_length
        self.current_step = 0
        self.served_version: int | None = None
        """The trainer step whose weights inference serves, as our API reports it (None:
        not reported, e.g. an Atropos API): between syncs it lags ``current_step``."""
        self.served_model: str | None = None
        """The name inference serves those weights under, as the trainer reported it with
        the version (a new adapter at each ``lora_only`` sync); else ``model_name``."""
        self._up = True
        self._registering = asyncio.Lock()
        self._registrations = 0

    @property
    def url(self) -> str:
        return str(self.http.base_url)

    async def register(self) -> dict[str, Any] | None:
        """``POST /register-env``, retried while the trainer has not started or the API is
        down; the API's answer, or None when asked to stop first."""
        body = {
            "max_token_length": self.settings.max_token_length,
            "desired_name": self.settings.registered_name,
            "weight": self.settings.weight,
            "group_size": self.settings.group_size,
            "min_batch_allocation": self.settings.min_batch_allocation,
        }
        backoff = Backoff(cap=2.0)
        said_waiting = False
        while not self.stop.is_set():
            try:
                response = await self.http.post("/register-env", json=body)
            except httpx.TransportError as exc:
                self._down(exc)
                await self.stop.sleep(backoff.next())
                continue
            self._back()
            if response.status_code >= 500:
                await self.stop.sleep(backoff.next())
                continue
            if response.status_code >= 400:
                raise FatalEnvError(
                    f"the API refused /register-env ({response.status_code}): {response.text}"
                )
            try:
                answer = response.json()
            except ValueError:
                log.warning("/register-env answered non-JSON: %r", response.text[:200])
                await self.stop.sleep(backoff.next())
                continue
            if answer.get("status") == "success":
                self.env_id = int(answer["env_id"])
                self._registrations += 1
                print(READY_LINE, flush=True)
                log.info("registered as env_id=%s (%s)", self.env_id, answer)
                return answer
            if not said_waiting:
                log.info("API says %r; retrying until the trainer starts", answer.get("status"))
                said_waiting = True
            await self.stop.sleep(backoff.next())
        return None

    async def _reregister(self, reason: str, seen: int) -> None:
        """Register again (the API forgot us, e.g. after a reset); one worker does it.

        ``seen`` is the registration count when the refused request was sent: a request
        that raced an earlier re-registration does not register a second time. (Counted,
        not compared by ``env_id``: after a reset the API may hand out the same id again.)
        """
        async with self._registering:
            if self._registrations == seen:
                log.warning("registering again: %s", reason)
                await self.register()

    async def read_info(self) -> None:
        """``GET /info``: the trainer's batch size and ``max_token_len`` (retried)."""
        backoff = Backoff()
        info: dict[str, Any] = {}
        while not self.stop.is_set():
            try:
                response = await self.http.get("/info")
                response.raise_for_status()
                info = response.json()
                break
            except (httpx.TransportError, httpx.HTTPStatusError, ValueError) as exc:
                log.warning("GET /info failed (%r); retrying", exc)
                await self.stop.sleep(backoff.next())
        self.batch_size = int(info.get("batch_size", -1))
        max_len = int(info.get("max_token_len", -1))
        if max_len > 0:
            self.max_token_len = max_len

    async def status(self, wait: float = 0.0) -> dict[str, Any] | None:
        """``GET /status-env`` (JSON body on a GET, as Atropos does); None on failure.

        ``wait``: our API holds a paused answer up to that long, until the queue has room.
        """
        seen = self._registrations
        try:
            response = await self.http.request(
                "GET", "/status-env", json={"env_id": self.env_id}, params={"wait": wait}
            )
        except httpx.TransportError as exc:
            self._down(exc)
            return None
        self._back()
        if response.status_code in FORGOTTEN and "env" in response.text:
            await self._reregister(f"/status-env answered {response.status_code}", seen)
            return None
        if response.status_code != 200:
            return None
        status = response.json()
        self.take_versions(status)
        return status

    def take_versions(self, status: dict[str, Any]) -> None:
        """The step and the served version an API status carries."""
        self.current_step = int(status.get("current_step", self.current_step))
        served = status.get("served_version")
        self.served_version = None if served is None else int(served)
        model = status.get("served_model")
        self.served_model = model if isinstance(model, str) and model else None

    async def post(self, groups: list[Group]) -> tuple[bool, dict[str, Any] | None]:
        """``POST /scored_data`` of one group (``/scored_data_list`` of several: queued all
        or none), at most once: whether they were queued (or may have been), and the queue
        status our API answered with (None from Atropos)."""
        backoff = Backoff()
        registered_again = False
        route = "/scored_data" if len(groups) == 1 else "/scored_data_list"
        what = "group" if len(groups) == 1 else f"{len(groups)} groups"
        while True:
            seen = self._registrations
            payloads = [g.payload(self.env_id, self.settings.registered_name) for g in groups]
            try:
                response = await self.http.post(
                    route,
                    json=payloads[0] if len(groups) == 1 else payloads,
                    params={"env_status": "true"},
                )
            except NOT_DELIVERED as exc:
                if self.stop.is_set():
                    self.stats.error("api_unreachable", f"{what} not sent at shutdown: {exc!r}")
                    return False, None
                self._down(exc)
                await self.stop.sleep(backoff.next())
                continue
            except httpx.TransportError as exc:
                self._down(exc)
                self.stats.count("groups_unconfirmed", len(groups))
                self.stats.error("api_connection_lost", f"{what} may or may not be queued: {exc!r}")
                return True, None
            self._back()
            if response.status_code == 200:
                self.stats.count("groups_sent", len(groups))
                return True, self._posted_status(response)
            if response.status_code == 503:
                await self.stop.sleep(backoff.next())
                continue
            forgotten = response.status_code in FORGOTTEN and "env_id" in response.text
            if forgotten and not registered_again:
                registered_again = True
                await self._reregister(f"{route} answered {response.status_code}", seen)
                continue
            self.stats.error(
                "api_rejected",
                f"{route} answered {response.status_code}: {response.text[:300]}",
            )
            return False, None

    def _posted_status(self, response: httpx.Response) -> dict[str, Any] | None:
        """The queue status our API answers a post with (absent from Atropos's)."""
        try:
            status = response.json().get("env_status")
        except (ValueError, AttributeError):
            return None
        if not isinstance(status, dict):
            return None
        self.take_versions(status)
        return status

    async def disconnect(self) -> None:
        """``POST /disconnect-env`` when registered (best effort: we are stopping)."""
        if self.env_id is None:
            return
        try:
            await self.http.post("/disconnect-env", json={"env_id": self.env_id})
        except httpx.TransportError:
            log.info("API unreachable at shutdown; not disconnected")

    def _down(self, exc: Exception) -> None:
        """Log the start of an API outage once; requests retry with backoff meanwhile."""
        if self._up:
            self._up = False
            log.warning("API unreachable at %s (%r); retrying with backoff", self.url, exc)

    def _back(self) -> None:
        if not self._up:
            self._up = True
            log.info("API reachable again at %s", self.url)
