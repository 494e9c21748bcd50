"""Training-health alerts: the thresholds of a healthy GRPO run, checked on a snapshot.

The healthy bands are the Atropos example trainer's (references.md §2): ``mean_ratio`` in
0.8-1.2, ``clipped_fraction`` below 0.3, ``alignment/diff_abs_mean`` below 0.1. Each alert
names what to highlight: a chart id or a process name. No textual import here.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_tui.run_state import RunState

MEAN_RATIO_BAND = (0.8, 1.2)
CLIPPED_FRACTION_MAX = 0.3
ALIGNMENT_DIFF_MAX = 0.1
SYNC_FAILURE_WINDOW = 120.0


@dataclass(frozen=True)
class Alert:
    """One active problem; ``key`` is stable so that it is announced once, not every tick."""

    key: str
    message: str
    chart: str | None = None
    process: str | None = None


def evaluate(state: RunState, now: float) -> list[Alert]:
    """Every alert that holds for the latest metrics and process rows."""
    alerts: list[Alert] = []
    latest = state.metrics.latest
    ratio = latest.get("mean_ratio")
    low, high = MEAN_RATIO_BAND
    if ratio is not None and not low <= ratio <= high:
        alerts.append(
            Alert("mean_ratio", f"mean_ratio {ratio:.3f} outside {low}-{high}", chart="mean_ratio")
        )
    clipped = latest.get("clipped_fraction")
    if clipped is not None and clipped > CLIPPED_FRACTION_MAX:
        alerts.append(
            Alert(
                "clipped_fraction",
                f"clipped_fraction {clipped:.3f} > {CLIPPED_FRACTION_MAX}",
                chart="clipped_fraction",
            )
        )
    diff = latest.get("alignment/diff_abs_mean")
    if diff is not None and diff > ALIGNMENT_DIFF_MAX:
        alerts.append(
            Alert(
                "alignment",
                f"alignment/diff_abs_mean {diff:.3f} > {ALIGNMENT_DIFF_MAX}"
                " (trainer and inference logprobs disagree)",
                chart="alignment",
            )
        )
    for row in state.processes.values():
        if row.crash_looping(now):
            alerts.append(
                Alert(
                    f"crash:{row.name}",
                    f"{row.name} is crash-looping ({row.restarts} restarts)",
                    process=row.name,
                )
            )
    if any(now - t <= SYNC_FAILURE_WINDOW for t in state.sync_failures):
        alerts.append(Alert("sync", "weight sync is failing", chart="sync_time"))
    return alerts
