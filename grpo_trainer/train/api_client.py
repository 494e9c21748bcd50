"""The trainer's client of the rollout API (Atropos wire protocol, leased batches).

``GET /batch?lease=S`` hands out a batch that stays ours for ``S`` seconds; ``POST
/batch/ack`` after the optimizer step consumes it. A crash before the ack puts the batch
back in the queue when the lease expires, so no rollout is lost. Connection errors are
retried with capped exponential backoff; after an outage the trainer registers again with
its current step, because a restarted API has to learn where the run stands. Every
registration carries the client's ``trainer_id``: a new one tells the API that the trainer
restarted, so the batches the dead one leased go back to the queue at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

LONG_POLL = 1.0
"""Seconds ``GET /batch`` may wait for a batch (bounds how late a stop request is seen)."""


STARVING_AFTER = 60.0
"""Seconds without a batch before the trainer says so (then at doubling intervals)."""


class ApiUnreachable(RuntimeError):
    """The API did not answer within the bounded wait at start."""


class ApiRefused(RuntimeError):
    """The API answered with a client error (e.g. a batch size it cannot serve)."""


class _ServerError(Exception):
    """A 5xx answer: retried like a connection error."""


@dataclass(frozen=True)
class Registration:
    """What ``POST /register`` announces (Atropos field names)."""

    batch_size: int
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    num_steps: int
    wandb_group: str = ""
    wandb_project: str = ""


@dataclass(frozen=True)
class LeasedBatch:
    """Groups of one optimizer step and the lease id to ack (None: plain delivery)."""

    groups: list[dict[str, Any]]
    batch_id: str | None


class ApiClient:
    """Register, take leased batches, ack them; survive API restarts."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        lease_seconds: float = 600.0,
        start_timeout: float = 60.0,
        log: Callable[[str, str], None] = lambda level, message: None,
        starving_after: float = STARVING_AFTER,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url
        self.lease_seconds = lease_seconds
        self.start_timeout = start_timeout
        self.log = log
        self.starving_after = starving_after
        self.http = httpx.Client(base_url=url, headers=headers, timeout=30.0)
        self.registration: Registration | None = None
        self.step = 0
        self.served_version: int | None = None
        self.served_model: str | None = None
        self.served_incarnation: int | None = None
        self._serves_versions = True  # False: the API has no /served-version (Atropos)
        self._needs_register = True
        self.trainer_id = uuid.uuid4().hex
        """This trainer's id in each of its registrations (a restarted one has another)."""

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.http.close()

    def register(self, registration: Registration, step: int) -> None:
        """``POST /register`` with ``starting_step`` = ``step``, waiting (bounded) for the API.

        Raises ``ApiUnreachable`` when the API does not answer within ``start_timeout``.
        """
        self.registration = registration
        self.step = step
        deadline = time.monotonic() + self.start_timeout
        delay = 0.1
        while True:
            try:
                self._post_register()
                return
            except (httpx.TransportError, _ServerError) as exc:
                if time.monotonic() >= deadline:
                    raise ApiUnreachable(
                        f"rollout API at {self.url} did not answer within "
                        f"{self.start_timeout:.0f} s ({exc.__class__.__name__}: {exc}); "
                        "is it running? (--atropos-url, --api-timeout)"
                    ) from None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _post_register(self) -> None:
        if self.registration is None:
            raise RuntimeError("register() first")
        body = {
            **vars(self.registration),
            "starting_step": self.step,
            "trainer_id": self.trainer_id,
        }
        response = self.http.post("/register", json=body)
        if response.status_code >= 500:
            raise _ServerError(f"{response.status_code} {response.text[:200]}")
        if response.status_code >= 400:
            raise ApiRefused(
                f"rollout API refused the registration ({response.status_code}): "
                f"{response.text[:500]}"
            )
        self._needs_register = False
        self._post_served()  # a registration resets what the API knows of it

    def served(
        self, version: int, model: str | None = None, incarnation: int | None = None
    ) -> None:
        """``POST /served-version``: inference serves the weights of step ``version`` under
        ``model`` (pushed to inference ``incarnation``), so environments tag their samples
        with it and ask for that name (best effort: an outage skips it, and the next
        registration or sync sends it again)."""
        self.served_version = version
        self.served_model = model
        self.served_incarnation = incarnation
        self._post_served()

    def _post_served(self) -> None:
        if self.served_version is None or not self._serves_versions:
            return
        try:
            body = {
                "version": self.served_version,
                "model": self.served_model,
                "incarnation": self.served_incarnation,
            }
            response = self.http.post("/served-version", json=body)
        except httpx.TransportError:
            self._needs_register = True
            return
        if response.status_code in (404, 405):
            self._serves_versions = False
            self.log(
                "info",
                "the rollout API has no /served-version (an Atropos API): environments tag "
                "samples with the step, so off_policy_lag reads low between syncs",
            )

    def next_batch(self, should_stop: Callable[[], bool], poll: float = 0.05) -> LeasedBatch | None:
        """Block until the API hands out a batch; None when ``should_stop()`` turns true.

        Empty queue: ask again with ``wait`` (our API answers the moment a batch can be
        cut, up to ``LONG_POLL`` seconds later); an API that answered sooner (Atropos has no
        ``wait``) is polled at an interval growing to 0.5 s. API down: retry with backoff up
        to 5 s and register again with the current step once it is back.
        """
        delay = poll
        outage_since: float | None = None
        params = {"lease": self.lease_seconds, "wait": LONG_POLL}
        since = time.monotonic()
        say_at = since + self.starving_after
        while not should_stop():
            asked = time.monotonic()
            try:
                if self._needs_register:
                    self._post_register()
                response = self.http.get("/batch", params=params)
                if response.status_code >= 500:
                    raise _ServerError(f"{response.status_code} {response.text[:200]}")
            except (httpx.TransportError, _ServerError) as exc:
                if outage_since is None:
                    outage_since = time.monotonic()
                    self.log("warning", f"rollout API unreachable ({exc}); retrying")
                self._needs_register = True
                time.sleep(delay)
                delay = min(max(delay, 0.1) * 2, 5.0)
                continue
            if outage_since is not None:
                gone = time.monotonic() - outage_since
                self.log("info", f"rollout API back after {gone:.1f} s; registered at {self.step}")
                outage_since = None
            batch = self._parse_batch(response)
            if batch is not None:
                return batch
            if time.monotonic() >= say_at:
                waited = time.monotonic() - since
                self.log("warning", self._starving(waited))
                say_at = since + 2 * waited
            if time.monotonic() - asked < LONG_POLL:
                time.sleep(delay)
                delay = min(delay * 1.5, 0.5)
        return None

    def _starving(self, waited: float) -> str:
        """What the API can tell about a missing batch. Which of the causes it is (the
        environments down, or a policy that became deterministic: every group scored
        all-equal and none posted while inference stays busy, the two-GPU stall of
        references.md section 7) only the supervisor sees: its stall watchdog names it."""
        need = self.registration.batch_size if self.registration else "?"
        try:
            queued = self.http.get("/status").json().get("queue_sequences", "?")
        except (httpx.HTTPError, ValueError):
            queued = "?"
        return (
            f"no batch for {waited:.1f} s: the API holds {queued} queued sequences of the "
            f"{need} a step needs. Either the environments are not running (the "
            "supervisor's stall report names the cause) or they post no group: they drop "
            "those whose scores are all equal (env/groups_dropped_equal_scores), all of "
            "them once the policy is deterministic (entropy near 0)"
        )

    def _parse_batch(self, response: httpx.Response) -> LeasedBatch | None:
        if response.status_code == 409:
            self._needs_register = True
            return None
        if response.status_code >= 400:
            raise ApiRefused(f"GET /batch refused ({response.status_code}): {response.text[:500]}")
        payload = response.json()
        if "batch" not in payload:
            self._needs_register = True
            return None
        if payload["batch"] is None:
            return None
        return LeasedBatch(groups=list(payload["batch"]), batch_id=payload.get("batch_id"))

    def ack(self, batch: LeasedBatch, step: int) -> None:
        """``POST /batch/ack`` for a leased batch after its optimizer step; retried on outage."""
        self.step = step
        if batch.batch_id is None:
            return
        delay = 0.1
        for _ in range(8):
            try:
                response = self.http.post("/batch/ack", json={"batch_id": batch.batch_id})
            except httpx.TransportError:
                self._needs_register = True
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if response.status_code >= 400:
                self.log(
                    "warning",
                    f"ack of batch {batch.batch_id} refused ({response.status_code} "
                    f"{response.text[:200]}): its lease expired, the API may serve it again",
                )
            return
        self.log("warning", f"could not ack batch {batch.batch_id}: API unreachable")
