"""vLLM killed mid-run on the GPU: how long until the run trains on fresh weights again?

Issue 27's GPU numbers. Each cell runs ``profiles/quickstart-gpu.toml`` through ``grpo-tui
run`` in one layout, waits for trainer step ``--kill-at``, SIGKILLs vLLM's API server (the
inference process's leader; its engine core lives on until the supervisor ends it), and
reads the run's files to measure, from the kill:

- ``seen``: the supervisor's restart of inference (its ``Restarting`` event): the exit is
  seen on the leader's pid, not through liveness (45 s before, references.md section 8);
- ``vLLM back``: inference ready again (vLLM's own start time);
- ``fresh``: the first trainer step after that trained on weights it synced to the new
  server (its record's ``policy_version`` is its step, i.e. the sync of that step
  succeeded); the goal is ``fresh <= vLLM back + 5 s``;
- trainer restarts after the kill (goal 0), failed syncs (the trainer's warnings), and
  steps trained beyond the max lag (``step - policy_version > max_sync_lag``; goal 0).

Layouts: ``split`` (trainer on GPU 0, vLLM on GPU 1, ``shared_vllm`` over vLLM's NCCL
weight transfer), ``colocate`` and ``lora_only`` (one GPU each, at the same time). Results
go to ``--out`` after every cell (``faults_gpu.json``, ``faults_gpu.md``), so a call cut
short still returns what it measured.

    python benchmarks/faults_gpu.py --out OUT                        # the device run
    python benchmarks/faults_gpu.py --out /tmp/f --cpu --cells split colocate lora_only \\
        none lora_restart                         # the built-in server on CPU, every mode
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import tomli_w
from gpu_modes import _lines, child_env, facts, free_ports, run_id_of, sweep, tail
from gpu_workload import stop_group
from quickstart_gpu import profile_copy

REPO = Path(__file__).resolve().parents[1]
CELLS = {
    "split": ("shared_vllm", {"trainer": [0], "inference": [1]}),
    "colocate": ("colocate", {"trainer": [0], "inference": [0]}),
    "lora_only": ("lora_only", {"trainer": [1], "inference": [1]}),
    "none": ("none", {"trainer": [0], "inference": [0]}),
    "lora_restart": ("lora_restart", {"trainer": [1], "inference": [1]}),
}
"""Cell -> (mode, GPUs of each role). ``colocate`` and ``lora_only`` share the machine
(one GPU each), as do the restart modes; ``split`` takes both, so it runs alone. The
restart modes run only when named (``--cells``): their weights are fresh only at the
next sync restart, so the ``fresh`` goal is not theirs."""
DEFAULT_CELLS = ("split", "colocate", "lora_only")
PHASES = (("colocate", "lora_only"), ("split",), ("none", "lora_restart"))
FRESH_GOAL_S = 5.0
AFTER_S = 15.0
"""Seconds a cell keeps watching once it trains on fresh weights again."""
PORT_BASE = 26000


@dataclass
class CellResult:
    """What one cell measured (seconds from the kill)."""

    cell: str
    mode: str
    status: str = "not run"
    killed_at_step: int | None = None
    killed_pid: int | None = None
    seen_s: float | None = None
    vllm_back_s: float | None = None
    fresh_s: float | None = None
    fresh_step: int | None = None
    trainer_restarts: int = 0
    failed_syncs: int = 0
    steps_after_kill: int = 0
    beyond_lag: list[int] = field(default_factory=list)
    max_sync_lag: int = 3
    leftovers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def goal_met(self) -> bool:
        return (
            self.fresh_s is not None
            and self.vllm_back_s is not None
            and self.fresh_s <= self.vllm_back_s + FRESH_GOAL_S
            and self.trainer_restarts == 0
            and not self.beyond_lag
        )


def profile(cell: str, ports: list[int], out: Path, cpu: bool, steps: int) -> dict[str, Any]:
    """The quickstart-gpu profile in the cell's mode and GPUs, long enough to outlast the
    measurement (the cell stops it)."""
    mode, gpus = CELLS[cell]
    body = profile_copy(mode, gpus["trainer"], ports, out, cpu=cpu)
    if not cpu:
        body["inference"]["gpus"] = gpus["inference"]
        if cell == "split":
            body["inference"]["weight_transfer"] = "nccl"
    body["trainer"] |= {"training_steps": steps, "checkpoint_interval": 20}
    body["run"]["name"] = f"faults-{cell}"
    return body


def state_changes(run_dir: Path, process: str) -> list[dict[str, Any]]:
    return [
        e
        for e in _lines(run_dir / "events.jsonl")
        if e.get("type") == "StateChanged" and e.get("process") == process
    ]


def trainer_records(run_dir: Path) -> list[dict[str, Any]]:
    return [
        r
        for r in _lines(run_dir / "metrics.jsonl")
        if r.get("process") == "trainer" and "loss" in r.get("data", {})
    ]


def leader_up(run_dir: Path, process: str) -> int | None:
    """The pid of ``process`` while it is ready, else None."""
    pid = None
    for event in state_changes(run_dir, process):
        pid = event.get("pid") if event["new"] == "ready" else None
    return pid


def measure(result: CellResult, run_dir: Path, killed: float) -> None:
    """Fill ``result`` from the run's files (called repeatedly while the cell runs)."""
    events = _lines(run_dir / "events.jsonl")
    restarts = [
        e
        for e in events
        if e.get("type") == "Restarting" and e.get("process") == "inference" and e["t"] >= killed
    ]
    result.seen_s = restarts[0]["t"] - killed if restarts else None
    back = [
        e["t"]
        for e in state_changes(run_dir, "inference")
        if e["new"] == "ready" and e["t"] > killed
    ]
    result.vllm_back_s = back[0] - killed if back else None
    result.trainer_restarts = sum(
        1 for e in state_changes(run_dir, "trainer") if e["new"] == "starting" and e["t"] > killed
    )
    result.failed_syncs = sum(
        1
        for e in events
        if e.get("type") == "Notice"
        and e["t"] > killed
        and "sync" in e.get("message", "")
        and e.get("level") in ("warning", "error")
    )
    after = [r for r in trainer_records(run_dir) if r["t"] > killed]
    result.steps_after_kill = len(after)
    result.beyond_lag = [
        int(r["step"])
        for r in after
        if r["step"] - r["data"].get("policy_version", r["step"]) > result.max_sync_lag
    ]
    fresh = [
        r
        for r in after
        if back and r["t"] > back[0] and r["data"].get("policy_version") == r["step"]
    ]
    if fresh:
        result.fresh_s, result.fresh_step = fresh[0]["t"] - killed, int(fresh[0]["step"])


