"""The GPU workload's results: one row per system, one per run, and the goals judged.

``gpu_workload.py`` measures; this module turns its runs (``Part``, one per system and
repeat) into the markdown of ``benchmarks/results/gpu_workload.md``. A system's step time is
the median over its runs of each run's median step; its range is the lowest and highest
run. A ratio between two systems is taken per pair of runs on the same GPUs and repeat (so
GPU-to-GPU differences cancel), and a goal is met only when every pair clears it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpu_idle import EmptyCheck, correlation, per_step
from workload_startup import table as startup_table

PARTS = (
    "floor", "sync", "trl-best", "trl", "overlap", "lora", "colocate",
    "split", "trl-async", "colocate2",
)  # fmt: skip
"""Every part, in the order of the tables (and the order a lane runs them unless told)."""
TWO_GPU_PARTS = ("split", "trl-async", "colocate2")
"""Parts that take both GPUs of a two-GPU lane (``--device cuda:A+B``)."""


@dataclass
class Part:
    """One run of one system: its step times and what it used, or why it has none."""

    part: str
    system: str
    status: str = "not run: out of time"
    reason: str = ""
    step_times: list[float] = field(default_factory=list)
    startup_s: float | None = None
    """From the command's start to the end of the first optimizer step (every system)."""
    gpu_peak_mib: float | None = None
    gpu: int | None = None
    """The lane's first GPU (a size's runs may be spread over GPUs of one host, one call)."""
    gpus: list[int] = field(default_factory=list)
    """Every GPU it used, when more than one (``split``, ``trl-async``, ``colocate2``)."""
    repeat: int = 0
    """Which pass over the lane's parts (A B, then B A with ``--order swap``)."""
    position: int = 0
    """Its place in that pass: 0 ran first."""
    call: str = ""
    """The device call that ran it: runs pair only within one call (issue 39)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def step(self) -> float | None:
        """Median step time of this run, warm-up excluded."""
        return statistics.median(self.step_times) if self.step_times else None

    @property
    def devices(self) -> int:
        """GPUs the part takes (on CPU: rank slots): tokens/s per GPU divide by it."""
        return 2 if self.part in TWO_GPU_PARTS else 1

    @property
    def where(self) -> tuple[int | None, ...]:
        """The lane it ran on: its GPUs (the pairing key with ``call`` and ``repeat``)."""
        return tuple(self.gpus) if self.gpus else (self.gpu,)

    @property
    def empty_before(self) -> str:
        """The empty-GPU check before it: ``empty``, ``not empty``, ``no NVML`` (not
        checked), or ``-`` for runs measured before the check existed."""
        return str(self.extra.get("gpu_before", {}).get("status", "-"))


GOALS: list[tuple[str, str, str, float | None, str]] = [
    ("trl-best", "sync", ">=", 1.15,
     "equal policy lag, one GPU: TRL colocate at its best (IS correction off) step / ours "
     "synchronous step"),
    ("trl", "sync", ">=", 1.15,
     "equal policy lag, one GPU: TRL colocate at its defaults step / ours synchronous step"),
    ("trl-best", "overlap", ">=", None,
     "ours with 1-step off-policy overlap vs TRL colocate on-policy (not equal lag: reference "
     "only)"),
    ("trl-async", "split", ">=", 1.3,
     "async on two GPUs, staleness 1: TRL AsyncGRPOTrainer step / ours split step"),
    ("split", "colocate2", ">=", 1.3,
     "colocate on both GPUs vs the split layout (issue 13): split step / colocate2 step"),
]  # fmt: skip
"""(numerator part, denominator part, direction, goal, what it says): ratios of step times,
which are ratios of tokens/s the other way round (every system does the same tokens)."""
FLOOR_GOALS = [("sync", "sum_s", 0.9), ("overlap", "max_s", 1.15)]
"""Our step against the floor of the same GPU: at most this many times its sum / max."""


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def tokens_per_s(args: argparse.Namespace, seconds: float | None) -> float | None:
    """Completion tokens per step over the step time."""
    if not seconds:
        return None
    return args.prompts * args.group_size * args.completion_len / seconds


def pairs(runs: list[Part], top: str, bottom: str) -> list[tuple[Part, Part]]:
    """Every run ``a`` of ``top`` with a run ``b`` of ``bottom`` of the same call, on the
    same GPUs and in the same pass (a floor, measured once per lane, pairs with every pass).
    A run that found its GPU not empty pairs with nothing."""
    out = []
    for a in runs:
        if a.part != top or a.step is None or a.empty_before == "not empty":
            continue
        for b in runs:
            same = b.call == a.call and b.where == a.where
            same = same and (b.repeat == a.repeat or b.part == "floor")
            if b.part == bottom and same and b.empty_before != "not empty":
                out.append((a, b))
    return out


def paired(
    runs: list[Part], top: str, bottom: str, value: Callable[[Part, Part], float | None]
) -> list[float]:
    """``value(a, b)`` over :func:`pairs` (None values left out)."""
    return [v for a, b in pairs(runs, top, bottom) if (v := value(a, b)) is not None]


def orders(runs: list[Part], top: str, bottom: str) -> str:
    """How the counted pairs ran: ``2 with sync first, 1 with trl-best first``."""
    first = {bottom: 0, top: 0}
    for a, b in pairs(runs, top, bottom):
        if a.step and b.step and a.position != b.position:
            first[top if a.position < b.position else bottom] += 1
    return ", ".join(f"{n} with {name} first" for name, n in first.items() if n)


def judge(goal: str, ratios: list[float], limit: float | None, most: bool) -> str:
    """One goal line: median and range over the pairs; met only when the whole range is."""
    if not ratios:
        return f"- {goal}: not measured (no run pair of both on the same GPUs)"
    low, high = min(ratios), max(ratios)
    got = f"{statistics.median(ratios):.2f} (range {low:.2f}-{high:.2f}, {len(ratios)} pairs)"
    if limit is None:
        return f"- {goal}: {got}"
    sign = "<=" if most else ">="
    clears = high <= limit if most else low >= limit
    mark = "met" if clears else "NOT met"
    return f"- {goal}: {got}, goal {sign} {limit} over the whole range -> {mark}"


def verdicts(runs: list[Part]) -> list[str]:
    """The issues' numbers to reach, each from same-GPU pairs of runs."""
    lines = ["Numbers to reach (ratios of step times per same-GPU pair of runs):", ""]
    for part, key, limit in FLOOR_GOALS:
        if not any(p.part == part for p in runs) or not any(p.part == "floor" for p in runs):
            continue
        ratios = paired(
            runs, part, "floor",
            lambda a, b, key=key: a.step / b.extra[key] if b.extra.get(key) else None,
        )  # fmt: skip
        what = "sum" if key == "sum_s" else "max"
        lines.append(judge(f"{part} step / floor {what} (same GPU)", ratios, limit, most=True))
    for top, bottom, _, limit, goal in GOALS:
        if any(p.part in (top, bottom) for p in runs):
            ratios = paired(runs, top, bottom, lambda a, b: a.step / b.step if b.step else None)
            line = judge(goal, ratios, limit, most=False)
            if ratios and (how := orders(runs, top, bottom)):
                line += f" [orders: {how}]"
            lines.append(line)
    return lines


