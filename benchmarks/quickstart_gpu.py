"""profiles/quickstart-gpu.toml in every mode, side by side: does it learn, and how fast?

Each mode runs ``grpo-tui run`` on a copy of the profile that differs only in what lets the
modes run at the same time: ``run.mode``, ``run.output_dir``, the two ports, the GPU both
roles use (``--gpus`` are shared out round-robin), and, where no ``vllm`` command is on
PATH (the device, where vLLM sits on PYTHONPATH), ``vllm_executable``. From the run's
``metrics.jsonl`` it reads the mean reward per step and reports the mean of the first 5
steps, the best 5-step mean, and the first step whose 5-step mean reached ``--target``
with the seconds from the command to that step (vLLM start-up included). A run stops once
it reached the target (SIGKILL of its supervisor, then a sweep of its tagged processes),
when its trainer ends, or at the deadline.

``--profile P --as-placed`` runs another profile with its own GPU placement (one mode,
e.g. ``profiles/qwen2.5-7b-4gpu.toml``: 3 trainer ranks and vLLM on the fourth GPU,
issue 29), ``--eager`` with vLLM eager (start-up without torch.compile), and the table
and JSON are rewritten every 5 s while it runs (a cut call keeps the curve so far), with
each trainer rank's and vLLM's peak GPU memory.

``--colocate-ranks N`` runs ``colocate`` on the last N of ``--gpus`` at once: an FSDP2
trainer of N ranks and vLLM with ``data_parallel_size`` N, one rank and one replica per GPU
(issue 13's "rises in colocate on two GPUs"); ``--cpu`` runs the same copies on CPU (the
built-in server, float32; ``colocate`` on N gloo ranks and N built-in replicas), a check of
the plumbing and of the recipe on this machine, no GPU numbers.

    python benchmarks/quickstart_gpu.py --out OUT --gpus 0 1          # the device run
    python benchmarks/quickstart_gpu.py --out OUT --gpus 2 3 --modes colocate --colocate-ranks 2
    python benchmarks/quickstart_gpu.py --out /tmp/q --dry-run         # copies + check
    python benchmarks/quickstart_gpu.py --out /tmp/q --cpu --modes colocate --colocate-ranks 2

Writes ``quickstart_gpu.md`` and ``quickstart_gpu.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import tomli_w
from gpu_modes import _lines, facts, free_ports, run_id_of, sglang_settings, sweep, tail, vllm_cli
from gpu_workload import stop_group

from grpo_trainer.serve.command_lines import SGLANG_REFUSED

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "quickstart-gpu.toml"
MODES = ("shared_vllm", "lora_only", "colocate", "none", "lora_restart")
WINDOW = 5


@dataclass
class ModeRun:
    """One mode's run: rewards per step and when the target was reached."""

    mode: str
    gpus: list[int]
    """The GPUs both roles use (several: ``colocate`` with one rank and replica on each;
    empty on CPU)."""
    status: str = "not run"
    rewards: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    alignment: list[float] = field(default_factory=list)
    """Per step: |trainer - server logprob| of the sampled tokens (off-policy drift in)."""
    alignment_lag0: list[float] = field(default_factory=list)
    """Per step that has them: the same over sequences sampled at the weights being trained
    (the weight sync's error alone; ~5e-3 in bf16)."""
    sync_times: list[float] = field(default_factory=list)
    """The trainer's ``sync_time`` at each sync (restart modes: the restart it waited for)."""
    inference_tok_s: list[float] = field(default_factory=list)
    """The server's generated tokens/s (``inference/tokens_per_s``), sampled while training."""
    peak_gb: dict[str, float] = field(default_factory=dict)
    """Peak GPU memory: ``rank<r>`` (the trainer's torch peak per rank, or ``trainer``) and
    ``inference`` (NVML, vLLM's process tree, as the supervisor samples it)."""
    target_step: int | None = None
    target_s: float | None = None
    wall_s: float = 0.0
    reason: str = ""
    leftovers: list[str] = field(default_factory=list)


