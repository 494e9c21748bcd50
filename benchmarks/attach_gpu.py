"""Inference that outlives a run, on a GPU (issue 37): a run attached to a warm vLLM, and a
4-cell sweep on one kept server against four cells with their own. Fits one device call
of <= 300 s (``attach_gpu_device.sh``).

    python benchmarks/attach_gpu.py --out OUT [--budget 255] [--cpu]

``profiles/quickstart-gpu.toml`` (a copy with free ports; ``vllm_executable`` through this
Python where no ``vllm`` command is on PATH, as on the device), through the real commands,
in this order (what matters most first); every phase checks the budget first and is
skipped, saying so, when it cannot fit, and every wait is capped and says what it waits
for every 15 s:

1. **serve**: ``grpo-tui serve`` starts vLLM once (timed: the kept sweep's one start).
2. **attached-1**: ``grpo-tui run --inference-url URL``, timed from its command to its
   first step and to a 5-step mean reward of ``--target`` (0.8), then stopped. Goals:
   first step <= 8 s, reward 0.8 <= 25 s (a cold run, issue 37's table: 34.7 s, 49.3 s).
3. **sweep kept**: ``grpo-tui sweep --inference-url URL --set trainer.lr=...`` (4 cells of
   ``--sweep-steps``, one after another, each reset to the base at its start) on that
   server. Its wall with the server's start (1) is what ``--keep-server`` costs.
4. **attached-2, lora_only, none** on the same server (the first from what the sweep
   trained, reset to the base: its first rewards and lag-0 difference), each only when
   the budget keeps room for phase 6 (estimated from the server's start time).
5. ``serve`` stopped with Ctrl-C (its exit code reported).
6. **sweep own**: the same 4 cells, each with its own vLLM, one at a time. Goal: kept
   (1 + 3) <= 0.6x own. Cut by the budget, the cells it finished estimate it (said so).
7. **cold**: one run with its own vLLM, to the reward target, if time is left.

``--own-only``: phases 6 and 7 alone (a second call, when the first cut phase 6 short).

Per sweep cell: its wall and its first step from its start (attached vs cold). Writes
``attach_gpu.md`` and ``attach_gpu.json`` to ``--out``, rewritten after each phase (a cut
call keeps what was measured). On SIGTERM (the device script's ``timeout``) every command
it started is stopped (their supervisors stop their servers), and the report written.
``--cpu``: the CPU quickstart and the built-in server, a check of the plumbing (no GPU
numbers; the reward target is not reached in a few steps).
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
from collections import Counter
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import httpx
import tomli_w
from attach_cpu import free_port, trainer_records
from gpu_idle import wait_empty

from grpo_trainer.serve.external import Unreachable, describe
from grpo_tui.sweep.store import SweepDir

REPO = Path(__file__).resolve().parents[1]
GPU_PROFILE = REPO / "profiles" / "quickstart-gpu.toml"
CPU_PROFILE = REPO / "profiles" / "quickstart.toml"
WINDOW = 5
LRS = ("1e-3", "1.5e-3", "7e-4", "2e-3")
"""The sweep's 4 cells (trainer.lr): each a short run of the recipe."""
SAY_EVERY = 15.0
BEGAN = time.monotonic()
LIVE: list[subprocess.Popen[bytes]] = []
"""Every command started and not yet stopped (stopped on SIGTERM)."""
TERMINATING: list[bool] = []
"""Set on SIGTERM: the device script's ``timeout`` SIGKILLs 10 s later, so stops are short."""


def say(line: str) -> None:
    print(f"[attach_gpu {time.monotonic() - BEGAN:6.1f}s] {line}", flush=True)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Waiting:
    """Says, every ``SAY_EVERY`` s, what a capped wait waits for and how long it has."""

    def __init__(self, what: str, cap: float) -> None:
        self.what, self.cap = what, cap
        self.began = self.said = time.monotonic()
        say(f"waiting up to {cap:.0f} s for {what}")

    def over(self, detail: str = "") -> bool:
        now = time.monotonic()
        if now - self.said >= SAY_EVERY:
            self.said = now
            waited = f"{now - self.began:.0f} of {self.cap:.0f} s"
            say(f"still waiting for {self.what} ({waited}){detail}")
        return now - self.began >= self.cap


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
    say(f"grpo-tui {' '.join(args)}")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_tui", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            start_new_session=True,
        )
    LIVE.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 45) -> int:
    """An ordered stop of the command's group (its supervisor stops the rest), SIGKILL to
    the group after ``wait`` s (the supervisor's watchdog then ends what it ran)."""
    if TERMINATING:
        wait = min(wait, 3.0)
    if proc.poll() is None:
        say(f"stopping pid {proc.pid} ({signal.Signals(sig).name}, at most {wait:.0f} s)")
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            say(f"pid {proc.pid} still running after {wait:.0f} s: SIGKILL to its group")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc in LIVE:
        LIVE.remove(proc)
    return proc.returncode


