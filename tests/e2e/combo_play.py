"""Play a walk on a fresh stack and check it after every action; shrink a failing one.

``play`` stops at the first action after which an invariant is broken and says which, the
walk and how to replay it. ``shrink`` looks for a shorter walk that breaks one of the same
invariants (delta debugging over the actions, each candidate played on a fresh stack), so
that a failure becomes a regression test of a few actions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from combo_checks import (
    check,
    exit_unclean,
    lag0_settled,
    lag0_transients,
    queue_lost_or_twice,
)
from combo_run import SHUTDOWN_EXIT, ComboRun, Stopped, Violation
from combo_walk import Walk
from e2e_stack import tagged, wait_until

REPLAY = "python benchmarks/combos.py --walk"


@dataclass
class Outcome:
    """How a walk went: the violations found (none: it kept every invariant)."""

    walk: Walk
    violations: list[Violation] = field(default_factory=list)
    failed_after: int | None = None
    """Index of the action after which they were found (``len(walk.actions)``: at the end,
    -1: at the start)."""
    actions_done: int = 0
    seconds: float = 0.0
    run_dir: Path | None = None
    transients: list[str] = field(default_factory=list)
    """Lag-0 alignment off for a step or two after an action, back within its steps."""

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def invariants(self) -> set[str]:
        return {v.invariant for v in self.violations}

    def report(self) -> str:
        if self.ok:
            return f"ok in {self.seconds:.0f} s: {self.walk}"
        where = (
            "at the start"
            if self.failed_after == -1
            else "at the end"
            if self.failed_after == len(self.walk.actions)
            else f"after action {self.failed_after + 1} ({self.walk.actions[self.failed_after]})"
        )
        lines = [f"failed {where} ({self.seconds:.0f} s, run dir {self.run_dir}):"]
        lines += [f"  {v}" for v in self.violations]
        lines.append(f"replay: {REPLAY} '{self.walk}'")
        return "\n".join(lines)


def play(walk: Walk, workdir: Path, say: Callable[[str], None] = print) -> Outcome:
    """Run ``walk`` on a fresh stack under ``workdir``; checked after every action and at
    the end (ordered shutdown, nothing left running, no group lost)."""
    outcome = Outcome(walk)
    began = time.monotonic()
    run = ComboRun(walk.setup, workdir, say)
    say(f"walk {walk}")
    at = -1
    try:
        run.start()
        run.settle(lambda d: lag0_settled(run.files_(), d))
        outcome.violations = check(run.files_(), run.done, run.require_run().alive)
        for action in walk.actions:
            if outcome.violations:
                break
            at += 1
            run.act(action)
            outcome.actions_done = at + 1
            run.settle(lambda d: lag0_settled(run.files_(), d))
            outcome.violations = check(run.files_(), run.done, run.require_run().alive)
        if not outcome.violations:
            at = len(walk.actions)
            code = run.finish()
            files = run.files_()
            outcome.violations = check(files, run.done, alive=True)
            outcome.violations += exit_unclean(files, code, SHUTDOWN_EXIT)
            outcome.violations += _left_running(run.run_id)
            outcome.violations += queue_lost_or_twice(files.run_dir, files, run.done)
    except Stopped as stop:
        outcome.violations = [stop.violation]
        if run.files is not None:
            outcome.violations += check(run.files, run.done, alive=True)
    except Exception as error:  # the harness's own failure: said as such, the walk kept
        outcome.violations = [Violation("harness", f"{type(error).__name__}: {error}")]
    finally:
        run.close()
    if run.files is not None:
        outcome.transients = lag0_transients(run.files, run.done)
    if outcome.violations:
        outcome.failed_after = at
    outcome.seconds = time.monotonic() - began
    outcome.run_dir = run.files.run_dir if run.files is not None else None
    say(outcome.report())
    return outcome


def _left_running(run_id: str) -> list[Violation]:
    """Nothing carrying the run's id lives on (a short wait: the last exits are reaped)."""
    try:
        wait_until(lambda: not tagged(run_id), 10, "the run's processes to end")
    except AssertionError:
        return [Violation("left-running", p) for p in tagged(run_id)]
    return []


def shrink(
    outcome: Outcome,
    workdir: Path,
    *,
    budget: int,
    say: Callable[[str], None] = print,
) -> tuple[Outcome, int]:
    """A shortest walk found (within ``budget`` replays) that breaks one of the invariants
    ``outcome`` broke: the actions after the failure dropped, then chunks of the rest
    (delta debugging, halving the chunks). Returns its outcome and the replays spent."""
    wanted = outcome.invariants
    best = _cut(outcome)
    spent = 0
    parts = 2
    while spent < budget:
        actions = best.walk.actions
        if not actions:
            break
        size = math.ceil(len(actions) / parts)
        for start in range(0, len(actions), size):
            if spent >= budget:
                break
            candidate = best.walk.without(start, start + size)
            spent += 1
            tried = play(candidate, workdir / f"shrink-{spent}", say)
            if tried.invariants & wanted:
                best = _cut(tried)
                parts = max(parts - 1, 2)
                break
        else:
            if size == 1:
                break
            parts = min(parts * 2, len(actions))
    say(f"shrunk to {best.walk} ({spent} replays)")
    return best, spent


def _cut(outcome: Outcome) -> Outcome:
    """``outcome`` with its walk cut after the action that failed (the rest played no part)."""
    at = outcome.failed_after
    if at is None or at >= len(outcome.walk.actions):
        return outcome
    walk = Walk(outcome.walk.setup, outcome.walk.actions[: at + 1])
    return Outcome(walk, outcome.violations, at, at + 1, outcome.seconds, outcome.run_dir)
