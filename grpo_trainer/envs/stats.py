"""What an environment counts, and where the counts go (log line + control socket).

Counters are cumulative for the process's life; ``env/reward_mean`` is the mean score of
every group scored since the previous report, dropped ones included (so it measures the
policy, not the filter). ``env/latency/<stage>_s`` is the mean time one group spent in
each stage since the previous report: ``room`` (waiting for the queue to have room),
``inference`` (the completions request) and ``post`` (``/scored_data``). Metric names
follow docs/control-socket.md.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from grpo_trainer.control import SupervisorLink

log = logging.getLogger("grpo_trainer.envs")

COUNTERS = (
    "groups_sent",
    "groups_dropped_equal_scores",
    "groups_dropped_too_long",
    "groups_unconfirmed",
    "errors",
    "task_errors",
)


@dataclass
class EnvStats:
    """Running counts of one environment process, plus error reasons for the log."""

    counts: Counter[str] = field(default_factory=Counter)
    error_kinds: Counter[str] = field(default_factory=Counter)
    _scores: list[float] = field(default_factory=list)
    _latency: dict[str, list[float]] = field(default_factory=dict)

    def scored(self, scores: list[float]) -> None:
        """A group was scored (sent or dropped: the reward mean covers both)."""
        self._scores.extend(scores)

    def timed(self, stage: str, seconds: float) -> None:
        """One group spent ``seconds`` in ``stage`` (reported as a mean)."""
        self._latency.setdefault(stage, []).append(seconds)

    def count(self, name: str, events: int = 1) -> None:
        """Count ``events`` events of ``name`` (one of ``COUNTERS``)."""
        self.counts[name] += events

    def error(self, kind: str, reason: str) -> None:
        """Count an error and log its reason; the environment keeps going."""
        self.counts["errors"] += 1
        self.error_kinds[kind] += 1
        log.warning("%s: %s", kind, reason)

    def changed_since(self, report: dict[str, float]) -> bool:
        """Whether a new report would say something ``report`` did not."""
        if self._scores:
            return True
        return any(report.get(f"env/{name}") != float(self.counts[name]) for name in COUNTERS)

    def snapshot(self) -> dict[str, float]:
        """Metrics for one report; resets the reward window."""
        data = {f"env/{name}": float(self.counts[name]) for name in COUNTERS}
        if self._scores:
            data["env/reward_mean"] = sum(self._scores) / len(self._scores)
            self._scores = []
        for stage, values in self._latency.items():
            data[f"env/latency/{stage}_s"] = sum(values) / len(values)
        self._latency = {}
        return data


class Reporter:
    """Sends metrics to the supervisor (when one runs us) and writes them to the log."""

    def __init__(self, link: SupervisorLink | None) -> None:
        self.link = link

    def metrics(self, step: int | None, data: dict[str, float]) -> None:
        """Report one metrics record for trainer step ``step``."""
        text = " ".join(f"{k}={v:.4g}" for k, v in sorted(data.items()))
        log.info("metrics step=%s %s", step, text)
        if self.link is not None:
            self.link.send_metrics(step, data)

    def event(self, message: str, level: str = "info") -> None:
        """Something a person should see in the supervisor's event log (and the log);
        ``level``: ``info``, ``warning`` or ``error``."""
        log.log(logging.getLevelName(level.upper()), "%s", message)
        if self.link is not None:
            self.link.send_event(level, message)

    def health(self, ok: bool, reason: str = "") -> None:
        """Say whether this environment is healthy (the supervisor's health column)."""
        if self.link is not None:
            self.link.send_health(ok, reason)

    def close(self) -> None:
        """Flush what is queued to the supervisor."""
        if self.link is not None:
            self.link.close()
