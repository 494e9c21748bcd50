"""Training-health alerts: the thresholds of a healthy GRPO run, checked on a snapshot.

The healthy bands are the Atropos example trainer's (references.md §2): ``mean_ratio`` in
0.8-1.2, ``clipped_fraction`` below 0.3. Trainer and inference logprobs differ for two
reasons, told apart by the lag-0 figures (sequences sampled at the very weights being
trained, where off-policy drift cannot enter): a **weight-sync error** shows in
``alignment/diff_abs_mean_lag0`` (alert above 0.1), **off-policy drift** (samples from
weights steps old) in ``mismatch_kl`` while the lag-0 figures stay small. The all-token
``alignment/diff_abs_mean`` mixes both (its 0.1 line was crossed in the first steps of most
quickstart runs by drift alone) and is charted, not alerted on. Each alert names what to
highlight: a chart id or a process name. No textual import here.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_tui.run_state import RunState

MEAN_RATIO_BAND = (0.8, 1.2)
CLIPPED_FRACTION_MAX = 0.3
ALIGNMENT_DIFF_MAX = 0.1
"""Lag-0 mean |Δlogp| above this is a weight-sync error (bf16 rounding alone: ~5e-3)."""
MISMATCH_KL_MAX = 0.05
"""``mismatch_kl`` (k3 of KL(inference || trainer) per token) above this: the trainer is
far from the policy that sampled its batch."""
STALENESS_MAX = 8
"""A sequence more steps stale than any default profile queues (``max_batches_offpolicy``
batches plus ``sync_every`` steps)."""
LAG0_RECENT_STEPS = 10
"""Steps within which a lag-0 figure still tells a sync error from drift."""
SYNC_FAILURE_WINDOW = 120.0
"""Seconds the sync alert holds after a step whose sync failed (unless one succeeds)."""


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
    alerts += _mismatch_alerts(state)
    for row in state.processes.values():
        if row.crash_looping(now):
            alerts.append(
                Alert(
                    f"crash:{row.name}",
                    f"{row.name} is crash-looping ({row.restarts} restarts)",
                    process=row.name,
                )
            )
    failed = state.sync_failure
    if failed is not None and now - failed.t <= SYNC_FAILURE_WINDOW:
        message = f"weight sync is failing (step {failed.step}: {failed.attempts} failed attempts)"
        alerts.append(Alert("sync", message, chart="sync_time"))
    for lost in state.needs_lost.values():
        failed = ", ".join(lost.failed)
        doing = "waiting on" if lost.action == "wait" else "stopping: lost"
        alerts.append(
            Alert(
                f"need:{lost.process}",
                f"{lost.process} cannot go on, {doing} {lost.need} ({failed} failed)",
                process=next(iter(lost.failed), lost.process),
            )
        )
    if state.stall is not None:
        stall = state.stall
        alerts.append(
            Alert(
                f"stall:{stall.process}:{stall.t}",
                f"{stall.process} stalled {stall.seconds:.0f} s: {'; '.join(stall.causes)}",
                process=stall.process,
            )
        )
    return alerts


def _recent_lag0(state: RunState, name: str) -> float | None:
    """A lag-0 figure if the trainer reported one in the last :data:`LAG0_RECENT_STEPS`
    steps (a step without lag-0 sequences reports none)."""
    value, step, now = (
        state.metrics.latest.get(name),
        state.metrics.latest_step.get(name),
        state.step(),
    )
    if value is None or step is None or (now is not None and now - step > LAG0_RECENT_STEPS):
        return None
    return value


def _mismatch_alerts(state: RunState) -> list[Alert]:
    """Sync error (lag-0 difference), off-policy drift (mismatch_kl with a small lag-0
    figure) and staleness out of bounds, each saying which cause it is."""
    latest = state.metrics.latest
    alerts = []
    lag0_diff = _recent_lag0(state, "alignment/diff_abs_mean_lag0")
    sync_error = lag0_diff is not None and lag0_diff > ALIGNMENT_DIFF_MAX
    if sync_error:
        alerts.append(
            Alert(
                "alignment",
                f"weight-sync error: on sequences sampled at the weights being trained (lag 0) "
                f"trainer and inference logprobs differ by {lag0_diff:.3f} > "
                f"{ALIGNMENT_DIFF_MAX}: inference does not serve the trained weights",
                chart="alignment",
            )
        )
    mismatch = latest.get("mismatch_kl")
    if mismatch is not None and mismatch > MISMATCH_KL_MAX and not sync_error:
        lag = latest.get("off_policy_lag")
        lag0_kl = _recent_lag0(state, "mismatch_kl/lag0")
        if lag0_kl is None:
            cause = "no lag-0 sequences lately to tell a sync error from off-policy drift"
        else:
            cause = (
                f"off-policy drift: the lag-0 figure is {lag0_kl:.4f}, so the difference comes "
                f"from samples of older weights (mean lag {lag or 0:.1f} steps); fewer queued "
                "batches (api.max_batches_offpolicy) or a lower lr bring it down"
            )
        alerts.append(
            Alert(
                "mismatch_kl",
                f"mismatch_kl {mismatch:.4f} > {MISMATCH_KL_MAX}: {cause}",
                chart="mismatch_kl",
            )
        )
    negative = latest.get("staleness/negative")
    stalest = latest.get("staleness/max")
    steps = state.metrics.latest_step
    if negative and steps.get("staleness/negative") == steps.get("staleness/max"):
        alerts.append(
            Alert(
                "staleness",
                f"{negative:.0%} of the step's sequences came from weights newer than the "
                "trainer's (lag < 0): samples of an abandoned policy after a resume",
                chart="staleness",
            )
        )
    elif stalest is not None and stalest > STALENESS_MAX:
        alerts.append(
            Alert(
                "staleness",
                f"sequences {stalest:.0f} steps stale (> {STALENESS_MAX}): inference serves "
                "old weights (a sync failing?) or the queue holds too many batches",
                chart="staleness",
            )
        )
    return alerts
