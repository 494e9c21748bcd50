"""The quickstart through the real stack next to the same GRPO recipe in one process.

In one run, side by side (markdown tables on stdout):

1. **Built-in server throughput**: 16 concurrent ``/v1/completions`` requests of n=8 (the
   toy task's prompts and ``max_tokens``), sequences per second, per code tree.
2. **Stack vs floor**: ``grpo-tui run`` on a copy of ``profiles/quickstart.toml`` (free
   ports, a temporary run directory) per weight-sync mode, next to
   ``benchmarks/toy_learnability.py``'s in-process GRPO on the same model, batch and
   recipe (full fine-tuning and LoRA): median step time, command -> first step, command
   -> 5-step mean reward 0.8 (in-process: first step -> 0.8).
3. **Per-stage breakdown** of a step from the runs' own metrics: the trainer's wait for
   data, its compute (``step_time``) and the rest of its loop (fetch/parse, ack, sync,
   report); per request in the environment, the wait for queue room, the completions request
   and the post (``env/latency/*``); the CPU a steady step costs in each role's processes
   (psutil, read at trainer steps ``SKIP`` and ``steps - 1``) against the floor's one process,
   and the groups generated per step.
4. **Start-up**: when each process reached its milestone (API ready, model built,
   inference ready, trainer ready, env ready, first step), from the runs' ``events.jsonl``;
   once with the tiny model's build cache empty (a short extra run per tree), then the
   medians of the runs of section 2 (cache filled).

``--before DIR`` runs the same measurements on another checkout (e.g. ``git archive`` of
an older commit unpacked outside the repository), each code tree through its own
``PYTHONPATH`` and working directory (``python -m`` puts the working directory first on
``sys.path``) and its own quickstart profile; ``--before-python`` runs it with another
interpreter, e.g. one without the packages a newer tree added (``uvicorn[standard]``), as
it was installed. The machine is shared: runs interleave
(floor, ours, before) and the load average is printed with each (at the start, and the
range sampled while a stack run ran); compare within one run, and quote numbers with it.

    python benchmarks/pipeline.py --before /tmp/base --modes shared_vllm lora_only
    python benchmarks/pipeline.py --repeats 3 --steps 120
    python benchmarks/pipeline.py --before /tmp/base --startup-only 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import tomli_w
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_learnability import Setting, run

from grpo_trainer.models import build_tiny_model

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.8
LAST = 5
SKIP = 3
"""Steps left out of step-time medians (the first ones include warm-up of every part)."""
Tree = tuple[str, Path, str]
"""A code tree to measure: its label, its directory and the interpreter that runs it."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


def spread(samples: list[float]) -> str:
    """The range of 1-minute load averages sampled during a run ("-" when none)."""
    if not samples:
        return "-"
    low, high = min(samples), max(samples)
    return f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f}-{high:.1f}"


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# ---- 1. built-in server throughput ------------------------------------------------------


def server_throughput(tree: Path, python: str, model: Path, rounds: int) -> tuple[float, float]:
    """Median sequences/s and round latency of 16 concurrent n=8 requests."""
    port = free_port()
    argv = [python, "-m", "grpo_trainer.serve", str(model), "--port", str(port),
            "--served-model-name", "policy"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree,
                                start_new_session=True)  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"server did not start: {log.read()[-2000:]!r}")
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            times = asyncio.run(_rounds(url, rounds + 1))[1:]  # the first warms up
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    round_time = statistics.median(times)
    return 16 * 8 / round_time, round_time


async def _rounds(url: str, rounds: int) -> list[float]:
    rng = random.Random(0)
    times = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for _ in range(rounds):
            bodies = [
                {"model": "policy", "prompt": f"repeat {rng.choice('0123456789')}:", "n": 8,
                 "max_tokens": 6, "temperature": 1.0, "logprobs": 0, "return_token_ids": True}
                for _ in range(16)
            ]  # fmt: skip
            start = time.perf_counter()
            answers = await asyncio.gather(
                *(client.post("/v1/completions", json=b) for b in bodies)
            )
            times.append(time.perf_counter() - start)
            assert all(a.status_code == 200 for a in answers), answers[0].text
    return times


# ---- 2. the stack -------------------------------------------------------------------------


