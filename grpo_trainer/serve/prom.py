"""``/metrics`` in Prometheus text format under vLLM's metric names.

The supervisor derives ``inference/tokens_per_s`` from ``vllm:generation_tokens_total``
whichever backend runs, so the names and labels match vLLM's.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpo_trainer.serve.engine import Engine

FINISH_REASONS = ("stop", "length", "abort")


def render_metrics(engines: Sequence[Engine], model_name: str) -> str:
    """The current counters and gauges of every replica as Prometheus exposition text.

    One replica: labelled by ``model_name``; several: also by ``engine`` (vLLM's label for
    its data-parallel engines), one line each.
    """
    several = len(engines) > 1
    labels = [
        f'model_name="{model_name}"' + (f',engine="{index}"' if several else "")
        for index in range(len(engines))
    ]
    metric_lines = {
        "num_requests_running": (
            "gauge",
            "Number of requests in model execution batches.",
            [str(e.gate.running) for e in engines],
        ),
        "num_requests_waiting": (
            "gauge",
            "Number of requests waiting to be processed.",
            [str(e.gate.waiting) for e in engines],
        ),
        "kv_cache_usage_perc": (
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            ["0.0" for _ in engines],
        ),
        "prompt_tokens_total": (
            "counter",
            "Number of prefill tokens processed.",
            [str(float(e.stats.prompt_tokens)) for e in engines],
        ),
        "generation_tokens_total": (
            "counter",
            "Number of generation tokens processed.",
            [str(float(e.stats.generation_tokens)) for e in engines],
        ),
    }
    lines = []
    for name, (kind, text, values) in metric_lines.items():
        lines += [f"# HELP vllm:{name} {text}", f"# TYPE vllm:{name} {kind}"]
        lines += [
            f"vllm:{name}{{{label}}} {value}" for label, value in zip(labels, values, strict=True)
        ]
    lines += [
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    for reason in FINISH_REASONS:
        for label, engine in zip(labels, engines, strict=True):
            count = float(engine.stats.finished.get(reason, 0))
            lines.append(
                f'vllm:request_success_total{{finished_reason="{reason}",{label}}} {count}'
            )
    return "\n".join(lines) + "\n"