def run_cell(cell: str, args: argparse.Namespace, save: Callable[[], None]) -> CellResult:
    """One cell: start, kill vLLM's API server at ``--kill-at``, measure, stop."""
    mode, _ = CELLS[cell]
    result = CellResult(cell, mode, max_sync_lag=0 if mode == "colocate" else 3)
    work = args.work / cell
    work.mkdir(parents=True, exist_ok=True)
    ports = free_ports(2, first=PORT_BASE + 10 * list(CELLS).index(cell))
    path = work / "profile.toml"
    path.write_text(tomli_w.dumps(profile(cell, ports, work / "runs", args.cpu, args.steps)))
    deadline = time.time() + args.budget
    with (work / "supervisor.jsonl").open("wb") as out, (work / "supervisor.err").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_tui", "run", str(path), "--json"],
            stdout=out,
            stderr=err,
            cwd=REPO,
            start_new_session=True,
            env=child_env(),
        )
    run_id, killed = "", None
    try:
        run_dir = None
        while proc.poll() is None and time.time() < deadline:
            run_id = run_id or run_id_of(psutil.Process(proc.pid))
            runs = sorted((work / "runs").glob("*/"))
            run_dir = runs[-1] if runs else None
            if run_dir is None:
                time.sleep(1.0)
                continue
            records = trainer_records(run_dir)
            if killed is None:
                pid = leader_up(run_dir, "inference")
                if records and records[-1]["step"] >= args.kill_at and pid:
                    os.kill(pid, signal.SIGKILL)
                    killed, result.killed_pid = time.time(), pid
                    result.killed_at_step = int(records[-1]["step"])
                    result.status = "killed; waiting for fresh weights"
                    save()
            else:
                measure(result, run_dir, killed)
                if result.fresh_s is not None and time.time() > killed + result.fresh_s + AFTER_S:
                    break  # training past the recovery: a late restart or lag is seen
            time.sleep(0.5)
        if run_dir is not None and killed is not None:
            measure(result, run_dir, killed)
        if killed is None:
            result.status = f"never reached step {args.kill_at} (exit {proc.poll()})"
        elif result.fresh_s is None:
            result.status = "no step on fresh weights before the deadline"
        else:
            result.status = "goal met" if result.goal_met else "recovered, goal missed"
        if proc.poll() is not None and killed is not None:
            result.notes.append(f"the run ended by itself (exit {proc.returncode})")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # ordered shutdown, then whatever is left
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                stop_group(proc)
        result.leftovers = sweep(run_id, wait=10.0)
        err_tail = tail(work / "supervisor.err", 5)
        if err_tail and result.status != "goal met":
            result.notes.append(err_tail[-800:])
    return result