def place(modes: list[str], gpus: list[int], colocate_ranks: int = 1) -> list[ModeRun]:
    """Each mode's GPUs: ``colocate`` gets the last ``colocate_ranks`` GPUs to itself (vLLM
    asserts when another process allocates on its GPU while it falls asleep,
    docs/inference.md), the other modes share the rest round-robin, one GPU each; where no
    GPU is left over, ``colocate`` runs after the others."""
    alone = "colocate" in modes and len(gpus) > colocate_ranks
    shared = gpus[:-colocate_ranks] if alone else gpus
    others = [m for m in modes if m != "colocate"]
    runs = [ModeRun(m, [shared[i % len(shared)]]) for i, m in enumerate(others)]
    if "colocate" in modes:
        runs.append(ModeRun("colocate", gpus[-colocate_ranks:]))
    return runs


def profile_copy(
    mode: str,
    gpus: list[int],
    ports: list[int],
    out: Path,
    *,
    cpu: bool = False,
    backend: str = "vllm",
    profile: Path = PROFILE,
    eager: bool = False,
) -> dict[str, Any]:
    """The quickstart-gpu profile with only what running modes side by side needs changed:
    several ``gpus`` put one trainer rank and one vLLM replica on each (``colocate``);
    ``cpu`` swaps vLLM and CUDA for the built-in server on CPU (float32), ranks as replicas;
    ``backend = "sglang"`` swaps vLLM for SGLang (its flags in place of vLLM's). Another
    ``profile`` with no ``gpus`` given keeps its own placement; ``eager``: vLLM eager."""
    body = tomllib.loads(profile.read_text())
    body["run"] |= {"mode": mode, "name": f"{profile.stem}-{mode}", "output_dir": str(out)}
    if eager:
        body["inference"]["enforce_eager"] = True
    if not gpus and not cpu:  # the profile's own placement
        if shutil.which("vllm") is None and body["inference"].get("backend") == "vllm":
            body["inference"]["vllm_executable"] = vllm_cli()
        body["api"]["port"], body["inference"]["port"] = ports
        return body
    body["api"]["port"], body["inference"]["port"] = ports
    inference, trainer = body["inference"], body["trainer"]
    replicas = max(1, len(gpus))
    if cpu:
        for key in ("gpus", "gpu_memory_utilization", "extra_args", "weight_transfer"):
            inference.pop(key, None)
        trainer.pop("gpus", None)
        inference |= {"backend": "builtin", "device": "cpu", "dtype": "float32"}
        trainer |= {"device": "cpu", "dtype": "float32"}
        if replicas > 1:
            trainer["ranks"] = replicas
    else:
        inference["gpus"] = trainer["gpus"] = list(gpus)
        if backend == "sglang":
            inference.pop("weight_transfer")  # shared_vllm's, a mode SGLang refuses
            inference |= {"backend": "sglang", **sglang_settings(mode)}
        elif shutil.which("vllm") is None:
            inference["vllm_executable"] = vllm_cli()
    if replicas > 1:
        inference["data_parallel_size"] = replicas
    return body


def rolling(rewards: list[float]) -> list[float]:
    """Mean of the last ``WINDOW`` steps at every step from the ``WINDOW``-th on."""
    return [statistics.fmean(rewards[i - WINDOW : i]) for i in range(WINDOW, len(rewards) + 1)]


