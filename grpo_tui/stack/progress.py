"""What the stall watchdog has seen of the trainer and the environments: the trainer's
last step and phase, each environment's counters then and now (``StallWatch`` folds the
run's metrics records into :class:`Progress`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_trainer.train.phases import CURRENT, PHASES
from grpo_tui.supervisor.events import MetricsRecord

STEP_METRIC = "loss"
"""In every record of a trainer step, and only there."""
ENV_SENT = "env/groups_sent"
ENV_DROPPED = "env/groups_dropped_equal_scores"
ENV_ERRORS = "env/errors"
ENV_TOO_LONG = "env/groups_dropped_too_long"
COUNTED = (ENV_SENT, ENV_DROPPED, ENV_ERRORS, ENV_TOO_LONG)


@dataclass
class Progress:
    """What the watch has seen of the trainer and the environments."""

    step: int | None = None
    step_at: float = 0.0
    ready_at: float | None = None
    """When the trainer last became ready (the clock before its first step)."""
    phase: str = "generating"
    phase_at: float = 0.0
    envs: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each environment's cumulative counters, latest."""
    envs_at_step: dict[str, dict[str, float]] = field(default_factory=dict)
    """The same, when the trainer's last step arrived."""
    envs_moved_at: dict[str, float] = field(default_factory=dict)
    """When each environment's counters last moved (a group sent, dropped, an error)."""

    def fold(self, record: MetricsRecord, trainer: str, envs: set[str]) -> bool:
        """Take one metrics record; True when it is a new trainer step."""
        if record.process in envs:
            counts = self.envs.setdefault(record.process, {})
            new = {k: v for k, v in record.data.items() if k in COUNTED}
            if any(counts.get(k) != v for k, v in new.items()):
                self.envs_moved_at[record.process] = record.t
            counts.update(new)
            return False
        if record.process != trainer:
            return False
        if CURRENT in record.data:
            phase = PHASES[int(record.data[CURRENT])]
            if phase != self.phase:
                self.phase, self.phase_at = phase, record.t
        if record.step is None or STEP_METRIC not in record.data:
            return False  # a phase change is not progress; a step (even one redone) is
        self.step, self.step_at = record.step, record.t
        self.envs_at_step = {name: dict(counts) for name, counts in self.envs.items()}
        return True

    def env_delta(self, key: str, name: str | None = None) -> int:
        """How much ``key`` rose since the last step, over every environment or in ``name``
        (a restarted environment counts from 0 again)."""
        total = 0.0
        for env, counts in self.envs.items():
            if name is not None and env != name:
                continue
            before = self.envs_at_step.get(env, {}).get(key, 0.0)
            now = counts.get(key, 0.0)
            total += now - before if now >= before else now
        return int(total)
