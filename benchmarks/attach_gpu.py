"""Inference that outlives a run, on a GPU (issue 37): runs attached to a warm vLLM, and a
4-cell sweep on one kept server against four cells with their own.

    python benchmarks/attach_gpu.py --out OUT [--budget 540] [--cpu]

``profiles/quickstart-gpu.toml`` (a copy with free ports; ``vllm_executable`` through this
Python where no ``vllm`` command is on PATH, as on the device), through the real commands:

1. **attached**: ``grpo-tui serve`` starts vLLM once (timed, apart); then two runs in a
   row ``grpo-tui run --inference-url URL`` (the second on the server the first trained
   on: it is reset to the base first), each timed from its command to its first step and
   to a 5-step mean reward of ``--target`` (0.8), then stopped; the lag-0 logprob
   difference of each first step (an attached run starts from the base); ``serve`` is
   stopped with Ctrl-C (its exit code is reported) after phase 3. Goals: first step <= 8 s, reward
   0.8 <= 25 s after the command (a cold run, issue 37's table: 34.7 s and 49.3 s).
2. **sweep**: ``grpo-tui sweep --set trainer.lr=...`` (4 cells of ``--sweep-steps``) with
   ``--keep-server`` (vLLM started once), then the same 4 cells with their own servers
   (one at a time, as the kept server runs them), both timed wall to wall. Goal: <= 0.6x.
3. **the other modes**: ``lora_only`` and ``none`` attached to the first kept server
   (``--mode-steps`` steps each: exit, rewards, lag-0 difference), then ``serve`` stopped;
4. **cold**: one run with its own vLLM, the same way, if the budget allows.

Every phase checks the budget first and is skipped, saying so, when it cannot fit. Writes
``attach_gpu.md`` and ``attach_gpu.json`` to ``--out``, rewritten after each phase (a cut
call keeps what was measured). ``--cpu``: the CPU quickstart and the built-in server, a
check of the plumbing (no GPU numbers; the reward target is not reached in a few steps).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import httpx
import tomli_w
from attach_cpu import free_port, trainer_records

from grpo_trainer.serve.external import Unreachable, describe

REPO = Path(__file__).resolve().parents[1]
GPU_PROFILE = REPO / "profiles" / "quickstart-gpu.toml"
CPU_PROFILE = REPO / "profiles" / "quickstart.toml"
WINDOW = 5
LRS = ("1e-3", "1.5e-3", "7e-4", "2e-3")
"""The sweep's 4 cells (trainer.lr): each a short run of the recipe."""


def profile_copy(source: Path, work: Path, name: str, steps: int | None) -> tuple[Path, str]:
    """``source`` with free ports and its runs under ``work``; its kept server's URL."""
    data = tomllib.loads(source.read_text())
    data["run"]["output_dir"] = str(work / "runs")
    data["api"]["port"] = free_port()
    data["inference"]["port"] = port = free_port()
    if data["inference"].get("backend") == "vllm" and shutil.which("vllm") is None:
        data["inference"]["vllm_executable"] = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    if steps is not None:
        data["trainer"].update(training_steps=steps, checkpoint_interval=1000)
    path = work / f"{name}.toml"
    path.write_text(tomli_w.dumps(data))
    return path, f"http://127.0.0.1:{port}"


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "grpo_tui", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 120) -> int:
    """An ordered stop of the command's group (its supervisor stops the rest)."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def timed_run(
    profile: Path,
    work: Path,
    name: str,
    url: str | None,
    target: float,
    budget: Budget,
    mode: str | None = None,
    most_steps: int | None = None,
) -> dict[str, Any]:
    """``grpo-tui run`` (in ``mode``) to a 5-step mean reward of ``target`` (then stopped),
    ``most_steps`` steps, its trainer's end, or the budget; seconds from the command."""
    run_dir = work / "runs" / name
    extra = ["--inference-url", url] if url else []
    extra += ["--mode", mode] if mode else []
    began = time.time()
    proc = start(["run", str(profile), "--run-dir", str(run_dir), *extra], work / f"{name}.log")
    reached: float | None = None
    records: list[dict[str, Any]] = []
    while proc.poll() is None and budget.left() > 20:
        time.sleep(0.5)
        if not (run_dir / "metrics.jsonl").exists():
            continue
        records = trainer_records(run_dir)
        rewards = [r["data"].get("reward/mean", 0.0) for r in records]
        for index in range(WINDOW - 1, len(rewards)):
            if statistics.mean(rewards[index - WINDOW + 1 : index + 1]) >= target:
                reached = float(records[index]["t"]) - began
                break
        if reached is not None or (most_steps is not None and len(records) >= most_steps):
            break
    code = stop(proc)
    if (run_dir / "metrics.jsonl").exists():
        records = trainer_records(run_dir)
    first = records[0] if records else None
    return {
        "run": name,
        "mode": mode or "profile's",
        "server": "kept (attached)" if url else "its own (cold)",
        "exit": code,
        "first_step_s": float(first["t"]) - began if first else None,
        "reward_target_s": reached,
        "steps": len(records),
        "first_rewards": [round(r["data"].get("reward/mean", 0.0), 3) for r in records[:WINDOW]],
        "lag0_first_step": first["data"].get("alignment/diff_abs_mean_lag0") if first else None,
        "reset": reset_line(run_dir),
    }