def watch(
    run: ModeRun,
    work: Path,
    deadline: float,
    args: argparse.Namespace,
    report: Callable[[], None] = lambda: None,
) -> None:
    """Run one mode until it reaches ``args.target``, its trainer ends, or ``deadline``;
    ``report`` is called every 5 s with the run's numbers so far."""
    target, cpu = args.target, args.cpu
    cell = work / run.mode
    cell.mkdir(parents=True, exist_ok=True)
    ports = free_ports(2, first=port_base(args.backend) + 10 * MODES.index(run.mode))
    profile = cell / "profile.toml"
    body = profile_copy(
        run.mode, run.gpus, ports, cell / "runs", cpu=cpu, backend=args.backend,
        profile=args.profile, eager=args.eager,
    )  # fmt: skip
    profile.write_text(tomli_w.dumps(body))
    began = time.time()
    with (cell / "supervisor.jsonl").open("wb") as out, (cell / "supervisor.err").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_tui", "run", str(profile), "--json"],
            stdout=out, stderr=err, cwd=REPO, start_new_session=True,
        )  # fmt: skip
    supervisor = psutil.Process(proc.pid)
    run_id = ""
    reported = time.time()
    try:
        while proc.poll() is None and time.time() < deadline:
            run_id = run_id or run_id_of(supervisor)
            read(run, cell, began, target)
            if run.target_step is not None:
                break
            if time.time() - reported > 5:
                run.wall_s, reported = time.time() - began, time.time()
                report()
            time.sleep(1.0)
    finally:
        stop_group(proc)
        run.leftovers = sweep(run_id, wait=10.0)
    read(run, cell, began, target)
    run.wall_s = time.time() - began
    if run.target_step is not None:
        run.status = "reached"
    elif run.rewards:
        run.status = "not reached in the time given"
    else:
        run.status = f"failed (exit {proc.returncode})"
        run.reason = failure_tails(cell)


def failure_tails(cell: Path) -> str:
    """The last lines of the supervisor's stderr and of every log of a cell's newest run."""
    runs = sorted((cell / "runs").glob("*/"))
    logs = sorted(runs[-1].glob("logs/*.log")) if runs else []
    return " | ".join(
        f"{p.name}: {tail(p, 5)}" for p in [cell / "supervisor.err", *logs] if tail(p, 1)
    )[-2000:]


def port_base(backend: str) -> int:
    """First port tried per backend: one call may run both backends side by side."""
    return {"vllm": 24000, "sglang": 25000}[backend]


def values(records: list[dict[str, Any]], key: str) -> list[float]:
    """``key``'s value in each record that has it, in order."""
    return [float(r[key]) for r in records if key in r]


def read(run: ModeRun, cell: Path, began: float, target: float) -> None:
    """Rewards so far, and the first step whose ``WINDOW``-step mean reached ``target``."""
    runs = sorted((cell / "runs").glob("*/"))
    if not runs:
        return
    lines = _lines(runs[-1] / "metrics.jsonl")
    records = sorted(
        (r for r in lines if r.get("type") == "metrics" and "reward/mean" in r.get("data", {})),
        key=lambda r: r["step"],
    )
    data = [r["data"] for r in records]
    run.rewards = values(data, "reward/mean")
    run.sync_times = values(data, "sync_time")
    run.alignment = values(data, "alignment/diff_abs_mean")
    run.alignment_lag0 = values(data, "alignment/diff_abs_mean_lag0")
    if records:
        span = (records[0]["t"], records[-1]["t"])
        server = [
            r["data"]
            for r in lines
            if r.get("process") == "supervisor" and span[0] <= r["t"] <= span[1]
        ]
        run.inference_tok_s = values(server, "inference/tokens_per_s")
    run.step_times = [float(r["t"]) - began for r in records]
    for record in data:
        for key, value in record.items():
            if key.startswith("gpu_memory_gb/") or key == "peak_memory_gb":
                name = key.removeprefix("gpu_memory_gb/") if "/" in key else "trainer"
                run.peak_gb[name] = max(run.peak_gb.get(name, 0.0), float(value))
    for record in lines:
        used = record.get("data", {}).get("process/inference/gpu_memory_bytes")
        if record.get("process") == "supervisor" and used is not None:
            run.peak_gb["inference"] = max(run.peak_gb.get("inference", 0.0), float(used) / 1e9)
    for index, mean in enumerate(rolling(run.rewards)):
        if mean >= target:
            step = index + WINDOW
            run.target_step, run.target_s = step, run.step_times[step - 1]
            return


