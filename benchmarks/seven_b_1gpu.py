"""The Qwen2.5-7B shape on one GPU through ``grpo-tui run``, mode after mode (issue 40).

``profiles/qwen2.5-7b-1gpu.toml`` (6.53 B parameters, bf16, trainer and vLLM on GPU 0) in
``--modes`` order (default ``shared_vllm``, ``colocate``, ``lora_only``), each inside what
is left of ``--budget`` and its own cap, each on a GPU checked empty first
(``gpu_idle.wait_empty``: bounded, never a kill). Before the first, the model is built
once into the tiny-model cache and timed (the build stated apart: each run then copies it,
``model built`` in the start-up table); vLLM's load and phases come from its log.

Per mode, from the run directory it names (``--run-dir``: only its own files are read):
the mean reward per step and its 5-step mean (the curve; stopped once it reaches
``--target``), the first step's time from the command, the lag-0 logprob difference
(trainer vs vLLM over tokens sampled at the weights being trained: the sync's error
alone, bf16 level ~5e-3), the sync phases per step from the trainer's timeline (pause,
the write: the optimizer step into vLLM's memory, resume, the prefix-cache reset; sleep
and wake in ``colocate``), peak GPU memory per process (the trainer's torch peak; NVML per
process tree: trainer, vLLM) and of the GPU, the GPU's clocks and power (NVML), and the
start-up breakdown (``workload_startup.py``). ``seven_b_1gpu.md`` and ``.json`` are
rewritten every 5 s, so a call cut at its limit returns what was measured.

    python benchmarks/seven_b_1gpu.py --out OUT --work /tmp/seven_b --budget 480   # device
    python benchmarks/seven_b_1gpu.py --out /tmp/s --cpu --budget 400   # CPU: the plumbing

``--cpu`` runs the same copies on CPU with the built-in server and the quickstart's tiny
shape and recipe (float32, lr 1e-3): a check of the script, no 7B figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import tomli_w
from gpu_idle import EmptyCheck, GpuSampler, per_step, wait_empty
from gpu_modes import _lines, facts, free_ports, run_id_of, sweep, tail, vllm_cli
from gpu_workload import stop_group
from workload_startup import run_startup
from workload_startup import table as startup_table

from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "qwen2.5-7b-1gpu.toml"
MODES = ("shared_vllm", "colocate", "lora_only")
WINDOW = 5
NEEDS = {"shared_vllm": 120, "colocate": 120, "lora_only": 100}
"""Seconds a mode needs at least to be worth starting (a 7B start-up is ~1.5 min)."""
CAPS = {"shared_vllm": 240, "colocate": 240, "lora_only": 200}
"""Seconds a mode may take at most, so that the next one gets its turn."""
CPU_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 1, "num_kv_heads": 1,
             "intermediate_size": 128, "final_norm_weight": 6.0, "dtype": "float32"}  # fmt: skip
"""``--cpu``: the quickstart-gpu model (vLLM-sized heads are irrelevant on the built-in
server, its recipe learns in ~50 steps)."""


@dataclass
class ModeResult:
    """One mode's run: its curve, sync phases, memory and start-up."""

    mode: str
    status: str = "not run"
    reason: str = ""
    rewards: list[float] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    """Wall-clock end of each optimizer step."""
    began: float = 0.0
    """Wall-clock start of the command."""
    target_step: int | None = None
    target_s: float | None = None
    lag0: list[float] = field(default_factory=list)
    alignment: list[float] = field(default_factory=list)
    sync_times: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    """Seconds per sync of each phase (the trainer's timeline): pause, write, resume,
    reset (the prefix-cache reset), sleep, wake, and ``total`` from the pause's start to
    the reset's end."""
    peaks_gb: dict[str, float] = field(default_factory=dict)
    """``trainer torch`` (torch's peak), ``<process> NVML`` (the process tree's used
    memory, sampled by the supervisor), ``GPU`` (NVML, the whole GPU)."""
    startup: dict[str, float] = field(default_factory=dict)
    gpu_before: dict[str, Any] = field(default_factory=dict)
    gpu_samples: list[list[float]] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def first_step_s(self) -> float | None:
        return self.step_ends[0] - self.began if self.step_ends else None

    @property
    def step_s(self) -> float | None:
        gaps = [b - a for a, b in zip(self.step_ends, self.step_ends[1:], strict=False)]
        return statistics.median(gaps) if gaps else None


