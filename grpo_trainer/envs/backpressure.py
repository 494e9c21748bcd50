"""Back-pressure: a worker samples a group only while the rollout API's queue has room.

The bound is the API's off-policy bound: our API says ``pause`` (and holds a paused answer
as a long poll, ``LONG_POLL`` at most); against an Atropos API the same bound is computed
from ``queue_size`` (``ATROPOS_MAX_BATCHES_OFFPOLICY`` batches). The version read with the
room is the one the group is tagged with, and the model name read with it the one asked of
inference, so a sync between two groups never mixes them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from grpo_trainer.envs.groups import Group
from grpo_trainer.envs.rollout_api import RolloutApi
from grpo_trainer.envs.waits import Backoff

log = logging.getLogger("grpo_trainer.envs")

ATROPOS_MAX_BATCHES_OFFPOLICY = 3
LONG_POLL = 1.0
"""Seconds ``/status-env`` may hold a full-queue answer (bounds how late a stop is seen)."""


class QueueRoom:
    """Waits for room in the API's queue; posts groups and keeps the status they return."""

    def __init__(self, api: RolloutApi, model_name: str, *, poll: float = 0.25) -> None:
        self.api = api
        self.model_name = model_name
        self.poll = poll
        """Seconds between two asks of an API that answers at once (Atropos)."""
        self._paused = False
        self._posted_status: dict[str, Any] | None = None

    def policy_version(self) -> int:
        """The version a group sampled now is tagged with: the weights inference serves.
        Only the trainer's sync moves them, so with ``sync_every`` > 1 they trail the step;
        an API that does not report them (Atropos) leaves the step."""
        api = self.api
        if api.served_version is None:
            return api.current_step
        return min(api.current_step, api.served_version)

    def model(self) -> str:
        """The ``model`` to ask inference for: what the trainer last reported, else ours."""
        return self.api.served_model or self.model_name

    def queue_full(self, status: dict[str, Any]) -> bool:
        """Whether the queue is at its off-policy bound (module docstring)."""
        if "pause" in status:
            return bool(status["pause"])
        if self.api.batch_size <= 0:
            return False
        queued = int(status.get("queue_size", 0)) * self.api.settings.group_size
        return queued >= ATROPOS_MAX_BATCHES_OFFPOLICY * self.api.batch_size

    async def wait(self) -> tuple[int, str] | None:
        """Ask ``/status-env`` until the queue has room; the version to tag the group with
        and the model to ask for it (None: stop).

        The status our API returned with the last post is used once instead of a request
        when it shows room: one request less per group.
        """
        posted, self._posted_status = self._posted_status, None
        if posted is not None and not self.queue_full(posted):
            self._note_pause(False, posted)
            return self.policy_version(), self.model()
        backoff = Backoff(first=self.poll, cap=5.0)
        stop = self.api.stop
        while not stop.is_set():
            asked = time.monotonic()
            status = await self.api.status(wait=LONG_POLL)
            if status is not None:
                full = self.queue_full(status)
                self._note_pause(full, status)
                if not full:
                    return self.policy_version(), self.model()
                if time.monotonic() - asked >= LONG_POLL:
                    continue
            await stop.sleep(self.poll if status is not None else backoff.next())
        return None

    async def post(self, groups: list[Group]) -> bool:
        """Post ``groups`` (at most once, all or none); True when queued or possibly queued."""
        posted, status = await self.api.post(groups)
        if status is not None:
            self._posted_status = status
        return posted

    def _note_pause(self, full: bool, status: dict[str, Any]) -> None:
        """Log each change between producing and pausing for back-pressure."""
        if full == self._paused:
            return
        self._paused = full
        if full:
            log.info("queue full (%s); pausing production", _queue_text(status))
        else:
            log.info("queue has room (%s); producing", _queue_text(status))


def _queue_text(status: dict[str, Any]) -> str:
    if status.get("inference_held"):
        return "inference restarted: waiting for the trainer's weights"
    if "queued_batches" in status:
        return f"{status['queued_batches']:.2f} batches queued"
    return f"{status.get('queue_size')} groups queued"