def markdown(runs: list[ModeRun], info: dict[str, str], args: argparse.Namespace) -> str:
    """The per-mode table."""
    lines = [
        f"# profiles/{args.profile.name}, {engine(args)} (benchmarks/quickstart_gpu.py)",
        "",
        f"- date {info.get('date')}; {info.get('device')}; torch {info.get('torch')}, vLLM "
        f"{info.get('vllm')}, SGLang {info.get('sglang')}, transformers "
        f"{info.get('transformers')}",
        (
            "- on CPU (`--cpu`): the built-in server in float32, `colocate` on gloo ranks and "
            "built-in replicas; otherwise the profile as shipped (a check, no GPU figures)"
            if args.cpu
            else f"- modes ran at the same time, spread over GPUs {args.gpus}; the profile as "
            "shipped except mode, ports, GPUs (several for `colocate`: one trainer rank and "
            "one vLLM replica each, data_parallel_size = their count), output dir (and the "
            "vLLM command where none is on PATH)"
        ),
        f"- reward: mean over {WINDOW} steps; target {args.target}; time from the command "
        "(vLLM start-up and the model build included)",
        "- Δlogp: the trainer's `alignment/diff_abs_mean` per step (mean absolute trainer - "
        "server logprob of the sampled tokens, off-policy drift included); lag-0: the same "
        "over sequences sampled at the weights being trained (the sync's error alone: ~5e-3 "
        "in bf16, ~1e-7 in float32), over the steps that had some",
        "- sync: the trainer's `sync_time` per sync, median / max (count; restart modes: the "
        "restart it waited for); server tok/s: generated tokens/s from the server's own "
        "counter, mean / max over the training steps",
        "",
        f"| mode | GPU | status | steps | reward, first {WINDOW} | best {WINDOW}-step mean "
        f"| step reaching {args.target} | seconds to {args.target} | sync s median / max (n) "
        "| server tok/s mean / max | Δlogp median / max | lag-0 Δlogp median / max (steps) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        windows = rolling(r.rewards)
        first = f"{windows[0]:.3f}" if windows else "n/a"
        best = f"{max(windows):.3f}" if windows else "n/a"
        status = r.status + (f": {r.reason[:200]}" if r.reason else "")
        lines.append(
            f"| {r.mode} | {where(r, args)} | {status.replace('|', '/')} | {len(r.rewards)} | "
            f"{first} | "
            f"{best} | {r.target_step or 'n/a'} | "
            f"{'n/a' if r.target_s is None else f'{r.target_s:.0f}'} | "
            f"{spread(r.sync_times)} ({len(r.sync_times)}) | {rate(r.inference_tok_s)} | "
            f"{spread(r.alignment)} | {spread(r.alignment_lag0)} ({len(r.alignment_lag0)}) |"
        )
    lines += [
        "",
        f"Reward curves ({WINDOW}-step mean at every {WINDOW}th step, s from the command):",
    ]
    lines += ["", *(f"- {r.mode} ({where(r, args)}): {curve(r)}" for r in runs if r.rewards)]
    peaks = [
        f"- {r.mode}: " + ", ".join(f"{k} {v:.1f} GB" for k, v in sorted(r.peak_gb.items()))
        for r in runs
        if r.peak_gb
    ]
    if peaks:
        lines += ["", "Peak GPU memory (trainer: torch's peak per rank; inference: NVML):", ""]
        lines += peaks
    return "\n".join(lines) + "\n"


def curve(run: ModeRun) -> str:
    """``step: mean (s)`` at every ``WINDOW``-th step: the reward curve in one line."""
    points = [
        f"{step}: {statistics.fmean(run.rewards[step - WINDOW : step]):.2f} "
        f"({run.step_times[step - 1]:.0f} s)"
        for step in range(WINDOW, len(run.rewards) + 1, WINDOW)
    ]
    return ", ".join(points) or "fewer steps than one window"


def engine(args: argparse.Namespace) -> str:
    """The inference engine the runs used, as the title says it."""
    if args.cpu:
        return "built-in server on CPU"
    return {"vllm": "vLLM", "sglang": "SGLang"}[args.backend]


def rate(values: list[float]) -> str:
    """``mean / max`` tokens/s, or n/a."""
    if not values:
        return "n/a"
    return f"{statistics.fmean(values):,.0f} / {max(values):,.0f}"


def spread(values: list[float]) -> str:
    """``median / max`` of per-step values, or n/a."""
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2g} / {max(values):.2g}"