def on_term(signum: int, _frame: object) -> None:
    say(f"{signal.Signals(signum).name}: stopping what was started, then the report")
    TERMINATING.append(True)
    raise SystemExit(128 + signum)


def first_step_s(run_dir: Path, began: float) -> float | None:
    records = trainer_records(run_dir)
    return float(records[0]["t"]) - began if records else None


def timed_run(
    profile: Path,
    work: Path,
    name: str,
    url: str | None,
    args: argparse.Namespace,
    cap: float,
    mode: str | None = None,
    most_steps: int | None = None,
) -> dict[str, Any]:
    """``grpo-tui run`` (in ``mode``) to a 5-step mean reward of ``--target`` (then
    stopped), ``most_steps`` steps, its trainer's end, or ``cap`` s; seconds from the
    command."""
    run_dir = work / "runs" / name
    extra = ["--inference-url", url] if url else []
    extra += ["--mode", mode] if mode else []
    began = time.time()
    proc = start(["run", str(profile), "--run-dir", str(run_dir), *extra], work / f"{name}.log")
    waiting = Waiting(f"{name}: a 5-step mean reward of {args.target}", cap)
    reached: float | None = None
    records: list[dict[str, Any]] = []
    while proc.poll() is None and not waiting.over(f": {len(records)} steps"):
        time.sleep(0.5)
        records = trainer_records(run_dir)
        rewards = [r["data"].get("reward/mean", 0.0) for r in records]
        for index in range(WINDOW - 1, len(rewards)):
            if statistics.mean(rewards[index - WINDOW + 1 : index + 1]) >= args.target:
                reached = float(records[index]["t"]) - began
                break
        if reached is not None or (most_steps is not None and len(records) >= most_steps):
            break
    code = stop(proc)
    records = trainer_records(run_dir)
    first = records[0] if records else None
    row = {
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
    say(f"{name}: first step {row['first_step_s']}, reward target {reached}, exit {code}")
    return row


def reset_line(run_dir: Path) -> str:
    log = run_dir / "logs" / "inference.log"
    if not log.exists():
        return ""
    return next((line for line in log.read_text().splitlines() if "attached to" in line), "")


def wait_for(url: str, proc: subprocess.Popen[bytes], cap: float) -> float | None:
    """Seconds until the kept server answers its lease route; None when ``serve`` exited
    or ``cap`` ran out."""
    waiting = Waiting(f"grpo-tui serve's server at {url}", cap)
    while proc.poll() is None and not waiting.over():
        try:
            if httpx.get(f"{url}/grpo/lease", timeout=2).status_code == 200:
                return time.monotonic() - waiting.began
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    return None


def cells(sweep_dir: Path) -> list[dict[str, Any]]:
    """Each cell's state, wall and first step (seconds from its start)."""
    if not SweepDir.is_sweep(sweep_dir):
        return []
    store = SweepDir(sweep_dir)
    rows = []
    for cell_id, status in store.statuses().items():
        began, ended = status.started_at, status.ended_at
        rows.append(
            {
                "cell": cell_id,
                "state": status.state,
                "wall_s": ended - began if began and ended else None,
                "first_step_s": first_step_s(store.run_dir(cell_id), began) if began else None,
            }
        )
    return rows


def states(sweep_dir: Path) -> str:
    """How many cells are in each state (``done 1, running 1``)."""
    counts = Counter(c["state"] for c in cells(sweep_dir))
    return ", ".join(f"{state} {n}" for state, n in sorted(counts.items())) or "none begun"


def timed_sweep(
    profile: Path, work: Path, name: str, url: str | None, cap: float
) -> dict[str, Any]:
    """The 4 cells one after another: attached to ``url``, or each with its own server."""
    sweep_dir = work / name
    options = ["--headless", "--dir", str(sweep_dir), "--set", f"trainer.lr={','.join(LRS)}"]
    options += ["--inference-url", url] if url else []
    began = time.monotonic()
    proc = start(["sweep", str(profile), *options], work / f"{name}.log")
    what = f"sweep {name}: {len(LRS)} cells " + ("on the kept server" if url else "each cold")
    waiting = Waiting(what, cap)
    while proc.poll() is None and not waiting.over(f": cells {states(sweep_dir)}"):
        time.sleep(0.5)
    cut = proc.poll() is None
    code = stop(proc, signal.SIGINT)
    done = [c for c in cells(sweep_dir) if c["state"] == "done" and c["wall_s"]]
    row: dict[str, Any] = {"sweep": name, "kept_server": url is not None, "exit": code}
    row["cells"] = cells(sweep_dir)
    row["wall_s"] = None if cut else time.monotonic() - began
    if cut and done:  # the cells it finished estimate the rest
        per_cell = statistics.mean(c["wall_s"] for c in done)
        row["estimate_s"] = per_cell * len(LRS)
        row["note"] = f"cut by the budget after {len(done)} of {len(LRS)} cells: estimated"
    elif cut:
        row["note"] = "cut by the budget before a cell finished"
    say(f"sweep {name}: exit {code}, wall {row['wall_s']}, {row.get('note', '')}")
    return row


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


def fmt(value: float | None, spec: str = ".1f", none: str = "-") -> str:
    return format(value, spec) if value is not None else none


def report(out: Path, result: dict[str, Any]) -> None:
    header = ", ".join(f"{k} {v}" for k, v in result["facts"].items())
    lines = ["# Runs attached to a kept server; a sweep on one server (issue 37)", "", header, ""]
    lines += [f"GPU before: {result.get('gpu_before', '-')}", ""]
    if "serve_ready_s" in result:
        lines += [
            f"`grpo-tui serve`: ready after {result['serve_ready_s']:.1f} s (not in the runs);"
            f" exit {result.get('serve_exit', '-')} on Ctrl-C.",
            "",
        ]
    lines += [
        "| run | mode | server | exit | first step (s from the command) | 5-step reward "
        f"{result['target']} (s) | steps | first rewards | lag-0 diff step 1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["runs"]:
        hit = fmt(row["reward_target_s"], none="not reached")
        lines.append(
            f"| {row['run']} | {row['mode']} | {row['server']} | {row['exit']} | "
            f"{fmt(row['first_step_s'])} | {hit} | {row['steps']} | {row['first_rewards']} | "
            f"{fmt(row['lag0_first_step'], '.1e')} |"
        )
    lines.append("")
    lines += [f"- {row['run']}: `{row['reset']}`" for row in result["runs"] if row["reset"]]
    sweeps = result.get("sweeps", [])
    if sweeps:
        lines += [
            "",
            "| sweep (4 cells, one at a time) | exit | wall (s) | cells: wall / first step (s) |",
        ]
        lines.append("|---|---|---|---|")
        for row in sweeps:
            wall = fmt(row["wall_s"], none=f"{fmt(row.get('estimate_s'))} (est.)")
            per = ", ".join(
                f"{c['cell']} {c['state']} {fmt(c['wall_s'])} / {fmt(c['first_step_s'])}"
                for c in row["cells"]
            )
            lines.append(f"| {row['sweep']} | {row['exit']} | {wall} | {per} |")
        lines += [f"- {row['sweep']}: {row['note']}" for row in sweeps if row.get("note")]
        walls = {r["sweep"]: r["wall_s"] or r.get("estimate_s") for r in sweeps}
        ready = result.get("serve_ready_s")
        if walls.get("kept") and walls.get("own") and ready is not None:
            kept = ready + walls["kept"]
            lines += [
                "",
                f"kept = serve's start {ready:.1f} s + cells {walls['kept']:.1f} s = {kept:.1f} s;"
                f" own {walls['own']:.1f} s: {kept / walls['own']:.2f}x (goal <= 0.6x)",
            ]
    lines += ["", *[f"- {note}" for note in result.get("notes", [])]]
    (out / "attach_gpu.md").write_text("\n".join(lines) + "\n")
    (out / "attach_gpu.json").write_text(json.dumps(result, indent=1))


def kept_phases(
    profile: Path, work: Path, url: str, args: argparse.Namespace, budget: Budget, result: dict
) -> None:
    """Phases 2-4 on the kept server (see the module docstring)."""
    notes, runs = result["notes"], result["runs"]
    try:  # what check sees of it
        result["server_facts"] = asdict(describe(url))
    except Unreachable as error:
        notes.append(f"describe({url}) failed: {error}")
    if budget.left() >= 40:
        runs.append(timed_run(profile, work, "attached-1", url, args, min(60, budget.left() - 20)))
    else:
        notes.append(f"attached-1 skipped: {budget.left():.0f} s of budget left")
    report(args.out, result)
    if budget.left() >= 60:
        cap = min(150, budget.left() - 15)
        result["sweeps"].append(timed_sweep(args.sweep_profile, work, "kept", url, cap))
    else:
        notes.append(f"sweep kept skipped: {budget.left():.0f} s of budget left")
    report(args.out, result)
    own = len(LRS) * (result["serve_ready_s"] + 12)  # room phase 6 needs
    for name, mode, steps in (
        ("attached-2", None, None),
        ("attached-lora_only", "lora_only", args.mode_steps),
        ("attached-none", "none", args.mode_steps),
    ):
        if budget.left() - own < 45:
            notes.append(f"{name} skipped: {budget.left():.0f} s left, ~{own:.0f} kept for own")
            continue
        runs.append(timed_run(profile, work, name, url, args, 40, mode=mode, most_steps=steps))
        report(args.out, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=255.0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--sweep-steps", type=int, default=3)
    parser.add_argument("--mode-steps", type=int, default=6, help="lora_only and none: steps")
    parser.add_argument("--cpu", action="store_true", help="the CPU quickstart: a plumbing check")
    parser.add_argument(
        "--own-only", action="store_true", help="phases 6-7 only (a second call, if 6 was cut)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    budget = Budget(args.budget)
    out = args.out
    work = out / "work-attach"
    work.mkdir(parents=True, exist_ok=True)
    source = CPU_PROFILE if args.cpu else GPU_PROFILE
    profile, url = profile_copy(source, work, "attached", 6 if args.cpu else None)
    sweep_data = tomllib.loads(profile.read_text())  # the same ports: the same kept server
    sweep_data["trainer"].update(training_steps=args.sweep_steps, checkpoint_interval=1000)
    args.sweep_profile = work / "sweep.toml"
    args.sweep_profile.write_text(tomli_w.dumps(sweep_data))
    result: dict[str, Any] = {
        "facts": facts(),
        "target": args.target,
        "budget_s": args.budget,
        "runs": [],
        "sweeps": [],
        "notes": [],
    }
    notes = result["notes"]
    empty = wait_empty([0], timeout=20) if not args.cpu else None
    result["gpu_before"] = asdict(empty) if empty else "not checked (CPU)"
    try:
        if not args.own_only:
            kept_server(profile, work, url, args, budget, result)
        if budget.left() >= 60:
            cap = budget.left() - 10
            result["sweeps"].append(timed_sweep(args.sweep_profile, work, "own", None, cap))
        else:
            notes.append(f"sweep own skipped: {budget.left():.0f} s of budget left")
        report(out, result)
        if budget.left() >= 90:
            result["runs"].append(timed_run(profile, work, "cold", None, args, budget.left() - 15))
        else:
            notes.append(f"cold run skipped: {budget.left():.0f} s of budget left")
    finally:
        for proc in list(LIVE):
            stop(proc, wait=8)
        report(out, result)
    print((out / "attach_gpu.md").read_text(), flush=True)


def kept_server(
    profile: Path, work: Path, url: str, args: argparse.Namespace, budget: Budget, result: dict
) -> None:
    """Phases 1-5: ``serve`` started, the runs and the sweep on it, ``serve`` stopped."""
    notes = result["notes"]
    serving = start(["serve", str(profile), "--run-dir", str(work / "runs" / "serve")],
                    work / "serve.log")  # fmt: skip
    try:
        ready = wait_for(url, serving, min(150, budget.left() - 30))
        if ready is None:
            notes.append(
                f"the kept server did not answer: {(work / 'serve.log').read_text()[-1500:]}"
            )
        else:
            result["serve_ready_s"] = ready
            kept_phases(profile, work, url, args, budget, result)
    finally:
        result["serve_exit"] = stop(serving, signal.SIGINT, wait=30)
        report(args.out, result)


if __name__ == "__main__":
    main()