def system_rows(args: argparse.Namespace, runs: list[Part]) -> list[str]:
    """One row per system: median over its runs, the range, where and how it ran."""
    lines = [
        "| part | system | runs (GPU) | counted steps | step s, median of runs | range over "
        "runs | end-to-end completion tok/s | per GPU | GPU peak MiB | start-up s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in PARTS:
        mine = [p for p in runs if p.part == name]
        if not mine:
            continue
        done = [p.step for p in mine if p.step is not None]
        step = statistics.median(done) if done else None
        rate = tokens_per_s(args, step)
        per_gpu = None if rate is None else rate / mine[0].devices
        where = ", ".join("+".join(map(str, p.where)) if p.where != (None,) else "-" for p in mine)
        peaks = [p.gpu_peak_mib for p in mine if p.gpu_peak_mib is not None]
        starts = [p.startup_s for p in mine if p.startup_s is not None]
        span = f"{min(done):.2f}-{max(done):.2f}" if done else "n/a"
        if name == "floor":
            step = statistics.median(p.extra["sum_s"] for p in mine if "sum_s" in p.extra) \
                if any("sum_s" in p.extra for p in mine) else None  # fmt: skip
            span = ", ".join(f"sum {_s(p.extra.get('sum_s'))} / max {_s(p.extra.get('max_s'))}"
                             for p in mine)  # fmt: skip
            rate = per_gpu = tokens_per_s(args, step)
        lines.append(
            f"| {name} | {mine[0].system} | {len(mine)} ({where}) | "
            f"{sum(len(p.step_times) for p in mine)} | {_s(step)} | {span} | "
            f"{'n/a' if rate is None else f'{rate:,.0f}'} | "
            f"{'n/a' if per_gpu is None else f'{per_gpu:,.0f}'} | "
            f"{f'{max(peaks):,.0f}' if peaks else 'n/a'} | "
            f"{_s(statistics.median(starts)) if starts else 'n/a'} |"
        )
    return lines


def run_rows(runs: list[Part]) -> list[str]:
    """One row per run (grouped by part, then lane and pass): its call, its place in the
    pass (1 = first), and the GPU as the empty-GPU check found it."""
    lines = [
        "| part | call | pass.place | GPU | GPU before the run | status | counted steps "
        "| step s median | steps (s) | start-up s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in runs:
        status = p.status if not p.reason else f"{p.status}: {p.reason[:300]}"
        status = status.replace("|", "/").replace("\n", " ")
        where = "+".join(map(str, p.where)) if p.where != (None,) else "-"
        steps = " ".join(f"{t:.2f}" for t in p.step_times)
        before = p.extra.get("gpu_before")
        check = EmptyCheck(**before).describe() if before else "-"
        lines.append(
            f"| {p.part} | {p.call or '-'} | {p.repeat}.{p.position + 1} | {where} | "
            f"{check.replace('|', '/')} | {status} | {len(p.step_times)} | {_s(p.step)} "
            f"| {steps} | {_s(p.startup_s)} |"
        )
    return lines


def empty_check_lines(runs: list[Part]) -> list[str]:
    """The empty-GPU check, stated: how many runs found their GPUs empty."""
    checked = [p for p in runs if p.extra.get("gpu_before")]
    if not checked:
        return []
    found = [EmptyCheck(**p.extra["gpu_before"]) for p in checked]
    if all(c.status == "no NVML" for c in found):
        return ["Empty GPU before each run: not checked (no NVML on this machine).", ""]
    empty = [c for c in found if c.empty]
    busy = [(p, c) for p, c in zip(checked, found, strict=True) if c.status == "not empty"]
    limit = max(c.max_used_mib for c in found)
    line = (
        f"Empty GPU before each run (bounded wait for no compute process and at most "
        f"{limit:.0f} MiB used on the run's GPUs; nothing found there is ever killed): "
        f"{len(empty)} of {len(checked)} runs found them empty"
    )
    if empty:
        line += f" (longest wait {max(c.waited_s for c in empty):.1f} s)"
    if busy:
        line += "; not empty, so paired with nothing: " + "; ".join(
            f"{p.part} #{p.repeat} ({c.describe()})" for p, c in busy
        )
    unchecked = sum(c.status == "no NVML" for c in found)
    if unchecked:
        line += f"; {unchecked} not checked (no NVML)"
    return [line + ".", ""]


def startup_lines(runs: list[Part]) -> list[str]:
    """Where each run's start-up went (``workload_startup.py``)."""
    rows = [
        (f"{p.part} #{p.repeat} ({p.call or '-'})", p.extra["startup"])
        for p in runs
        if p.extra.get("startup")
    ]
    lines = startup_table(rows)
    if not lines:
        return []
    return [
        "Start-up, from the command to the end of the first optimizer step (columns "
        "without `s`: seconds from the command; with `s`: durations, vLLM's from its log; "
        "TRL's vLLM runs inside its trainer's construction, `TRL init s`):",
        "",
        *lines,
        "",
    ]


def _range(values: list[float], spec: str = ".1f") -> str:
    if not values:
        return "-"
    return f"{min(values):{spec}} / {statistics.median(values):{spec}} / {max(values):{spec}}"


def variance_lines(runs: list[Part]) -> list[str]:
    """Per run: its steps against the GPU's clocks and power during each step, and, for
    TRL, its generation and garbage-collection time per step (issue 39: TRL's steps ran
    9.9-17.9 s within a run)."""
    lines = []
    for p in runs:
        rows, ends = p.extra.get("gpu_samples"), p.extra.get("step_ends")
        if not p.step_times or not rows or not ends or len(ends) < 2:
            continue
        steps = per_step(rows, [float(t) for t in ends])
        seconds = [s["seconds"] for s in steps if "sm_mhz" in s]
        clocks = [s["sm_mhz"] for s in steps if "sm_mhz" in s]
        power = [s["power_w"] for s in steps if "sm_mhz" in s]
        reasons = sorted({r for s in steps for r in s.get("reasons", [])})
        r_clock, r_power = correlation(seconds, clocks), correlation(seconds, power)
        gen = [float(x) for x in p.extra.get("generate_s_per_step") or []]
        gc_s = [float(x) for x in p.extra.get("gc_s_per_step") or []]
        lines.append(
            f"| {p.part} #{p.repeat} ({p.call or '-'}) | {_range(p.step_times, '.2f')} | "
            f"{_range(clocks, '.0f')} | {_range(power, '.0f')} | {', '.join(reasons) or '-'} "
            f"| {'-' if r_clock is None else f'{r_clock:+.2f}'} | "
            f"{'-' if r_power is None else f'{r_power:+.2f}'} | {_range(gen, '.2f')} | "
            f"{_range(gc_s, '.2f')} |"
        )
    if not lines:
        return []
    return [
        "Step-time variance against the GPU (NVML every 0.5 s during each step; min / "
        "median / max over the run's counted steps; r = correlation with the step time over "
        "the steps; reasons = NVML clock-event reasons seen: power cap, thermal, power "
        "brake; TRL: its vLLM generate calls and Python's garbage collection per step):",
        "",
        "| run | step s | SM clock MHz | power W | clock reasons | r(step, SM clock) | "
        "r(step, power) | TRL generate s | TRL gc s |",
        "|---|---|---|---|---|---|---|---|---|",
        *lines,
        "",
    ]


def markdown(args: argparse.Namespace, runs: list[Part], info: dict[str, str]) -> str:
    """One size's section: settings, systems, runs, floor detail and the goals."""
    engine = "vLLM eager in every system" if args.eager else "vLLM with CUDA graphs everywhere"
    engine = engine if args.backend == "vllm" else "built-in inference server (CPU check)"
    gpus = sorted({g for p in runs for g in p.where if g is not None})
    lines = [
        f"## {args.shape} at random init ({args.params / 1e9:.2f} B parameters), "
        f"{info.get('device', '?')}, "
        + ("CPU" if not gpus else f"GPU {', '.join(map(str, gpus))}"),
        "",
        f"- date {info.get('date')}; torch {info.get('torch')}, transformers "
        f"{info.get('transformers')}, vLLM {info.get('vllm')}, TRL {info.get('trl', '?')}, "
        f"peft {info.get('peft')}, python {info.get('python')}",
        f"- step: {args.prompts} prompts x {args.group_size} = "
        f"{args.prompts * args.group_size} sequences, {args.prompt_len}-token prompts, "
        f"{args.completion_len}-token completions (ignore_eos), {args.dtype}, AdamW lr "
        f"{args.lr:g}, loss grpo, clip {args.clip_eps}, beta 0, micro-batch {args.micro} x "
        f"{args.prompts * args.group_size // args.micro} accumulation, no gradient "
        f"checkpointing; {engine}"
        + (
            f", a {args.kv_cache_gib} GiB KV cache in every system"
            if args.backend == "vllm"
            else ""
        ),
        f"- {args.steps} optimizer steps per run, the first not counted; runs of a lane "
        "alternate between systems"
        + (
            ", each pass in the reverse order of the one before (A B, B A)"
            if getattr(args, "order", "same") == "swap"
            else ""
        )
        + "; a ratio pairs runs of one call, lane and pass only; start-up = from the "
        "command's start to the end of the first optimizer step, for every system",
        f"- calls: {', '.join(sorted({p.call for p in runs if p.call})) or 'not recorded'}",
        "",
        *system_rows(args, runs),
        "",
        *run_rows(runs),
        "",
        *empty_check_lines(runs),
        *startup_lines(runs),
        *variance_lines(runs),
    ]
    for floor in (p for p in runs if p.part == "floor" and p.step_times):
        where = "CPU" if floor.gpu is None else f"GPU {floor.gpu}"
        lines.append(
            f"Floor on {where}: generation alone {_s(floor.extra.get('generate_s'))} s "
            f"(runs {[round(t, 2) for t in floor.extra.get('generate_all_s', [])]}, the first "
            f"not counted), trainer alone {_s(floor.extra.get('train_s'))} s (compute per step "
            f"{[round(t, 2) for t in floor.extra.get('train_compute_s', [])]})."
        )
    lines += ["", *verdicts(runs)]
    return "\n".join(lines) + "\n"


def save(args: argparse.Namespace, runs: list[Part], info: dict[str, str], path: Path) -> str:
    """Write this lane's JSON (every number and the table) to ``path``; returns the table."""
    for run in runs:
        run.gpu = args.gpu if run.gpu is None else run.gpu
    text = markdown(args, runs, info)
    raw = {
        "facts": info,
        "args": {
            k: v if isinstance(v, int | float | str | list | None) else str(v)
            for k, v in vars(args).items()
        },
        "parts": [asdict(p) for p in runs],
        "markdown": text,
    }
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(raw, indent=1, default=str))
    staging.replace(path)  # a kill mid-write leaves the previous whole file
    return text


def combine(paths: list[Path]) -> str:
    """One results file from lane JSON files: one section per size, every lane's runs."""
    sizes: dict[str, tuple[argparse.Namespace, dict[str, str], list[Part]]] = {}
    for path in paths:
        raw = json.loads(path.read_text())
        args = argparse.Namespace(**raw["args"])
        _, info, runs = sizes.setdefault(args.size, (args, raw["facts"], []))
        runs += [Part(**p) for p in raw["parts"]]
    texts = []
    for args, info, runs in sizes.values():
        runs.sort(key=lambda p: (PARTS.index(p.part), p.where, p.repeat))
        texts.append(markdown(args, runs, info))
    head = [
        "# GRPO at a real workload: floor, grpo-tui and TRL (benchmarks/gpu_workload.py)",
        "",
        "Lanes (one GPU, or two for the two-GPU parts) run side by side in one call; each "
        "lane runs its systems one after the other, alternating, on the same GPU. Step time "
        "= wall time between consecutive optimizer steps (generation, data wait, training, "
        "sync), the first step excluded; tokens/s = completion tokens per step / step time.",
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(texts)