def where(run: ModeRun, args: argparse.Namespace) -> str:
    """Its GPUs (``2+3``: one trainer rank and one vLLM replica on each), or its CPU ranks."""
    if not run.gpus and not args.cpu:
        return "as the profile places it"
    if args.cpu:
        return f"CPU x{len(run.gpus)}" if len(run.gpus) > 1 else "CPU"
    return "+".join(map(str, run.gpus))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--gpus", type=int, nargs="+", default=[0])
    parser.add_argument("--budget", type=float, default=500.0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument(
        "--colocate-ranks",
        type=int,
        default=1,
        help="colocate on the last N of --gpus: N trainer ranks, vLLM data_parallel_size N",
    )
    parser.add_argument(
        "--backend",
        choices=["vllm", "sglang"],
        default="vllm",
        help="the inference engine (sglang: the modes it runs, see SGLANG_REFUSED)",
    )
    parser.add_argument("--cpu", action="store_true", help="built-in server on CPU, float32")
    parser.add_argument("--profile", type=Path, default=PROFILE, help="the profile to copy")
    parser.add_argument(
        "--as-placed", action="store_true", help="keep the profile's own GPUs (one mode)"
    )
    parser.add_argument("--eager", action="store_true", help="vLLM eager (no torch.compile)")
    parser.add_argument("--work", type=Path, help="run directories (default: in --out)")
    parser.add_argument("--dry-run", action="store_true", help="write the copies, check them")
    args = parser.parse_args(argv)
    if args.cpu:  # CPU "GPUs" are rank slots: only how many a run has counts
        args.gpus = list(range(max(args.colocate_ranks, 1)))
    refused = [m for m in args.modes if args.backend == "sglang" and m in SGLANG_REFUSED]
    if refused or (args.cpu and args.backend != "vllm"):
        parser.error(f"--backend {args.backend} cannot run {refused or '--cpu'}")
    if len(args.gpus) < args.colocate_ranks:
        parser.error(f"--colocate-ranks {args.colocate_ranks} needs as many --gpus")
    out = args.out.resolve()
    args.name = "quickstart_gpu" if args.profile == PROFILE else args.profile.stem
    work = args.work.resolve() if args.work else out / f"work-{args.name}"
    work.mkdir(parents=True, exist_ok=True)
    runs = place(args.modes, args.gpus, args.colocate_ranks)
    if args.as_placed:
        runs = [ModeRun(mode, []) for mode in args.modes]
    if args.dry_run:
        failures = 0
        for run in runs:
            path = work / f"{run.mode}.toml"
            ports = free_ports(2, first=port_base(args.backend) + 10 * MODES.index(run.mode))
            body = profile_copy(
                run.mode, run.gpus, ports, work, cpu=args.cpu, backend=args.backend,
                profile=args.profile, eager=args.eager,
            )  # fmt: skip
            path.write_text(tomli_w.dumps(body))
            done = subprocess.run(
                [sys.executable, "-m", "grpo_tui", "check", str(path)],
                capture_output=True, text=True, cwd=REPO,
            )  # fmt: skip
            failures += done.returncode != 0
            print(f"== {run.mode}: check exit {done.returncode}\n{done.stdout[-800:]}{done.stderr}")
        return 1 if failures else 0
    deadline = time.time() + args.budget
    from concurrent.futures import ThreadPoolExecutor

    info = facts(args)

    def report() -> str:
        text = markdown(runs, info, args)
        (out / f"{args.name}.md").write_text(text)
        raw = {"facts": info, "runs": [asdict(r) for r in runs]}
        (out / f"{args.name}.json").write_text(json.dumps(raw, indent=1))
        return text

    alone = [r for r in runs if r.mode == "colocate" and len(args.gpus) == args.colocate_ranks]
    for batch in ([r for r in runs if r not in alone], alone):  # colocate sleeps alone
        with ThreadPoolExecutor(max_workers=max(1, len(batch))) as pool:
            list(pool.map(lambda r: watch(r, work, deadline, args, report), batch))
    print(report(), flush=True)
    return 0 if all(r.status == "reached" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