@dataclass
class StackRun:
    tree: str
    mode: str
    load: str
    """1/5/15-minute load averages when the run started."""
    load_during: str = "-"
    """Range of the 1-minute load average sampled while it ran (the run's own share in it)."""
    first_step: float | None = None
    to_target: float | None = None
    step: float | None = None
    breakdown: dict[str, float | None] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds a steady step costs in each role's processes."""
    generated: float | None = None
    """Groups the environments generated per steady step (sent and dropped)."""
    startup: dict[str, float | None] = field(default_factory=dict)
    steps: int = 0
    exit_code: int | None = None


MILESTONES = {
    "api ready": ("api", "ready"),
    "model built": ("model", "completed"),
    "inference ready": ("inference", "ready"),
    "trainer ready": ("trainer", "ready"),
    "env ready": ("env", "ready"),
}


def startup_times(run_dir: Path, started: float) -> dict[str, float | None]:
    """Seconds after the command at which each process first reached its milestone."""
    seen: dict[str, float | None] = dict.fromkeys(MILESTONES)
    for line in (run_dir / "events.jsonl").open():
        event = json.loads(line)
        if event.get("type") != "StateChanged":
            continue
        for name, (process, state) in MILESTONES.items():
            if seen[name] is None and (event["process"], event["new"]) == (process, state):
                seen[name] = event["t"] - started
    return seen


ROLES = {
    "api": "grpo_trainer.api",
    "inference": "grpo_trainer.serve",
    "trainer": "grpo_trainer.train",
    "env": "grpo_trainer.envs",
    "supervisor": "grpo_tui",
}
"""Each process's role by the module its command line runs (checked in this order)."""
GENERATED = ("groups_sent", "groups_dropped_equal_scores", "groups_dropped_too_long")


def cpu_by_role(root: psutil.Process) -> dict[str, float]:
    """CPU seconds (user + system, every thread) so far of ``root`` and its descendants,
    summed by role: what a step costs in each process, whatever the machine's load."""
    totals = dict.fromkeys(ROLES, 0.0)
    for proc in [root, *root.children(recursive=True)]:
        try:
            command, times = " ".join(proc.cmdline()), proc.cpu_times()
        except psutil.Error:
            continue
        role = next((r for r, module in ROLES.items() if f"-m {module}" in command), None)
        if role is not None:
            totals[role] += times.user + times.system
    return totals


