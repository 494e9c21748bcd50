"""Where a run's start-up went, from the command to the end of its first optimizer step.

Issue 39: ours took 125-151 s to the first step with CUDA graphs, TRL 67-113 s. This reads
the parts of that time from what every run leaves behind, in the shape of
``restart_phases.py``'s tables:

- grpo-tui (a run directory): when each process was spawned and became ready or completed
  (the supervisor's ``StateChanged`` events: the model build, vLLM, the trainer), the first
  step's end (``metrics.jsonl``), and vLLM's own phases from its log (``inference.log``);
- TRL (its console log and record): the imports, the ``GRPOTrainer`` construction (model
  load and its in-process vLLM) and vLLM's phases from the same log lines.

vLLM's phases (``vllm_startup.PHASES``): weights, Dynamo, Inductor (or the compile cache's
load), CUDA-graph capture, engine init; our launcher logs vLLM's import time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

PHASES = {
    "weights_s": r"Loading weights took ([\d.]+) seconds",
    "dynamo_s": r"Dynamo bytecode transform time: ([\d.]+) s",
    "inductor_s": r"Compiling a graph for compile range .*? takes ([\d.]+) s",
    "cache_load_s": r"Directly load the compiled graph\(s\).*?took ([\d.]+) s",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}
"""vLLM 0.24's log lines for its start-up phases (``vllm_startup.PHASES``); several matches
(one per compile range) are summed."""
IMPORTED = re.compile(r"vllm_launch: vLLM imported in ([\d.]+) s")
"""Our launcher's line (``grpo_trainer.serve``): vLLM's API server imports."""
COLUMNS = (
    ("model built", "model_built"),
    ("vLLM spawned", "inference_spawned"),
    ("vLLM import s", "vllm_import_s"),
    ("weights s", "weights_s"),
    ("Dynamo s", "dynamo_s"),
    ("Inductor s", "inductor_s"),
    ("cache load s", "cache_load_s"),
    ("graph capture s", "graph_capture_s"),
    ("engine init s", "engine_init_s"),
    ("vLLM ready", "inference_ready"),
    ("trainer spawned", "trainer_spawned"),
    ("trainer ready", "trainer_ready"),
    ("TRL imports s", "import_s"),
    ("TRL init s", "init_s"),
    ("first step", "first_step"),
)
"""The start-up table's columns: (heading, key). Times without ``s`` in the key are seconds
from the command's start; the others are durations."""


def vllm_phases(log: str) -> dict[str, float]:
    """vLLM's start-up phases found in a log (summed over repeats), seconds."""
    found = {}
    for key, pattern in PHASES.items():
        values = [float(v) for v in re.findall(pattern, log)]
        if values:
            found[key] = round(sum(values), 2)
    if match := IMPORTED.search(log):
        found["vllm_import_s"] = float(match.group(1))
    return found


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in _read(path).splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def run_startup(run_dir: Path, began: float) -> dict[str, float]:
    """A grpo-tui run's start-up: seconds from ``began`` (the command's wall-clock start)
    to each process's spawn and readiness and to the first step's end, and vLLM's phases."""
    out: dict[str, float] = {}
    states = [e for e in _events(run_dir / "events.jsonl") if e.get("type") == "StateChanged"]
    marks = (
        ("model", ("completed",), "model_built"),
        ("inference", ("starting", "running"), "inference_spawned"),
        ("inference", ("ready",), "inference_ready"),
        ("trainer", ("starting", "running"), "trainer_spawned"),
        ("trainer", ("ready",), "trainer_ready"),
    )
    for process, new, key in marks:
        hit = next((e for e in states if e["process"] == process and e["new"] in new), None)
        if hit is not None:
            out[key] = round(float(hit["t"]) - began, 2)
    steps = [
        float(r["t"])
        for r in _events(run_dir / "metrics.jsonl")
        if r.get("type") == "metrics" and r.get("step") and "step_time" in r.get("data", {})
    ]
    if steps:
        out["first_step"] = round(min(steps) - began, 2)
    out |= vllm_phases(_read(run_dir / "logs" / "inference.log"))
    return out


def trl_startup(record: dict[str, Any], log: str, began: float) -> dict[str, float]:
    """TRL's start-up: its imports and ``GRPOTrainer`` construction (``trl_workload.py``'s
    record), the first step's end from ``began``, and vLLM's phases from its console."""
    out: dict[str, float] = {}
    for key in ("import_s", "init_s"):
        if isinstance(record.get(key), int | float):
            out[key] = round(float(record[key]), 2)
    if record.get("first_step_end"):
        out["first_step"] = round(float(record["first_step_end"]) - began, 2)
    phases = vllm_phases(log)
    phases.pop("vllm_import_s", None)  # our launcher's line: not in TRL's log
    return out | phases


def table(rows: list[tuple[str, dict[str, float]]]) -> list[str]:
    """The start-up table: one row per run (label, breakdown); columns no run has are left
    out."""
    used = [(head, key) for head, key in COLUMNS if any(key in b for _, b in rows)]
    if not rows or not used:
        return []
    lines = [
        "| run | " + " | ".join(head for head, _ in used) + " |",
        "|---|" + "---|" * len(used),
    ]
    for label, breakdown in rows:
        cells = [f"{breakdown[key]:.1f}" if key in breakdown else "-" for _, key in used]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines
