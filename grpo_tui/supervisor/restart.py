"""The restart policy's step: what an incarnation's end makes of the process.

An end (:class:`Ended`: its exit code, why, how long it ran, whether a probe failed or its
Slurm job lost a node) and the spec's ``RestartPolicy`` with the consecutive restarts so
far give one :class:`Step`: completed, failed for good, or a backoff of so many seconds
before the next incarnation. A pure function; the life applies it as a transition.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_tui.supervisor.events import State
from grpo_tui.supervisor.spec import RestartPolicy


@dataclass(frozen=True)
class Ended:
    """How an incarnation ended, for the restart policy."""

    code: int | None
    """Its exit code; None when it could not be spawned."""
    reason: str
    lasted: float
    unhealthy: bool = False
    """A probe failed and it was stopped for it: a failure whatever its exit code."""
    lost: str | None = None
    """Why its Slurm job can run it no more (a node lost): not worth a restart."""


@dataclass(frozen=True)
class Step:
    """What the policy makes of an end: the state to go to and why."""

    state: State
    """COMPLETED or FAILED (the life ends), or BACKOFF (it restarts after ``delay``)."""
    reason: str
    attempts: int
    """Consecutive restarts, this one included (what ``max_restarts`` caps)."""
    delay: float = 0.0


def step(ended: Ended, policy: RestartPolicy, attempts: int) -> Step:
    """The policy's answer to ``ended`` after ``attempts`` consecutive restarts (a run of
    ``reset_after`` s starts the count again)."""
    if ended.lost is not None:
        return Step(State.FAILED, f"{ended.reason}; {ended.lost}: not restarted", attempts)
    if ended.lasted >= policy.reset_after:
        attempts = 0
    if ended.code == 0 and not ended.unhealthy and policy.policy != "always":
        return Step(State.COMPLETED, ended.reason, attempts)
    if policy.policy == "no":
        return Step(State.FAILED, ended.reason, attempts)
    if attempts >= policy.max_restarts:
        return Step(State.FAILED, f"{ended.reason}; gave up after {attempts} restarts", attempts)
    delay = policy.delay(attempts)
    return Step(State.BACKOFF, f"{ended.reason}; restart in {delay:g} s", attempts + 1, delay)