class RunTail:
    """The records a run appends to its ``metrics.jsonl``, read as they come."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.offset = 0
        self.pending = b""

    def poll(self) -> list[dict]:
        files = list(self.out.glob("*/metrics.jsonl"))
        if not files:
            return []
        with files[0].open("rb") as handle:
            handle.seek(self.offset)
            data = self.pending + handle.read()
        self.offset += len(data) - len(self.pending)
        *lines, self.pending = data.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def stack_run(
    tree: Path, python: str, label: str, mode: str, steps: int, work: Path, cache: Path
) -> StackRun:
    """``grpo-tui run`` of ``tree``'s quickstart in ``mode``; times read from the run dir,
    CPU per process read (psutil) at trainer step ``SKIP`` and at the step before the last.
    ``cache`` is the tiny model's build cache (``GRPO_TUI_CACHE``; older trees have none)."""
    profile = tomllib.loads((tree / "profiles" / "quickstart.toml").read_text())
    out = work / f"{label}-{mode}-{time.monotonic_ns()}"
    profile["run"].update(mode=mode, output_dir=str(out))
    profile["api"]["port"] = free_port()
    profile["inference"]["port"] = free_port()
    profile["trainer"]["training_steps"] = steps
    path = out.with_suffix(".toml")
    out.mkdir(parents=True)
    path.write_text(tomli_w.dumps(profile))
    env = {**os.environ, "PYTHONPATH": str(tree), "GRPO_TUI_CACHE": str(cache)}
    result = StackRun(label, mode, load())
    started = time.time()
    with (out.parent / f"{out.name}.log").open("wb") as log:
        proc = subprocess.Popen([python, "-m", "grpo_tui", "run", str(path)], env=env, cwd=tree,
                                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        root, tail = psutil.Process(proc.pid), RunTail(out)
        marks: dict[int, tuple[dict[str, float], dict[str, float]]] = {}
        counters: dict[str, float] = {}
        loads: list[float] = []
        try:
            while proc.poll() is None:
                loads.append(os.getloadavg()[0])
                if time.time() - started > 1800:
                    raise TimeoutError(f"{label} {mode}: no end after 30 min ({out})")
                for record in tail.poll():
                    if record["process"] == "env":
                        counters.update(record["data"])
                    step = record.get("step")
                    is_step = record["process"] == "trainer" and "step_time" in record["data"]
                    if is_step and step in (SKIP, steps - 1) and step not in marks:
                        marks[step] = (cpu_by_role(root), dict(counters))
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.terminate()  # grpo-tui stops what it started
            proc.wait(timeout=120)
    result.exit_code = proc.returncode
    result.load_during = spread(loads)
    run_dir = next(p for p in out.iterdir() if p.is_dir())
    result.startup = startup_times(run_dir, started)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    trainer = [r for r in records if r["process"] == "trainer" and "step_time" in r["data"]]
    envs = [r["data"] for r in records if r["process"] == "env"]
    result.steps = len(trainer)
    if not trainer:
        return result
    times = [r["t"] for r in trainer]
    rewards = [r["data"]["reward/mean"] for r in trainer]
    result.first_step = times[0] - started
    result.startup["first step"] = result.first_step
    for i in range(LAST - 1, len(rewards)):
        if sum(rewards[i - LAST + 1 : i + 1]) / LAST >= TARGET:
            result.to_target = times[i] - started
            break
    steady = trainer[SKIP:]
    gaps = [b - a for a, b in zip(times[SKIP:], times[SKIP + 1 :], strict=False)]
    result.step = median(gaps)
    wait = median([r["data"]["data_wait_time"] for r in steady])
    compute = median([r["data"]["step_time"] for r in steady])
    result.breakdown = {
        "data wait": wait,
        "trainer compute": compute,
        "trainer rest": None
        if None in (result.step, wait, compute)
        else result.step - wait - compute,  # type: ignore[operator]
        "sync": median([r["data"].get("sync_time", 0.0) for r in steady]),
    }
    for stage in ("room", "inference", "post"):
        values = [d[f"env/latency/{stage}_s"] for d in envs if f"env/latency/{stage}_s" in d]
        result.breakdown[f"env {stage} (per request)"] = median(values)
    if SKIP in marks and steps - 1 in marks:
        (cpu0, env0), (cpu1, env1) = marks[SKIP], marks[steps - 1]
        between = steps - 1 - SKIP
        for role in ROLES:
            result.cpu[role] = (cpu1[role] - cpu0[role]) / between
        made = sum(env1.get(f"env/{k}", 0.0) - env0.get(f"env/{k}", 0.0) for k in GENERATED)
        result.generated = made / between
    return result


# ---- 3. the in-process floor --------------------------------------------------------------


@dataclass
class FloorRun:
    """The in-process recipe: median step seconds, CPU seconds per step, seconds from its
    first step to the target, and the load when it started."""

    step: float
    cpu: float
    to_target: float | None
    load: str
    load_after: float


def floor(lora: bool, steps: int, seed: int) -> FloorRun:
    """One run of the in-process GRPO recipe (generation and training in one process)."""
    setting = Setting(
        lr=1e-3, group_size=8, prompts=16, temperature=1.0, init=0.02, hidden=64,
        final_norm=6.0, beta=0.04, warmup=10, seed=seed, lora=lora,
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), lora_r=16, lora_alpha=128,
        rslora=False,
    )  # fmt: skip
    before = load()
    outcome = run(setting, steps=steps, target=TARGET, stop=False, verbose=False)
    return FloorRun(
        statistics.median(outcome.step_seconds[SKIP:]),
        statistics.mean(outcome.step_cpu[SKIP:]),
        outcome.seconds_to_target,
        before,
        os.getloadavg()[0],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, default=None, help="an older checkout to compare")
    parser.add_argument(
        "--before-python",
        default=sys.executable,
        help="the interpreter of the --before tree (default: this one)",
    )
    parser.add_argument("--modes", nargs="+", default=["shared_vllm", "lora_only"])
    parser.add_argument("--steps", type=int, default=100, help="training steps per stack run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode and tree (medians)")
    parser.add_argument("--server-rounds", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of the floor (1, as in the stack)"
    )
    parser.add_argument(
        "--server-only",
        type=int,
        default=0,
        metavar="N",
        help="only the built-in server's throughput: N measurements per tree, alternated",
    )
    parser.add_argument(
        "--startup-only",
        type=int,
        default=0,
        metavar="N",
        help="only the start-up table: N short runs per tree (interleaved) after the cold one",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    trees = [("ours", REPO, sys.executable)]
    if args.before:
        trees.append(("before", args.before.resolve(), args.before_python))
    print(f"# pipeline benchmark  cpus={os.cpu_count()}  load at start {load()}\n", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.startup_only:
            _startup_only(args, trees, work)
            return
        model = build_tiny_model(work / "model", seed=0)
        if args.server_only:
            _server_only(args, trees, model)
            return
        print("## Built-in server: 16 concurrent requests of n=8 (max_tokens 6)\n")
        print("| code | sequences/s | round ms | load |")
        print("|---|---|---|---|")
        served: dict[str, float] = {}
        for label, tree, python in trees:
            before = load()
            rate, round_time = server_throughput(tree, python, model, args.server_rounds)
            served[label] = rate
            print(f"| {label} | {rate:.0f} | {round_time * 1000:.0f} | {before} |", flush=True)
        if "before" in served:
            print(f"\nthroughput ours / before: {served['ours'] / served['before']:.1f}x\n")
        # Start-up with the tiny model's build cache empty (the first run after an install
        # or a change to the builder); every later run of the same tree finds it filled.
        colds = [
            stack_run(tree, python, label, args.modes[0], SKIP + 2, work, work / f"cache-{label}")
            for label, tree, python in trees
        ]
        floors: dict[bool, list[FloorRun]] = {False: [], True: []}
        runs: list[StackRun] = []
        for repeat in range(args.repeats):
            for mode in args.modes:
                lora = mode.startswith("lora")
                floors[lora].append(floor(lora, args.steps, seed=repeat))
                for label, tree, python in trees:
                    cache = work / f"cache-{label}"
                    runs.append(stack_run(tree, python, label, mode, args.steps, work, cache))
                    r = runs[-1]
                    cpu = sum(r.cpu.values()) if r.cpu else None
                    print(f"<!-- {label} {mode}: exit {r.exit_code}, {r.steps} steps, "
                          f"step {ms(r.step)} ms, CPU {ms(cpu)} ms/step, first "
                          f"{secs(r.first_step)} s, 0.8 {secs(r.to_target)} s, "
                          f"load {r.load}, during {r.load_during} -->", flush=True)  # fmt: skip
        _report(args, trees, floors, runs)
        _report_startup(trees, colds, runs)


def _server_only(args: argparse.Namespace, trees: list[Tree], model: Path) -> None:
    """``--server-only`` measurements per tree, alternated (ABBA...), then the medians."""
    print("## Built-in server: 16 concurrent requests of n=8 (max_tokens 6), alternated\n")
    print("| run | code | sequences/s | round ms | load |")
    print("|---|---|---|---|---|")
    rates: dict[str, list[float]] = {label: [] for label, _, _ in trees}
    for turn in range(args.server_only):
        order = trees if turn % 2 == 0 else trees[::-1]
        for label, tree, python in order:
            before = load()
            rate, round_time = server_throughput(tree, python, model, args.server_rounds)
            rates[label].append(rate)
            print(f"| {turn} | {label} | {rate:.0f} | {round_time * 1000:.0f} | {before} |",
                  flush=True)  # fmt: skip
    medians = {label: statistics.median(values) for label, values in rates.items()}
    print("\nmedian sequences/s: " + ", ".join(f"{k} {v:.0f}" for k, v in medians.items()))
    if "before" in medians:
        print(f"throughput ours / before: {medians['ours'] / medians['before']:.2f}x")


def _startup_only(args: argparse.Namespace, trees: list[Tree], work: Path) -> None:
    """The cold run per tree, then ``--startup-only`` short runs per tree, interleaved."""
    mode = args.modes[0]
    colds = [
        stack_run(tree, python, label, mode, SKIP + 2, work, work / f"cache-{label}")
        for label, tree, python in trees
    ]
    runs = []
    for _ in range(args.startup_only):
        for label, tree, python in trees:
            run_ = stack_run(tree, python, label, mode, SKIP + 2, work, work / f"cache-{label}")
            runs.append(run_)
            print(f"<!-- {label}: first step {secs(run_.first_step)} s, load {run_.load} -->")
    _report_startup(trees, colds, runs)


def _report_startup(trees: list[Tree], colds: list[StackRun], runs: list[StackRun]) -> None:
    print(
        "\n## Start-up: seconds after the command (the tiny model's build cache empty, then "
        "the medians of the runs above)\n"
    )
    names = [*MILESTONES, "first step"]
    print("| code | model cache | " + " | ".join(names) + " | loads |")
    print("|---" * (len(names) + 3) + "|")
    for (label, tree, _), cold in zip(trees, colds, strict=True):
        cached = (tree / "grpo_trainer" / "tiny_model.py").exists()
        warm = [r for r in runs if r.tree == label]
        rows = [("empty", [cold]), ("filled", warm)] if cached else [("none", [cold, *warm])]
        for cache, mine in rows:
            cells = [
                secs(median([t for r in mine if (t := r.startup.get(n)) is not None]))
                for n in names
            ]
            loads = ", ".join(r.load for r in mine)
            print(f"| {label} | {cache} | " + " | ".join(cells) + f" | {loads} |")


def _report(
    args: argparse.Namespace,
    trees: list[Tree],
    floors: dict[bool, list[FloorRun]],
    runs: list[StackRun],
) -> None:
    print("\n## Stack vs in-process floor (medians over repeats)\n")
    print("| mode | code | step ms | floor step ms | ratio | command -> first step s | "
          "command -> 0.8 s | floor first step -> 0.8 s | load: stack runs | "
          "load: floor runs |")  # fmt: skip
    print("|---" * 10 + "|")
    for mode in args.modes:
        lora = mode.startswith("lora")
        floor_step = median([f.step for f in floors[lora]])
        floor_hit = median([f.to_target for f in floors[lora] if f.to_target is not None])
        for label, _, _ in trees:
            mine = [r for r in runs if r.mode == mode and r.tree == label]
            step = median([r.step for r in mine if r.step is not None])
            ratio = "-" if None in (step, floor_step) else f"{step / floor_step:.1f}x"  # type: ignore[operator]
            hits = [r.to_target for r in mine]
            hit = median([h for h in hits if h is not None])
            missed = sum(h is None for h in hits)
            hit_text = secs(hit) + (f" ({missed} of {len(hits)} missed)" if missed else "")
            first = secs(median([r.first_step for r in mine if r.first_step is not None]))
            loads = ", ".join(f"{r.load.split('/')[0]} ({r.load_during})" for r in mine)
            floor_loads = ", ".join(
                f"{f.load.split('/')[0]} -> {f.load_after:.1f}" for f in floors[lora]
            )
            print(f"| {mode} | {label} | {ms(step)} | {ms(floor_step)} | {ratio} | {first} | "
                  f"{hit_text} | {secs(floor_hit)} | {loads} | {floor_loads} |")  # fmt: skip
    print(
        "\nLoads: the 1-minute load average at each run's start (stack runs: the range "
        "sampled while it ran; floor runs: at its end). The benchmark itself adds about 2."
    )
    print(
        "\n## CPU per step (psutil, every process of the run; the floor: its one process), "
        "medians over repeats\n\nWhat a step costs whatever the load: on 2 idle cores the "
        "stack's step cannot be shorter than half its CPU.\n"
    )
    print("| mode | code | stack CPU ms | floor CPU ms | CPU ratio | groups generated per step "
          "| " + " | ".join(f"{role} ms" for role in ROLES) + " |")  # fmt: skip
    print("|---" * (6 + len(ROLES)) + "|")
    for mode in args.modes:
        floor_cpu = median([f.cpu for f in floors[mode.startswith("lora")]])
        for label, _, _ in trees:
            mine = [r for r in runs if r.mode == mode and r.tree == label and r.cpu]
            total = median([sum(r.cpu.values()) for r in mine])
            ratio = "-" if None in (total, floor_cpu) else f"{total / floor_cpu:.1f}x"  # type: ignore[operator]
            made = median([r.generated for r in mine if r.generated is not None])
            made_text = "-" if made is None else f"{made:.1f}"
            roles = [ms(median([r.cpu[role] for r in mine])) for role in ROLES]
            print(f"| {mode} | {label} | {ms(total)} | {ms(floor_cpu)} | {ratio} | {made_text} | "
                  + " | ".join(roles) + " |")  # fmt: skip
    print(
        "\n## Per-stage breakdown of a step, ms (medians over steps after the first "
        f"{SKIP}, then over repeats)\n"
    )
    stages = list(runs[0].breakdown) if runs else []
    for run_ in runs:
        stages += [s for s in run_.breakdown if s not in stages]
    header = [f"{mode} {label}" for mode in args.modes for label, _, _ in trees]
    print("| stage | " + " | ".join(header) + " |")
    print("|---" * (len(header) + 1) + "|")
    for stage in stages:
        cells = []
        for mode in args.modes:
            for label, _, _ in trees:
                values = [
                    r.breakdown.get(stage) for r in runs if r.mode == mode and r.tree == label
                ]
                cells.append(ms(median([v for v in values if v is not None])))
        print(f"| {stage} | " + " | ".join(cells) + " |")
    print(f"\nload at end {load()}")


if __name__ == "__main__":
    main()