def reset_line(run_dir: Path) -> str:
    log = run_dir / "logs" / "inference.log"
    if not log.exists():
        return ""
    return next((line for line in log.read_text().splitlines() if "attached to" in line), "")


def wait_for(url: str, proc: subprocess.Popen[bytes], budget: Budget) -> float | None:
    began = time.monotonic()
    while budget.left() > 0 and proc.poll() is None:
        try:
            if httpx.get(f"{url}/grpo/lease", timeout=2).status_code == 200:
                return time.monotonic() - began
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    return None


def timed_sweep(profile: Path, work: Path, name: str, keep: bool, budget: Budget) -> dict[str, Any]:
    options = ["--headless", "--dir", str(work / name), "--set", f"trainer.lr={','.join(LRS)}"]
    if keep:
        options.append("--keep-server")
    began = time.monotonic()
    proc = start(["sweep", str(profile), *options], work / f"{name}.log")
    try:
        code = proc.wait(timeout=max(1.0, budget.left() - 10))
    except subprocess.TimeoutExpired:
        code = stop(proc, signal.SIGINT)
        return {"sweep": name, "exit": code, "wall_s": None, "note": "cut by the budget"}
    return {"sweep": name, "kept_server": keep, "exit": code, "wall_s": time.monotonic() - began}