def rolling(rewards: list[float]) -> list[float]:
    """Mean of the last ``WINDOW`` steps at every step from the ``WINDOW``-th on."""
    return [statistics.fmean(rewards[i - WINDOW : i]) for i in range(WINDOW, len(rewards) + 1)]


def profile_body(
    mode: str, ports: list[int], runs: Path, cpu: bool, lr: float | None = None
) -> dict[str, Any]:
    """The shipped profile in ``mode`` with its own ports and output folder; ``lr``: another
    full fine-tuning lr than the profile's (a second try after a first); ``cpu``: the
    built-in server and trainer on CPU, the quickstart's shape and recipe."""
    body = tomllib.loads(PROFILE.read_text())
    if lr is not None:
        body["trainer"]["lr"] = lr
    body["run"] |= {"mode": mode, "output_dir": str(runs)}
    body["api"]["port"], body["inference"]["port"] = ports
    inference, trainer = body["inference"], body["trainer"]
    if cpu:
        body["run"]["tiny"] = dict(CPU_SHAPE)
        for key in ("gpus", "gpu_memory_utilization", "extra_args", "weight_transfer"):
            inference.pop(key, None)
        inference.pop("enforce_eager", None)
        inference |= {"backend": "builtin", "device": "cpu", "dtype": "float32"}
        trainer.pop("gpus", None)
        trainer.pop("optimizer_impl", None)
        trainer |= {"device": "cpu", "dtype": "float32", "lr": 1e-3, "lora_lr": 1e-3,
                    "lora_alpha": 128, "beta": 0.04}  # fmt: skip
    elif shutil.which("vllm") is None:  # the device: vLLM on PYTHONPATH, no console script
        inference["vllm_executable"] = vllm_cli()
    return body


