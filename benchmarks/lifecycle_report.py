"""The tables of ``lifecycle_gpu.py``: before vs after, start-up by phase, restarts, switches."""

from __future__ import annotations

import argparse
import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lifecycle_gpu import Cell

MODES = ("shared_vllm", "colocate", "lora_only", "none", "lora_restart")


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def spread(values: list[float]) -> str:
    """``first / median (n)`` of a list of seconds, or -."""
    if not values:
        return "-"
    return f"{values[0]:.1f} / {statistics.median(values):.1f} ({len(values)})"


def first_step(cell: Cell) -> float | None:
    return cell.run.step_times[0] if cell.run.step_times else None


def best(cells: list[Cell], arm: str, mode: str, cache: str | None = None) -> Cell | None:
    """The cell of ``arm`` running ``mode`` (not a switch cell), of ``cache`` if given."""
    for cell in cells:
        same = cell.arm == arm and cell.mode == mode and not cell.hops
        if same and (cache is None or cell.cache == cache):
            return cell
    return None


def summary(cells: list[Cell], target: float) -> list[str]:
    """Before vs after: per mode the seconds to the first step and to the target; one
    ``lora_restart`` restart; the switches."""
    lines = [
        "| what | before | after | after, CUDA graphs | goal |",
        "|---|---|---|---|---|",
    ]
    for cache, label, goal in (("cold", "first run after install", 60), ("warm", "warm cache", 30)):
        row = [best(cells, arm, "shared_vllm", cache) for arm in ("before", "after", "graphs")]
        lines.append(
            f"| command -> first step, shared_vllm, {label} | "
            + " | ".join(seconds(first_step(c)) if c else "-" for c in row)
            + f" | <= {goal} |"
        )
    for mode in MODES[:4]:
        row = [best(cells, arm, mode) for arm in ("before", "after", "graphs")]
        goal = 60 if mode == "none" else 45
        lines.append(
            f"| command -> 5-step reward {target}, {mode} | "
            + " | ".join(seconds(c.run.target_s) if c else "-" for c in row)
            + f" | <= {goal} |"
        )
    row = [best(cells, arm, "lora_restart") for arm in ("before", "after", "graphs")]
    lines.append(
        "| lora_restart, one restart (trainer's sync_time, each in order) | "
        + " | ".join(
            " / ".join(f"{s:.1f}" for s in c.run.sync_times) if c and c.run.sync_times else "-"
            for c in row
        )
        + " | <= 20 |"
    )
    hops = {arm: [s["seconds"] for c in cells if c.arm == arm and c.hops for s in c.switches
                  if "seconds" in s] for arm in ("before", "after", "graphs")}  # fmt: skip
    lines.append(
        "| mode switch, median (max) s | "
        + " | ".join(
            f"{statistics.median(v):.1f} ({max(v):.1f})" if v else "-" for v in hops.values()
        )
        + " | <= 5 |"
    )
    return lines


def startup(cells: list[Cell]) -> list[str]:
    """Per cell: where its first start went (the supervisor's and vLLM's view)."""
    lines = [
        "| cell | cache | GPU | inference spawned | vLLM import s | weights s | Dynamo s | "
        "Inductor s | graph capture s | engine init s | inference ready | trainer ready | "
        "first step | to target (step) | status |",
        "|" + "---|" * 15,
    ]
    for c in cells:
        if c.status.startswith("skipped") or c.status == "not run":
            lines.append(f"| {c.name} | | | | | | | | | | | | | | {c.status} |")
            continue
        p = c.phases
        target = f"{seconds(c.run.target_s)} ({c.run.target_step or '-'})"
        status = (c.status + (f": {c.reason[:160]}" if c.reason else "")).replace("|", "/")
        lines.append(
            f"| {c.name} | {c.cache} | {'+'.join(map(str, c.gpus))} | "
            f"{seconds(c.ready.get('inference started'))} | {seconds(c.import_s)} | "
            f"{seconds(p.get('weights_s'))} | {seconds(p.get('dynamo_s'))} | "
            f"{seconds(p.get('inductor_compile_s') or p.get('compile_cache_load_s'))} | "
            f"{seconds(p.get('graph_capture_s'))} | {seconds(p.get('engine_init_s'))} | "
            f"{seconds(c.ready.get('inference ready'))} | "
            f"{seconds(c.ready.get('trainer ready'))} | {seconds(first_step(c))} | "
            f"{target} | {status} |"
        )
    return lines


def restarts(cells: list[Cell]) -> list[str]:
    lines = [
        "| cell | trainer's sync_time, first / median (n) | inference stop -> ready, first / "
        "median (n) |",
        "|---|---|---|",
    ]
    for c in cells:
        if c.restarts or (c.mode in ("none", "lora_restart") and c.run.sync_times):
            lines.append(f"| {c.name} | {spread(c.run.sync_times)} | {spread(c.restarts)} |")
    return lines


def switches(cells: list[Cell]) -> list[str]:
    lines = [
        "| cell | switch | at step | seconds | steps 1..N each once |",
        "|---|---|---|---|---|",
    ]
    for c in cells:
        for s in c.switches:
            took = seconds(s.get("seconds")) if "seconds" in s else f"error: {s.get('error')}"
            kept = {True: "yes", False: "NO", None: "-"}[c.steps_continuous]
            lines.append(
                f"| {c.name} | {s['from']} -> {s['to']} | {s['at_step']} | {took} | {kept} |"
            )
    return lines


def markdown(cells: list[Cell], info: dict[str, str], args: argparse.Namespace) -> str:
    """The whole results file."""
    where = "the built-in server on CPU (a check of the plumbing, no GPU figures)" if (
        args.cpu) else "profiles/quickstart-gpu.toml through `grpo-tui run`"  # fmt: skip
    lines = [
        "# Issue 26: start-up, modes to a reward, switches and restarts, before and after "
        "(benchmarks/lifecycle_gpu.py)",
        "",
        f"- {info.get('date')}; {info.get('device')}, driver {info.get('driver', '-')}, "
        f"{info.get('cpus')} CPUs; torch {info.get('torch')}, vLLM {info.get('vllm')}, "
        f"transformers {info.get('transformers')}, Python {info.get('python')}",
        f"- {where}; target: the 5-step mean reward >= {args.target}; seconds from the "
        "command; `before` = today's start by settings (CLI as given, spawn, a vLLM cache "
        "of its own, trainer after inference's health, CUDA graphs"
        + (f", plus {', '.join(args.before_set)}" if args.before_set else "")
        + "), `after` = the shipped profile, `graphs` = `after` with CUDA graphs",
        "- cache `cold`: the arm's first start in this call (first run after install); "
        "`warm`: a later one",
        "",
        "## Before and after",
        "",
        *summary(cells, args.target),
        "",
        "## Start-up by cell (first start of inference)",
        "",
        *startup(cells),
        "",
        "## Restarts",
        "",
        *restarts(cells),
        "",
        "## Mode switches (control socket `switch_mode`)",
        "",
        *switches(cells),
    ]
    return "\n".join(lines) + "\n"
