"""``/metrics`` in Prometheus text format under vLLM's metric names.

The supervisor derives ``inference/tokens_per_s`` from ``vllm:generation_tokens_total``
whichever backend runs, so the names and labels match vLLM's.
"""

from __future__ import annotations

from grpo_trainer.serve.engine import Engine

FINISH_REASONS = ("stop", "length", "abort")


def render_metrics(engine: Engine, model_name: str) -> str:
    """The current counters and gauges of ``engine`` as Prometheus exposition text."""
    label = f'model_name="{model_name}"'
    stats = engine.stats
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{label}}} {engine.gate.running}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{label}}} {engine.gate.waiting}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{label}}} 0.0",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{label}}} {float(stats.prompt_tokens)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{label}}} {float(stats.generation_tokens)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    for reason in FINISH_REASONS:
        count = float(stats.finished.get(reason, 0))
        lines.append(f'vllm:request_success_total{{finished_reason="{reason}",{label}}} {count}')
    return "\n".join(lines) + "\n"
