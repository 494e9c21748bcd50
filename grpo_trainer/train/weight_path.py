"""The trainer's weight path through inference restarts and mode switches, at step boundaries.

Rank 0 reads the supervisor's notices (``grpo_trainer.run_notices``) at every step boundary,
while it waits for a batch and before it retries a failed sync; every rank acts on what it
decides (one broadcast):

- **inference down**: wait until it is up again (the rollout API holds the environments
  meanwhile, so nothing is sampled from a restarted server's stale weights);
- **a new inference incarnation**: re-attach (``WeightSync.attach`` on the new server: a new
  NCCL transfer group, new IPC handles, the adapter loaded again, shared memory mapped
  again), push the current weights, report the served version with the new incarnation
  (which ends the API's hold). No trainer restart; the lag bound holds, since nothing was
  sampled in between;
- **a mode switch** (``mode_switch.json``): switch in place (the trainer's ``switch_mode``:
  ``train/switch.py``, given by ``session.py``; the path knows the trainer only through
  ``PathOwner``, so that neither imports the other).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from torch import nn

from grpo_trainer.ranks.group import Dist
from grpo_trainer.run_notices import (
    MODE_SWITCH_FILE,
    IncarnationWatch,
    ModeSwitch,
    NoticeWatcher,
)
from grpo_trainer.sync.base import SyncResult, WeightSync
from grpo_trainer.sync.client import SyncError
from grpo_trainer.sync.restart import SupervisorStopping
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.sources import BatchSource

DOWN_WAIT = 900.0
"""Seconds the trainer waits for inference to come back before it stops."""
SAY_EVERY = 15.0
RESTART_SEEN_WAIT = 5.0
"""After a failure that may be a restarting server: seconds for the supervisor's word."""


class SyncLagExceeded(RuntimeError):
    """Weight sync kept failing and training would run on weights staler than allowed."""


class InferenceGone(SyncLagExceeded):
    """Inference stayed down longer than ``DOWN_WAIT``."""


class PathOwner(Protocol):
    """What the weight path reads and moves on the trainer it serves (``loop.Trainer``)."""

    config: TrainerConfig
    world: Dist
    reporter: Reporter
    source: BatchSource | None
    strategy: WeightSync | None
    model: nn.Module
    step: int
    policy_version: int
    last_synced_step: int
    stop_requested: bool


