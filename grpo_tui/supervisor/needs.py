"""What a process needs to make progress, and what the run does once that has failed.

A spec's ``needs`` name the processes it cannot go on without ("at least 1 of feeder-0,
feeder-1"). Only a process that failed for good counts as lost: one stopped on request or
completed was meant to be (a person or the plan chose it). When a process that still runs,
or will restart, is left with less than it needs, the run's ``on_needed_failure`` decides:
``stop`` ends the run (exit 1, the reason naming what failed) in order, ``wait`` keeps it
going and says what it waits on, until the failed process is started again. Either way a
``NeedLost`` event carries each failed process's reason and last output lines, where the
real error usually is (``No module named ...``), not only "exited with code 1".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from grpo_tui.supervisor.events import Event, NeedLost, NeedRegained, State
from grpo_tui.supervisor.record import ProcessRecord
from grpo_tui.supervisor.spec import Need
from grpo_tui.supervisor.transitions import ENDED

OnNeededFailure = Literal["stop", "wait"]

LAST_LINES = 5
"""Output lines of a failed process carried in ``NeedLost``."""


class NeedWatch:
    """Checks every process's needs after each state change; acts once per loss."""

    def __init__(
        self,
        lives: Mapping[str, ProcessRecord],
        policy: OnNeededFailure,
        publish: Callable[[Event], None],
        end: Callable[[str], None],
    ) -> None:
        self._lives = lives
        self.policy = policy
        self._publish = publish
        self._end = end
        self._lost: set[tuple[str, int]] = set()

    def changed(self) -> None:
        """After any state change: report needs newly lost or regained."""
        lost = set()
        for life in self._lives.values():
            if life.state in ENDED:
                continue  # it no longer runs: it needs nothing
            for index, need in enumerate(life.spec.needs):
                if self._unmet(need):
                    lost.add((life.name, index))
        for name, index in sorted(lost - self._lost):
            self._lose(self._lives[name], self._lives[name].spec.needs[index])
        for name, index in sorted(self._lost - lost):
            needs = self._lives[name].spec.needs
            if index < len(needs) and self._lives[name].state is not State.FAILED:
                self._publish(NeedRegained(process=name, need=needs[index].describe()))
        self._lost = lost

    def _unmet(self, need: Need) -> bool:
        """Fewer than ``at_least`` able to run. Names this run does not have (a spec
        replaced by a stack's edit may name more) are not counted either way."""
        known = [self._lives[name] for name in set(need.any_of) if name in self._lives]
        able = [life for life in known if life.state is not State.FAILED]
        return len(able) < min(need.at_least, len(known))

    def _lose(self, life: ProcessRecord, need: Need) -> None:
        named = [self._lives[n] for n in need.any_of if n in self._lives]
        failed = {f.name: f for f in named if f.state is State.FAILED}
        event = NeedLost(
            process=life.name,
            need=need.describe(),
            action=self.policy,
            failed={n: f.last_reason for n, f in failed.items()},
            last_lines={n: last_lines(f) for n, f in failed.items()},
        )
        self._publish(event)
        if self.policy == "stop":
            self._end(describe_loss(event))


def last_lines(life: ProcessRecord, count: int = LAST_LINES) -> list[str]:
    """The last non-blank lines ``life`` printed."""
    lines = [line for line in life.sink.ring if line.strip()]
    return lines[-count:]


def describe_loss(event: NeedLost) -> str:
    """One line: who cannot go on, what failed, and the last line each failed printed."""
    parts = []
    for name, reason in event.failed.items():
        tail = event.last_lines.get(name)
        parts.append(f"{name} failed ({reason})" + (f": {tail[-1]}" if tail else ""))
    return f"{event.process} cannot go on without {event.need}: {'; '.join(parts)}"