def child_env(args: argparse.Namespace) -> dict[str, str]:
    """Our processes' environment: GPU 0, multicast off, the tiny-model cache kept across
    calls (the build is paid once per machine)."""
    env = dict(os.environ)
    env |= {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    env |= {"NVSHMEM_DISABLE_NVLS": "1", "PYTHONUNBUFFERED": "1"}
    env["GRPO_TUI_CACHE"] = str(args.cache)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if not args.cpu:
        env |= {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return env


def prebuild(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Build the model once into the tiny-model cache with the very command a run's model
    process uses (the same cache key), ``--cache-only`` (no copy out of the cache), and
    time it: the build, stated apart."""
    path = work / "profile-build.toml"
    path.write_text(tomli_w.dumps(profile_body("shared_vllm", [1, 2], work / "runs", args.cpu)))
    spec = next(s for s in build_plan(load_profile(path), work / "build").specs
                if s.name == "model")  # fmt: skip
    began = time.monotonic()
    try:
        done = subprocess.run(
            [*spec.command, "--cache-only"], env=child_env(args), cwd=REPO,
            capture_output=True, text=True, timeout=max(60.0, args.budget / 2),
        )  # fmt: skip
    except subprocess.TimeoutExpired as error:  # the child is killed: no mode can run
        done = subprocess.CompletedProcess(spec.command, 124, "", f"timed out: {error}")
    seconds = time.monotonic() - began
    how = (done.stdout.strip().splitlines() or ["?"])[-1]
    entry = Path(how.partition(" in ")[2]) if " in " in how else None
    files = 0
    if entry is not None and entry.is_dir():
        files = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
    return {
        "seconds": round(seconds, 1),
        "exit": done.returncode,
        "how": how,
        "bytes": files,
        "command": " ".join(spec.command[2:]),
        "error": done.stderr[-1500:] if done.returncode else "",
    }


def step_phases(spans: list[tuple[str, float, float]], mode: str) -> dict[str, float]:
    """One step's weight-update phases from its timeline spans. ``shared_vllm``: ``pause``,
    ``write`` (the optimizer step after the pause: it writes vLLM's weights), ``resume``,
    ``reset`` (the sync's own span: the prefix-cache reset) and ``total`` from the pause's
    start to the last of these' end. Other modes: ``sleep`` and ``wake`` (colocate),
    ``reset`` (the sync: colocate's weight load into vLLM, lora_only's adapter save and
    load) and ``total``, their sum."""
    names = {"transfer": "reset", "sleep": "sleep", "wake": "wake"}
    if mode == "shared_vllm":  # finish: the NCCL path's (vLLM on another GPU), not here
        names |= {"pause": "pause", "resume": "resume", "finish": "finish"}
    sums: dict[str, float] = {}
    paused = min((s for p, s, _ in spans if p == "pause"), default=None)
    last = None
    for phase, start, end in spans:
        key = names.get(phase)
        if key is None and phase == "optimizer" and "pause" in names and paused is not None:
            key = "write" if start >= paused else None
        if key is None:
            continue
        sums[key] = sums.get(key, 0.0) + end - start
        last = end if last is None else max(last, end)
    out = {k: round(v, 4) for k, v in sums.items()}
    if mode == "shared_vllm" and paused is not None and last is not None:
        out["total"] = round(last - paused, 4)
    elif out:
        out["total"] = round(sum(out.values()), 4)
    return out


def sync_phases(run_dir: Path, mode: str) -> dict[str, list[float]]:
    """Every step's :func:`step_phases`, from the trainer's timeline (one line a step)."""
    out: dict[str, list[float]] = {}
    for path in sorted((run_dir / "timeline").glob("trainer.*jsonl")):
        for line in _lines(path):
            spans = [(str(s[0]), float(s[1]), float(s[2])) for s in line.get("spans", [])]
            for key, value in step_phases(spans, mode).items():
                out.setdefault(key, []).append(value)
    return out


def read_run(result: ModeResult, run_dir: Path, target: float) -> None:
    """The run's numbers so far, from its own directory."""
    lines = _lines(run_dir / "metrics.jsonl")
    records = sorted(
        (r for r in lines if r.get("type") == "metrics" and r.get("process") == "trainer"
         and "reward/mean" in r.get("data", {})),
        key=lambda r: r["step"],
    )  # fmt: skip
    data = [r["data"] for r in records]
    result.rewards = [float(d["reward/mean"]) for d in data]
    result.step_ends = [float(r["t"]) for r in records]
    result.lag0 = [float(d["alignment/diff_abs_mean_lag0"]) for d in data
                   if "alignment/diff_abs_mean_lag0" in d]  # fmt: skip
    result.alignment = [float(d["alignment/diff_abs_mean"]) for d in data
                        if "alignment/diff_abs_mean" in d]  # fmt: skip
    result.sync_times = [float(d["sync_time"]) for d in data if "sync_time" in d]
    peaks = [float(d["peak_memory_gb"]) for d in data if "peak_memory_gb" in d]
    if peaks:
        result.peaks_gb["trainer torch"] = max(peaks)
    for record in lines:
        if record.get("process") != "supervisor":
            continue
        for key, value in record.get("data", {}).items():
            if key.startswith("process/") and key.endswith("/gpu_memory_bytes") and value:
                name = f"{key.split('/')[1]} NVML"
                result.peaks_gb[name] = max(result.peaks_gb.get(name, 0.0), float(value) / 1e9)
    result.target_step = result.target_s = None
    for index, mean in enumerate(rolling(result.rewards)):
        if mean >= target:
            result.target_step = index + WINDOW
            result.target_s = result.step_ends[index + WINDOW - 1] - result.began
            break


def run_mode(
    args: argparse.Namespace, result: ModeResult, work: Path, deadline: float, report: Any
) -> None:
    """One ``grpo-tui run`` of the profile in ``result.mode`` until the target, the
    deadline or the trainer's end; then SIGKILL of its group and a sweep of its tagged
    processes; the model copy in its run directory is deleted (13 GB of disk)."""
    mode = result.mode
    cell = work / mode
    cell.mkdir(parents=True)  # refused if an earlier call left it: never read
    run_dir = cell / "run"
    ports = free_ports(2, first=26000 + 10 * MODES.index(mode))
    profile = cell / "profile.toml"
    profile.write_text(tomli_w.dumps(profile_body(mode, ports, cell / "runs", args.cpu, args.lr)))
    command = [sys.executable, "-m", "grpo_tui", "run", str(profile), "--json"]
    command += ["--run-dir", str(run_dir)]
    result.began = time.time()
    run_id, proc = "", None
    reported = time.monotonic()
    with GpuSampler(None if args.cpu else [0]) as sampler:
        try:
            with (
                (cell / "supervisor.jsonl").open("wb") as out,
                (cell / "supervisor.err").open("wb") as err,
            ):
                proc = subprocess.Popen(
                    command, stdout=out, stderr=err, cwd=REPO, env=child_env(args),
                    start_new_session=True,
                )  # fmt: skip
            supervisor = psutil.Process(proc.pid)
            while proc.poll() is None and time.monotonic() < deadline:
                run_id = run_id or run_id_of(supervisor)
                read_run(result, run_dir, args.target)
                if result.target_step is not None and len(result.rewards) >= result.target_step:
                    break
                if time.monotonic() - reported > 5:
                    result.wall_s, reported = time.time() - result.began, time.monotonic()
                    result.gpu_samples = sampler.compact()
                    report()
                time.sleep(1.0)
        finally:
            if proc is not None:
                stop_group(proc)
            result.leftovers = sweep(run_id, wait=15.0)
    result.gpu_samples = sampler.compact()
    if sampler.peak_mib is not None:
        result.peaks_gb["GPU"] = sampler.peak_mib * 2**20 / 1e9
    read_run(result, run_dir, args.target)
    result.phases = sync_phases(run_dir, mode)
    result.startup = run_startup(run_dir, result.began)
    result.wall_s = time.time() - result.began
    if result.target_step is not None:
        result.status = "reached"
    elif result.rewards:
        result.status = "not reached in the time given"
    else:
        result.status = f"failed (exit {None if proc is None else proc.returncode})"
        logs = sorted(run_dir.glob("logs/*.log"))
        result.reason = " | ".join(
            f"{p.name}: {tail(p, 8)}" for p in [cell / "supervisor.err", *logs] if tail(p, 1)
        )[-3000:]
    shutil.rmtree(run_dir / "model", ignore_errors=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


def spread(values: list[float], spec: str = ".3f") -> str:
    """``median / max (n)`` or n/a."""
    if not values:
        return "n/a"
    return f"{statistics.median(values):{spec}} / {max(values):{spec}} ({len(values)})"


def clock_line(result: ModeResult) -> str:
    """The GPU's SM clock and power over the run's steps (NVML)."""
    steps = [s for s in per_step(result.gpu_samples, result.step_ends) if "sm_mhz" in s]
    if not steps:
        return ""
    clocks, power = [s["sm_mhz"] for s in steps], [s["power_w"] for s in steps]
    reasons = sorted({r for s in steps for r in s.get("reasons", [])})
    return (
        f"- {result.mode}: SM clock per step {min(clocks):.0f}-{max(clocks):.0f} MHz "
        f"(median {statistics.median(clocks):.0f}), power {min(power):.0f}-{max(power):.0f} W"
        f", clock reasons: {', '.join(reasons) or 'none'}"
    )


def markdown(
    results: list[ModeResult], build: dict[str, Any], info: dict[str, str], args: argparse.Namespace
) -> str:
    where = "CPU check: built-in server, tiny shape (no 7B figures)" if args.cpu else "GPU 0"
    lines = [
        f"# profiles/{PROFILE.name} on one GPU (benchmarks/seven_b_1gpu.py)",
        "",
        f"- date {info.get('date')}; {info.get('device')}; driver {info.get('driver', '-')}; "
        f"torch {info.get('torch')}, vLLM {info.get('vllm')}, transformers "
        f"{info.get('transformers')}; call {args.call}; {where}",
        f"- modes one after the other, each on a GPU checked empty first; reward: mean over "
        f"{WINDOW} steps, target {args.target}, a run stops there; times from the command",
        f"- full fine-tuning lr {args.lr or tomllib.loads(PROFILE.read_text())['trainer']['lr']}"
        + (" (--lr, not the profile's)" if args.lr else " (the profile's)"),
        "",
        f"Build (stated apart, before the runs; each run then copies it from the cache: "
        f"`model built` below): {build.get('seconds', 'n/a')} s, "
        f"{build.get('bytes', 0) / 1e9:.2f} GB of files, "
        f"exit {build.get('exit', '-')} ({build.get('how', '')})"
        + (f": {build['error'][-300:]}" if build.get("error") else ""),
        "",
        f"| mode | status | steps | reward, first {WINDOW} | best {WINDOW}-step mean | step "
        f"reaching {args.target} | s to {args.target} | first step s | step s median | lag-0 "
        "Δlogp median / max (n) | Δlogp median / max | sync_time s median / max (n) | peak "
        "GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        windows = rolling(r.rewards)
        status = (r.status + (f": {r.reason[:400]}" if r.reason else "")).replace("|", "/")
        peaks = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.peaks_gb.items())) or "n/a"
        lines.append(
            f"| {r.mode} | {status.replace(chr(10), ' ')} | {len(r.rewards)} | "
            f"{f'{windows[0]:.3f}' if windows else 'n/a'} | "
            f"{f'{max(windows):.3f}' if windows else 'n/a'} | {r.target_step or 'n/a'} | "
            f"{'n/a' if r.target_s is None else f'{r.target_s:.0f}'} | "
            f"{'n/a' if r.first_step_s is None else f'{r.first_step_s:.1f}'} | "
            f"{'n/a' if r.step_s is None else f'{r.step_s:.2f}'} | {spread(r.lag0, '.2g')} | "
            f"{spread(r.alignment, '.2g')} | {spread(r.sync_times)} | {peaks} |"
        )
    lines += [
        "",
        f"Reward curves ({WINDOW}-step mean every {WINDOW} steps, s from the command):",
        "",
    ]
    for r in results:
        if r.rewards:
            points = [
                f"{s}: {statistics.fmean(r.rewards[s - WINDOW : s]):.2f} "
                f"({r.step_ends[s - 1] - r.began:.0f} s)"
                for s in range(WINDOW, len(r.rewards) + 1, WINDOW)
            ]
            lines.append(f"- {r.mode}: " + (", ".join(points) or "fewer steps than one window"))
    phased = [r for r in results if r.phases]
    if phased:
        names = ["pause", "write", "resume", "reset", "finish", "sleep", "wake", "total"]
        names = [n for n in names if any(n in r.phases for r in phased)]
        lines += [
            "",
            "Sync phases per optimizer step, s, median / max (n), from the trainer's timeline "
            "(shared_vllm: write = the optimizer step into vLLM's weights while paused, reset "
            "= the prefix-cache reset, total = pause start to the reset's end, no finish "
            "phase: that is the NCCL path's; colocate: sleep, wake and reset = the weight "
            "load into vLLM; lora_only: reset = the adapter's save and load; total = their "
            "sum):",
            "",
            "| mode | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        for r in phased:
            lines.append(f"| {r.mode} | " + " | ".join(spread(r.phases.get(n, [])) for n in names)
                         + " |")  # fmt: skip
    started = [(r.mode, r.startup) for r in results if r.startup]
    if started:
        lines += ["", "Start-up (s from the command; `s` columns: durations from vLLM's log):",
                  "", *startup_table(started)]  # fmt: skip
    checks = [r for r in results if r.gpu_before]
    if checks:
        limit = max(float(r.gpu_before.get("max_used_mib", 1024)) for r in checks)
        lines += ["", f"GPU before each mode (no compute process, <= {limit:.0f} MiB used; "
                  "bounded wait, nothing killed):", ""]  # fmt: skip
        for r in checks:
            lines.append(f"- {r.mode}: {EmptyCheck(**r.gpu_before).describe()}")
    clocks = [line for r in results if (line := clock_line(r))]
    if clocks:
        lines += ["", "GPU clocks and power during the steps (NVML):", "", *clocks]
    left = [f"- {r.mode}: {'; '.join(r.leftovers)}" for r in results if r.leftovers]
    if left:
        lines += ["", "Processes left after a run's stop (then killed: ours):", "", *left]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="seven_b_1gpu.md / .json")
    parser.add_argument("--work", type=Path, help="run folders (default: in --out)")
    parser.add_argument("--call-id", default=None, help="this call's folder under --work")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for everything")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--lr", type=float, default=None, help="full fine-tuning lr instead")
    parser.add_argument("--cpu", action="store_true", help="built-in server, tiny shape")
    parser.add_argument("--empty-timeout", type=float, default=60.0)
    parser.add_argument("--empty-mib", type=float, default=1024.0, help="empty: at most this")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the running run
    end = time.monotonic() + args.budget
    args.call = args.call_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = (args.work or out / "work-seven-b").resolve()
    args.cache = root / "cache"
    work = root / args.call
    work.mkdir(parents=True)  # a call's own folder: refused if it exists
    info = facts(args)
    results = [ModeResult(mode) for mode in args.modes]
    build: dict[str, Any] = {}

    def report() -> str:
        text = markdown(results, build, info, args)
        (out / "seven_b_1gpu.md").write_text(text)
        raw = {"facts": info, "call": args.call, "build": build, "cpu": args.cpu,
               "modes": [asdict(r) | {"first_step_s": r.first_step_s, "step_s": r.step_s}
                         for r in results]}  # fmt: skip
        staging = out / "seven_b_1gpu.json.tmp"
        staging.write_text(json.dumps(raw, indent=1))
        staging.replace(out / "seven_b_1gpu.json")
        return text

    print(f"seven_b_1gpu: call {args.call}, building the model", flush=True)
    build.update(prebuild(args, work))
    print(f"seven_b_1gpu: build {build}", flush=True)
    report()
    for result in results:
        left = end - time.monotonic()
        if build.get("exit"):
            result.status = "not run: the model build failed"
            continue
        empty = wait_empty([] if args.cpu else [0], timeout=min(args.empty_timeout, left),
                           max_used_mib=args.empty_mib)  # fmt: skip
        result.gpu_before = empty.to_json()
        print(f"seven_b_1gpu: GPU before {result.mode}: {empty.describe()}", flush=True)
        left = end - time.monotonic()
        if left < NEEDS[result.mode]:
            result.status = f"not run: out of time ({left:.0f} s left)"
            continue
        print(f"seven_b_1gpu: {result.mode} with {left:.0f} s left", flush=True)
        deadline = min(end, time.monotonic() + CAPS[result.mode] * (2 if args.cpu else 1))
        try:
            run_mode(args, result, work, deadline, report)
        except Exception as error:  # one broken mode must not cost the others
            result.status, result.reason = "error", f"{type(error).__name__}: {error}"
        print(f"seven_b_1gpu: {result.mode} {result.status}, {len(result.rewards)} steps, "
              f"first step {result.first_step_s}", flush=True)  # fmt: skip
        report()
    print(report(), flush=True)
    with contextlib.suppress(OSError):
        shutil.rmtree(work / "runs", ignore_errors=True)
    return 0 if all(r.status == "reached" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