def facts() -> dict[str, str]:
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node()}
    for dist in ("torch", "transformers", "vllm"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = ""
    out["gpu"] = gpu or "none (CPU)"
    return out


def report(out: Path, result: dict[str, Any]) -> None:
    runs = result.get("runs", [])
    sweeps = result.get("sweeps", [])
    header = ", ".join(f"{k} {v}" for k, v in result["facts"].items())
    lines = ["# Runs attached to a kept server; a sweep on one server (issue 37)", "", header, ""]
    if "serve_ready_s" in result:
        ready, code = result["serve_ready_s"], result.get("serve_exit")
        lines += [
            f"`grpo-tui serve`: ready after {ready:.1f} s (not in the runs); exit {code}.",
            "",
        ]
    lines += [
        "| run | mode | server | exit | first step (s from the command) | 5-step reward "
        f"{result['target']} (s) | steps | first rewards | lag-0 diff step 1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in runs:
        first = f"{row['first_step_s']:.1f}" if row["first_step_s"] is not None else "-"
        hit = (
            f"{row['reward_target_s']:.1f}" if row["reward_target_s"] is not None else "not reached"
        )
        lag0 = f"{row['lag0_first_step']:.1e}" if row["lag0_first_step"] is not None else "-"
        lines.append(
            f"| {row['run']} | {row['mode']} | {row['server']} | {row['exit']} | {first} | {hit} | "
            f"{row['steps']} | {row['first_rewards']} | {lag0} |"
        )
    lines.append("")
    for row in runs:
        if row["reset"]:
            lines.append(f"- {row['run']}: `{row['reset']}`")
    if sweeps:
        lines += ["", "| sweep (4 cells, one at a time) | exit | wall (s) |", "|---|---|---|"]
        for row in sweeps:
            wall = f"{row['wall_s']:.1f}" if row.get("wall_s") else row.get("note", "-")
            lines.append(f"| {row['sweep']} | {row['exit']} | {wall} |")
        walls = {row["sweep"]: row.get("wall_s") for row in sweeps}
        if walls.get("kept") and walls.get("own"):
            lines += ["", f"kept / own: {walls['kept'] / walls['own']:.2f}x (goal <= 0.6x)"]
    lines += ["", *result.get("notes", [])]
    (out / "attach_gpu.md").write_text("\n".join(lines) + "\n")
    (out / "attach_gpu.json").write_text(json.dumps(result, indent=1))


def attached_phase(
    profile: Path, work: Path, url: str, args: argparse.Namespace, budget: Budget, result: dict
) -> None:
    """What ``check`` sees of the kept server, then two runs in a row attached to it."""
    notes = result["notes"]
    try:  # every reason a refusal would give
        told = describe(url)
        result["server_facts"] = asdict(told)
        notes.append(f"the kept server as check sees it: {asdict(told)}")
    except Unreachable as error:
        notes.append(f"describe({url}) failed: {error}")
    for name in ("attached-1", "attached-2"):
        if budget.left() < 90:
            notes.append(f"{name} skipped: {budget.left():.0f} s of budget left")
            return
        result["runs"].append(timed_run(profile, work, name, url, args.target, budget))
        report(args.out, result)


def sweep_phase(
    source: Path, work: Path, args: argparse.Namespace, budget: Budget, result: dict
) -> None:
    """The same 4 cells on one kept server, then each with its own."""
    sweep_profile, _ = profile_copy(source, work, "sweep", args.sweep_steps)
    result["sweeps"] = []
    for name, keep in (("kept", True), ("own", False)):
        if budget.left() < 60:
            result["notes"].append(f"sweep {name} skipped: {budget.left():.0f} s of budget left")
            continue
        result["sweeps"].append(timed_sweep(sweep_profile, work, name, keep, budget))
        report(args.out, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=540.0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--sweep-steps", type=int, default=5)
    parser.add_argument(
        "--mode-steps", type=int, default=8, help="steps of the lora_only and none proofs"
    )
    parser.add_argument("--cpu", action="store_true", help="the CPU quickstart: a plumbing check")
    args = parser.parse_args()
    budget = Budget(args.budget)
    out = args.out
    work = out / "work-attach"
    work.mkdir(parents=True, exist_ok=True)
    source = CPU_PROFILE if args.cpu else GPU_PROFILE
    steps = 6 if args.cpu else None
    profile, url = profile_copy(source, work, "attached", steps)
    result: dict[str, Any] = {"facts": facts(), "target": args.target, "runs": [], "notes": []}
    notes = result["notes"]

    serve_dir = work / "runs" / "serve"
    serving = start(["serve", str(profile), "--run-dir", str(serve_dir)], work / "serve.log")
    try:
        ready = wait_for(url, serving, budget)
        if ready is None:
            log = (work / "serve.log").read_text()[-1500:]
            notes.append(f"the kept server did not answer: {log}")
        else:
            result["serve_ready_s"] = ready
            attached_phase(profile, work, url, args, budget, result)
        sweep_phase(source, work, args, budget, result)  # the kept server waits meanwhile
        if ready is not None:
            for mode in ("lora_only", "none"):  # the other modes against a server not ours
                if budget.left() < 75:
                    notes.append(f"attached {mode} skipped: {budget.left():.0f} s left")
                    continue
                run = timed_run(profile, work, f"attached-{mode}", url, args.target, budget,
                                mode=mode, most_steps=args.mode_steps)  # fmt: skip
                result["runs"].append(run)
                report(out, result)
    finally:
        result["serve_exit"] = stop(serving, signal.SIGINT)
    if budget.left() > 120:
        result["runs"].append(timed_run(profile, work, "cold", None, args.target, budget))
    else:
        notes.append(f"cold run skipped: {budget.left():.0f} s of budget left")
    report(out, result)
    print((out / "attach_gpu.md").read_text())


if __name__ == "__main__":
    main()
