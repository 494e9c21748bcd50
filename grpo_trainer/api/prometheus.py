"""``GET /metrics``: queue depth, time in queue, the served policy version and
per-environment counters in Prometheus text format (the supervisor scrapes the gauges:
``grpo_tui/supervisor/samplers.py``)."""

from __future__ import annotations

from grpo_trainer.api.store import NO_ENV, Store

COUNTERS = {
    "received": "groups accepted ({'status': 'received'})",
    "served": "groups handed to the trainer for good (plain delivery or ack)",
    "dropped": "groups refused at validation",
}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(store: Store) -> str:
    """The exposition text: totals unlabelled, per-environment series labelled ``env``."""
    names = {str(e.env_id): e.real_name for e in store.envs()}
    names[NO_ENV] = NO_ENV
    pending = store.pending()
    lines = [
        "# HELP grpo_api_queue_groups Groups waiting in the queue (not leased).",
        "# TYPE grpo_api_queue_groups gauge",
        f"grpo_api_queue_groups {len(pending)}",
        "# HELP grpo_api_queue_sequences Sequences waiting in the queue (not leased).",
        "# TYPE grpo_api_queue_sequences gauge",
        f"grpo_api_queue_sequences {sum(p.size for p in pending)}",
        "# HELP grpo_api_leased_batches Batches handed out under a lease, not yet acked.",
        "# TYPE grpo_api_leased_batches gauge",
        f"grpo_api_leased_batches {store.leased_batches()}",
        "# HELP grpo_api_current_step Trainer step (advances on delivery or ack).",
        "# TYPE grpo_api_current_step gauge",
        f"grpo_api_current_step {store.current_step()}",
    ]
    gauges = (
        (
            "grpo_api_time_in_queue_seconds",
            "Mean seconds the groups of the last batch handed out waited in the queue.",
            store.time_in_queue,
        ),
        (
            "grpo_api_served_version",
            "Trainer step whose weights inference serves, as the trainer reported it.",
            store.served_version(),
        ),
        (
            "grpo_api_served_incarnation",
            "Inference incarnation the trainer last pushed its weights to.",
            store.served_incarnation(),
        ),
    )
    for metric, what, value in gauges:
        if value is not None:  # unknown: absent, not 0
            lines += [f"# HELP {metric} {what}", f"# TYPE {metric} gauge", f"{metric} {value}"]
    groups: dict[str, int] = {}
    sequences: dict[str, int] = {}
    for item in pending:
        env = NO_ENV if item.env_id is None else str(item.env_id)
        groups[env] = groups.get(env, 0) + 1
        sequences[env] = sequences.get(env, 0) + item.size
    for metric, series, what in (
        ("grpo_api_env_queue_groups", groups, "Groups waiting, per environment."),
        ("grpo_api_env_queue_sequences", sequences, "Sequences waiting, per environment."),
    ):
        lines += [f"# HELP {metric} {what}", f"# TYPE {metric} gauge"]
        lines += [
            f'{metric}{{env="{_label(names.get(env, env))}"}} {n}' for env, n in series.items()
        ]
    counters = store.counters()
    for name, what in COUNTERS.items():
        metric = f"grpo_api_groups_{name}_total"
        lines += [f"# HELP {metric} Count of {what}.", f"# TYPE {metric} counter"]
        lines += [
            f'{metric}{{env="{_label(names.get(env, env))}"}} {value}'
            for (env, counter), value in sorted(counters.items())
            if counter == name
        ]
    return "\n".join(lines) + "\n"