class WeightPath:
    """Notices read by rank 0, decisions carried out on every rank of ``trainer``;
    ``switch_mode`` switches it in place (None: a switch asked is not taken)."""

    def __init__(
        self, trainer: PathOwner, switch_mode: Callable[[ModeSwitch], None] | None = None
    ) -> None:
        self.trainer = trainer
        self.switch_mode = switch_mode
        self.incarnation = IncarnationWatch()
        self.failed_attempts = 0
        """Attempts of the last sync (``attempt``) that failed: the step reports them."""
        """The inference incarnation the weights were last pushed to (rank 0 reads it)."""
        self.switches = NoticeWatcher.in_run(MODE_SWITCH_FILE, ModeSwitch)
        current = self.switches.current()
        self.switch_serial = current.serial if current is not None else 0
        """Switches up to this one are done (a trainer started in the new mode did it)."""

    def pending(self) -> bool:
        """Rank 0: whether a notice waits (the batch wait stops early for it)."""
        return (
            self._switch_asked() is not None
            or self.incarnation.down()
            or self.incarnation.restarted()
        )

    def _switch_asked(self) -> ModeSwitch | None:
        """Rank 0: a switch asked since the last one done (None without ``switch_mode``)."""
        notice = self.switches.current()
        if self.switch_mode is None or notice is None or notice.serial <= self.switch_serial:
            return None
        return notice

    def take(self, *, switches: bool = True) -> bool:
        """Collective: act on what rank 0 decides; True when the weights were pushed."""
        trainer = self.trainer
        mine = self._decide(switches) if trainer.world.is_main else None
        decision = trainer.world.broadcast(mine)
        if decision is None:
            return False
        kind, payload = decision
        if kind == "reattach":
            self.reattach()
            return True
        notice = ModeSwitch.model_validate(payload)
        self.switch_serial = max(self.switch_serial, notice.serial)
        assert self.switch_mode is not None  # rank 0 decides a switch only with it
        self.switch_mode(notice)
        return True

    def _decide(self, switches: bool) -> tuple[str, Any] | None:
        """Rank 0: ``("reattach", None)``, ``("switch", notice)`` or None."""
        if self.incarnation.down():
            self._wait_until_up()
        if self.incarnation.restarted():
            return "reattach", None
        notice = self._switch_asked() if switches else None
        return None if notice is None else ("switch", notice.model_dump())

    def _wait_until_up(self) -> None:
        """Rank 0: wait while the supervisor says inference is down (a stop request ends the
        wait; ``InferenceGone`` after ``DOWN_WAIT`` seconds)."""
        trainer = self.trainer
        since = time.monotonic()
        say_at = since + SAY_EVERY
        while self.incarnation.down() and not trainer.stop_requested:
            waited = time.monotonic() - since
            if waited > DOWN_WAIT:
                raise InferenceGone(
                    f"inference has been down for {waited:.0f} s (its restarts failed?); "
                    f"stopping after step {trainer.step}"
                )
            if time.monotonic() >= say_at:
                trainer.reporter.event(
                    "info", f"waiting for inference to restart (down for {waited:.0f} s)"
                )
                say_at += SAY_EVERY
            time.sleep(0.05)

    def reattach(self) -> None:
        """Re-establish the weight path to a new inference server and push our weights
        (the attach itself where it serves them: ``WeightSync.attach_serves``)."""
        trainer = self.trainer
        started = time.perf_counter()
        if trainer.world.is_main:
            self.incarnation.adopt()  # before attaching: a server restarted since is newer
        if trainer.strategy is not None:
            try:
                trainer.model = trainer.strategy.attach(trainer.model)
            except Exception as exc:  # any failure of the new server's side
                raise SyncLagExceeded(
                    f"re-attaching to the restarted inference server failed: {exc}; stopping"
                ) from exc
            if trainer.strategy.attach_serves:
                self.synced(SyncResult(sync_time=0.0, policy_version=trainer.step))
            else:
                self.sync_now("weight sync after an inference restart")
        self.report()
        trainer.reporter.event(
            "info",
            f"inference restarted (incarnation {self.incarnation.attached}): weight path "
            f"re-established, weights of step {trainer.step} served "
            f"{time.perf_counter() - started:.2f} s after the restart was seen",
        )

    def release_device(self) -> None:
        """Collective: inference releases the GPU before a training step (``colocate``'s
        sleep). When that fails because inference is restarting (the supervisor says so
        within ``RESTART_SEEN_WAIT`` s), the weight path is re-established first (``take``:
        wait until up, re-attach, push the weights) and the new server sleeps; the batch in
        hand stays valid, it was generated before. Any other failure stops the run."""
        trainer = self.trainer
        strategy = trainer.strategy
        assert strategy is not None
        failure = ""
        try:
            strategy.before_train_step()
        except SyncError as exc:
            failure = str(exc)
        if not trainer.world.any(bool(failure)):
            return
        restarting = self._restart_seen() if trainer.world.is_main else None
        if trainer.world.broadcast(restarting):
            trainer.reporter.event(
                "warning",
                f"inference restarting before step {trainer.step + 1} ({failure or 'on a peer'})"
                "; re-attaching before the step",
            )
            self.take(switches=False)
            try:
                strategy.before_train_step()
                return
            except SyncError as exc:
                failure = str(exc)
        raise SyncLagExceeded(
            f"inference did not release the device before step {trainer.step + 1}: "
            f"{failure or 'failed on another rank'}; stopping"
        )

    def _restart_seen(self) -> bool:
        """Rank 0: whether the supervisor says, within ``RESTART_SEEN_WAIT`` s, that
        inference is down or a new incarnation is up."""
        deadline = time.monotonic() + RESTART_SEEN_WAIT
        while time.monotonic() < deadline:
            if self.incarnation.down() or self.incarnation.restarted():
                return True
            time.sleep(0.05)
        return False

    def attempt(self, why: str) -> tuple[SyncResult | None, str]:
        """Sync at the current step, retried with backoff (``sync_retries``); between two
        attempts an inference restart is followed first (a re-attach pushes the weights).

        Returns the result (None when every attempt failed, when a re-attach pushed the
        weights instead, or when the supervisor is stopping: then a stop is requested) and
        the last failure.
        """
        trainer = self.trainer
        failure = ""
        delay = 0.5
        self.failed_attempts = 0
        for attempt in range(trainer.config.sync_retries + 1):
            try:
                result = trainer.strategy.sync(trainer.model, trainer.step)  # type: ignore[union-attr]
            except SupervisorStopping as exc:
                trainer.reporter.event("info", f"stopping after step {trainer.step}: {exc}")
                trainer.stop_requested = True
                return None, ""
            except Exception as exc:  # a strategy may fail in many ways; all are retried
                failure = str(exc)
                self.failed_attempts += 1
                trainer.reporter.event(
                    "warning",
                    f"{why} at step {trainer.step} failed (attempt {attempt + 1}): {exc}",
                )
                if attempt < trainer.config.sync_retries:
                    if self.take(switches=False):
                        return None, ""
                    time.sleep(delay)
                    delay = min(delay * 2, 10.0)
                continue
            self.synced(result)
            return result, ""
        return None, failure

    def sync_now(self, why: str) -> None:
        """``attempt``, stopping the run (``SyncLagExceeded``) when it fails throughout."""
        result, failure = self.attempt(why)
        if result is None and failure:
            raise SyncLagExceeded(
                f"{why}: inference could not be given the weights of step {self.trainer.step} "
                f"(last failure: {failure}); stopping"
            )

    def synced(self, result: SyncResult) -> None:
        """A sync finished: the served version moves and is reported. After a sync that
        restarted inference itself, the incarnation it started is the one attached to."""
        trainer = self.trainer
        trainer.policy_version = result.policy_version
        trainer.last_synced_step = trainer.step
        if trainer.world.is_main and result.incarnation is not None:
            self.incarnation.started(result.incarnation)
        self.report()

    def report(self) -> None:
        """Tell the rollout API what inference serves: version, name, incarnation."""
        trainer = self.trainer
        if trainer.source is None:
            return
        model = trainer.strategy.served_model if trainer.strategy is not None else None
        trainer.source.served(trainer.policy_version, model, self.incarnation.attached)