def markdown(results: list[CellResult], info: dict[str, str]) -> str:
    lines = [
        "# vLLM's API server SIGKILLed mid-run (benchmarks/faults_gpu.py)",
        "",
        f"- {info.get('date')}; {info.get('device')}; torch {info.get('torch')}, vLLM "
        f"{info.get('vllm')}; profiles/quickstart-gpu.toml",
        "- seconds from the kill: `seen` (the supervisor restarts inference), `vLLM back` "
        "(ready again), `fresh` (the first step whose own sync to the new server succeeded); "
        f"goal: fresh <= vLLM back + {FRESH_GOAL_S:g} s, no trainer restart, no step beyond "
        "the max lag (step - policy_version > max_sync_lag)",
        "",
        "| layout | mode | status | killed at step | seen | vLLM back | fresh (step) "
        "| trainer restarts | failed syncs | steps after | beyond max lag | left behind |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    for r in results:
        fresh = f"{s(r.fresh_s)} ({r.fresh_step})" if r.fresh_s is not None else "-"
        lines.append(
            f"| {r.cell} | {r.mode} | {r.status} | {r.killed_at_step} | {s(r.seen_s)} | "
            f"{s(r.vllm_back_s)} | {fresh} | {r.trainer_restarts} | {r.failed_syncs} | "
            f"{r.steps_after_kill} | {len(r.beyond_lag)} {r.beyond_lag[:8]} | "
            f"{len(r.leftovers)} |"
        )
    notes = [f"- {r.cell}: {note}" for r in results for note in r.notes]
    return "\n".join(lines + (["", *notes] if notes else [])) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/faults_gpu"))
    parser.add_argument("--cells", nargs="+", default=list(DEFAULT_CELLS), choices=list(CELLS))
    parser.add_argument("--kill-at", type=int, default=10, help="trainer step of the kill")
    parser.add_argument("--steps", type=int, default=400, help="training_steps (outlasts it)")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds per cell")
    parser.add_argument("--cpu", action="store_true", help="built-in server on CPU (plumbing)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    info = facts(args)
    results: list[CellResult] = []

    def save() -> None:
        (args.out / "faults_gpu.json").write_text(
            json.dumps({"facts": info, "cells": [asdict(r) for r in results]}, indent=1)
        )
        (args.out / "faults_gpu.md").write_text(markdown(results, info))

    for phase in PHASES:
        cells = [c for c in phase if c in args.cells]
        if not cells:
            continue
        print(f"faults_gpu: {', '.join(cells)} from {time.strftime('%H:%M:%S')}", flush=True)
        with ThreadPoolExecutor(len(cells)) as pool:
            for result in pool.map(lambda c: run_cell(c, args, save), cells):
                results.append(result)
                save()
                print(f"faults_gpu: {result.cell}: {result.status}", flush=True)
    print(markdown(results, info))
    return 0 if results and all(r.goal_met for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
