"""Failures of the task's code, seen: counted, reported, and bounded.

A task is a user's code: its ``sample`` or ``score`` may raise (or score NaN) on every
prompt, or only on some. Each failure costs its group and is counted (``env/task_errors``,
with its kind in ``env/errors``); the first one is reported with its traceback as an
``error`` event, the running count at 10, 100, 1000 ... failures as a ``warning``, and each
report carries the share of groups the task failed since the previous one
(``env/error_rate``) and the failures in a row (``env/consecutive_task_errors``). While
the last group failed (failures in a row) the environment reports its health failing to
the supervisor, with the last failure; ok again after a group the task ran through. A task
that fails only sometimes keeps the environment going. After ``max_consecutive_errors``
failures in a row nothing is being produced: :class:`TaskFailing` ends the environment
with exit status 1, so the supervisor's restart policy applies, and its message is the
process's last line (what a run that gave up shows).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from grpo_trainer.envs.stats import EnvStats, Reporter


class TaskFailing(RuntimeError):
    """The task failed ``max_consecutive_errors`` times in a row: nothing is produced."""


@dataclass
class TaskErrors:
    """The task's failures of one environment process (module docstring)."""

    limit: int
    """``max_consecutive_errors``: failures in a row that end the environment (0: never)."""
    stats: EnvStats
    reporter: Reporter
    in_a_row: int = 0
    last: str = ""
    """The last failure, one line: ``ValueError: boom (in sample())``."""
    _failed: int = 0
    _succeeded: int = 0
    _verdict: str = ""

    @property
    def exhausted(self) -> bool:
        """The limit is reached: the environment must stop."""
        return self.limit > 0 and self.in_a_row >= self.limit

    def succeeded(self) -> None:
        """The task's code ran through for one group (it was sampled and scored)."""
        self._succeeded += 1
        if self.in_a_row:
            self.reporter.health(True, "the task ran through again")
        self.in_a_row = 0

    def failed(self, kind: str, where: str, error: BaseException | str) -> None:
        """The task's code failed in ``where`` (``sample()``, ``score()``): an exception,
        or what was wrong with what it returned."""
        said = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.last = f"{said} (in {where})"
        self.stats.error(kind, self.last)
        self.stats.count("task_errors")
        self._failed += 1
        self.in_a_row += 1
        if self.in_a_row == 1:
            self.reporter.health(False, f"the task fails: {self.last}")
        total = self.stats.counts["task_errors"]
        if total == 1:
            self._report_first(where, said, error)
        elif _power_of_ten(total):
            self.reporter.event(
                f"the task failed {total} times so far ({self.in_a_row} in a row); the last: "
                f"{self.last}",
                level="warning",
            )
        if self.exhausted and not self._verdict:
            self._verdict = (
                f"the task failed {self.in_a_row} times in a row (max_consecutive_errors "
                f"{self.limit}): {self.last}"
            )
            self.reporter.event(self._verdict, level="error")

    def verdict(self) -> str:
        """Why the environment stops (its last line): the failure that reached the limit
        (groups in flight then may fail too)."""
        return self._verdict

    def rates(self) -> dict[str, float]:
        """The metrics of one report; starts the next error-rate window."""
        data = {"env/consecutive_task_errors": float(self.in_a_row)}
        tried = self._failed + self._succeeded
        if tried:
            data["env/error_rate"] = self._failed / tried
        self._failed = self._succeeded = 0
        return data

    def _report_first(self, where: str, said: str, error: BaseException | str) -> None:
        """The first failure: with its traceback, in an ``error`` event (and the log)."""
        if isinstance(error, BaseException):
            trace = "".join(traceback.format_exception(error)).rstrip()
            message = f"the task raised in {where}: {said}\n{trace}"
        else:
            message = f"the task failed in {where}: {said}"
        self.reporter.event(message, level="error")


def _power_of_ten(number: int) -> bool:
    while number % 10 == 0 and number > 1:
        number //= 10
    return number == 1
