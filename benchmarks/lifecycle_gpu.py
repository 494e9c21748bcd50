"""Issue 26 in one device call: start-up by phase, each mode's time to a reward of 0.8, each
mode switch and one ``lora_restart`` restart, before and after, side by side.

Every cell is ``grpo-tui run`` on a copy of ``profiles/quickstart-gpu.toml``
(``quickstart_gpu.profile_copy``: mode, ports, GPUs and output changed) in one *arm*:

- ``after``: the profile and the code as they are (launcher that imports vLLM before the
  start gate, a standby for restarts, a forked engine core, vLLM's cache under the
  grpo-tui cache, the trainer loading beside inference, eager);
- ``graphs``: ``after`` with CUDA graphs (``enforce_eager = false``): eager vs graphs end
  to end;
- ``before``: the start before issue 26, by settings: vLLM's CLI as given
  (``vllm_preimport = false``), no standby, ``VLLM_WORKER_MULTIPROC_METHOD=spawn``, a
  vLLM cache root of the arm's own (fresh at the call's start, as vLLM's default is on a
  new machine), the trainer after inference's health, CUDA graphs; ``--before-set
  KEY=VALUE`` adds keys (e.g. the restart-based ``none`` and mode switch).

Each arm has its own ``GRPO_TUI_CACHE``, fresh at the call's start: its first cell shows
the first run after install, later ones a warm cache. Cells run in *lanes*, one per GPU
(``--lane GPUS=PHASES``): the phases of a lane one after another, the cells of a phase at
the same time (``colocate`` alone: vLLM's sleep asserts when another process allocates on
its GPU). A cell stops at the 5-step mean reward ``--target`` (``lora_restart``: after
``--restarts`` restarts, 2 by default: the first may come before the standby has finished
its imports, the second shows a standby ready; a switch cell: after its last switch), at
its cap or at the budget's end.
Switches go through the run's control socket (``switch_mode``), after ``HOP_STEPS``
steps in each mode.

From each run directory: the supervisor's ``events.jsonl`` (when inference and the
trainer became ready, inference's restarts), ``metrics.jsonl`` (steps, rewards, the
trainer's ``sync_time``), vLLM's log (phases: ``vllm_startup.PHASES``; the launcher's
import seconds). ``lifecycle_gpu.md`` and ``lifecycle_gpu.json`` are rewritten in
``--out`` after every cell, so a call cut short still returns what it measured.

    python benchmarks/lifecycle_gpu.py --out OUT                       # the device call
    python benchmarks/lifecycle_gpu.py --out OUT --cpu --lane "0=after/shared_vllm" ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import tomli_w
from gpu_modes import _lines, facts, free_ports, run_id_of, sweep
from gpu_workload import stop_group
from lifecycle_report import markdown
from quickstart_gpu import ModeRun, failure_tails, profile_copy, read
from vllm_startup import PHASES

from grpo_trainer.control import ControlError, SupervisorLink
from grpo_tui.supervisor.control import socket_path

REPO = Path(__file__).resolve().parents[1]
ARMS = ("after", "graphs", "before")
HOP_STEPS = 3
"""Steps a switch cell trains in each mode before the next switch."""
CAPS = {"after": 120.0, "graphs": 120.0, "before": 150.0}
SWITCH_CAPS = {"after": 200.0, "graphs": 200.0, "before": 280.0}
LANES = [
    "0=after/shared_vllm;after/shared_vllm,after/lora_only,after/none,after/lora_restart;"
    "after/colocate;after/switch:shared_vllm>lora_only>colocate>none>shared_vllm;"
    "graphs/shared_vllm;before/colocate",
    "1=before/shared_vllm;before/shared_vllm,before/lora_only,before/none,before/lora_restart,"
    "before/switch:shared_vllm>lora_only>none>shared_vllm",
]
"""The device call: ``after`` (and ``graphs``) on GPU 0, ``before`` on GPU 1; ``before``'s
colocate goes on GPU 0 once it is free, its switches skip colocate (they share GPU 1)."""
IMPORTED = re.compile(r"vllm_launch: vLLM imported in ([\d.]+) s")
CACHES_USED: set[str] = set()
"""Caches (``after``, shared with ``graphs``; ``before``) a cell has started on: the first
cell on each is ``cold`` (the first run after install), the later ones ``warm``."""
CACHES_LOCK = threading.Lock()


@dataclass
class Cell:
    """One run: its arm, mode (the first, for a switch cell) and what it measured."""

    arm: str
    mode: str
    gpus: list[int]
    hops: list[str] = field(default_factory=list)
    """A switch cell: the modes it switches to, in order."""
    cache: str = ""
    """``cold``: the arm's first start of inference in this call; ``warm`` after one."""
    status: str = "not run"
    reason: str = ""
    run: ModeRun = field(default_factory=lambda: ModeRun("", []))
    ready: dict[str, float] = field(default_factory=dict)
    """Seconds from the command to: inference started / ready, trainer ready."""
    import_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    restarts: list[float] = field(default_factory=list)
    """Inference restarts, supervisor's view: seconds from stopping to ready again."""
    switches: list[dict[str, Any]] = field(default_factory=list)
    steps_continuous: bool | None = None
    leftovers: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        kind = "switch" if self.hops else self.mode
        return f"{self.arm}/{kind}"


def parse_lane(text: str) -> tuple[list[int], list[list[Cell]]]:
    """``GPUS=PHASES``: GPUs ``0`` or ``0+1``; phases split by ``;``, cells by ``,``, each
    ``ARM/MODE`` or ``ARM/switch:M1>M2>...``."""
    gpus_text, _, phases_text = text.partition("=")
    gpus = [int(g) for g in gpus_text.split("+")]
    phases = []
    for phase in phases_text.split(";"):
        cells = []
        for item in phase.split(","):
            arm, _, what = item.strip().partition("/")
            if arm not in ARMS:
                raise ValueError(f"{item!r}: arm must be one of {ARMS}")
            kind, _, route = what.partition(":")
            modes = route.split(">") if kind == "switch" else [kind]
            cells.append(Cell(arm=arm, mode=modes[0], gpus=gpus, hops=modes[1:]))
        phases.append(cells)
    return gpus, phases


def arm_profile(cell: Cell, ports: list[int], out: Path, args: argparse.Namespace) -> dict:
    """The profile copy of ``cell``'s arm."""
    body = profile_copy(cell.mode, cell.gpus, ports, out, cpu=args.cpu)
    inference = body["inference"]
    if cell.arm != "after":
        inference["enforce_eager"] = False
    if cell.arm == "before":
        inference["vllm_preimport"] = False
        body["process"] = {
            "inference": {
                "standby": False,
                "env": {
                    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
                    "VLLM_CACHE_ROOT": str(args.work / "vllm-cache-before"),
                },
            },
            "trainer": {"depends_on": {"inference": "process_healthy"}},
        }
        for assignment in args.before_set:
            key, _, value = assignment.partition("=")
            *tables, last = key.split(".")
            target = body
            for table in tables:
                target = target.setdefault(table, {})
            try:  # a TOML value (true, 4, "x", [1, 2]); else the text as a string
                target[last] = tomllib.loads(f"v = {value}")["v"]
            except tomllib.TOMLDecodeError:
                target[last] = value
    return body


def run_cell(cell: Cell, index: int, deadline: float, args: argparse.Namespace) -> None:
    """Run one cell to its stop rule; fills ``cell`` from its run directory."""
    cap = args.cap or (SWITCH_CAPS if cell.hops else CAPS)[cell.arm]
    until = min(time.time() + cap, deadline)
    if until - time.time() < args.min_cell:
        cell.status = "skipped: budget spent"
        return
    slot = "before" if cell.arm == "before" else "after"
    with CACHES_LOCK:
        cell.cache = "warm" if slot in CACHES_USED else "cold"
        CACHES_USED.add(slot)
    where = args.work / f"{index:02d}-{cell.arm}-{'switch' if cell.hops else cell.mode}"
    where.mkdir(parents=True, exist_ok=True)
    ports = free_ports(2, first=20000 + 10 * index)
    (where / "profile.toml").write_text(
        tomli_w.dumps(arm_profile(cell, ports, where / "runs", args))
    )
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CACHE_ROOT"}
    env["GRPO_TUI_CACHE"] = str(args.work / f"cache-{slot}")
    cell.run = ModeRun(cell.mode, cell.gpus)
    began = time.time()
    with (
        (where / "supervisor.jsonl").open("wb") as out,
        (where / "supervisor.err").open("wb") as err,
    ):
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_tui", "run", str(where / "profile.toml"), "--json"],
            stdout=out, stderr=err, cwd=REPO, env=env, start_new_session=True,
        )  # fmt: skip
    supervisor, run_id = psutil.Process(proc.pid), ""
    hops = list(cell.hops)
    switcher: threading.Thread | None = None
    try:
        while proc.poll() is None and time.time() < until:
            run_id = run_id or run_id_of(supervisor)
            read(cell.run, where, began, args.target)
            if (
                switcher is None
                and hops
                and len(cell.run.rewards) >= HOP_STEPS * (len(cell.switches) + 1)
            ):
                socket = socket_path(sorted((where / "runs").glob("*/"))[-1], run_id)
                hop = (cell, socket, hops.pop(0), until)
                switcher = threading.Thread(target=switch, args=hop)
                switcher.start()
            elif switcher is not None and not switcher.is_alive():
                switcher = None
            if done(cell, args.restarts):
                break
            time.sleep(1.0)
    finally:
        stop_group(proc)
        cell.leftovers = sweep(run_id, wait=10.0)
        if switcher is not None:
            switcher.join(30)
    read(cell.run, where, began, args.target)
    cell.run.wall_s = time.time() - began
    measure(cell, where, began)
    cell.status = status(cell, proc.returncode)
    if not cell.run.rewards:
        cell.reason = failure_tails(where)


def done(cell: Cell, restarts: int) -> bool:
    """The cell's stop rule (see the module docstring)."""
    run = cell.run
    if cell.hops:
        switched = len(cell.switches) == len(cell.hops)
        return switched and len(run.rewards) >= HOP_STEPS * (len(cell.hops) + 1)
    if cell.mode == "lora_restart":
        return len(run.sync_times) >= restarts
    return run.target_step is not None


def status(cell: Cell, code: int | None) -> str:
    if cell.hops:
        return f"{len(cell.switches)} of {len(cell.hops)} switches"
    if cell.mode == "lora_restart" and cell.run.sync_times:
        return "restarted"
    if cell.run.target_step is not None:
        return "reached"
    return "not reached in the time given" if cell.run.rewards else f"failed (exit {code})"


def switch(cell: Cell, socket: Path, mode: str, until: float) -> None:
    """One ``switch_mode`` request through the run's control socket, timed."""
    before = len(cell.run.rewards)
    record: dict[str, Any] = {"from": cell.switches[-1]["to"] if cell.switches else cell.mode}
    record.update(to=mode, at_step=before)
    link = SupervisorLink(str(socket), process="lifecycle-bench")
    start = time.perf_counter()
    try:
        link.request("switch_mode", args={"mode": mode}, timeout=max(1.0, until - time.time()))
        record["seconds"] = round(time.perf_counter() - start, 2)
    except ControlError as error:
        record["error"] = str(error)[:300]
    finally:
        link.close()
    cell.switches.append(record)


def measure(cell: Cell, where: Path, began: float) -> None:
    """Start-up timeline, vLLM's phases and restarts from the run directory."""
    runs = sorted((where / "runs").glob("*/"))
    if not runs:
        return
    states = [e for e in _lines(runs[-1] / "events.jsonl") if e.get("type") == "StateChanged"]
    for process, new, key in (
        ("inference", "starting", "inference started"),
        ("inference", "ready", "inference ready"),
        ("trainer", "ready", "trainer ready"),
    ):
        hit = next((e for e in states if e["process"] == process and e["new"] == new), None)
        if hit is not None:
            cell.ready[key] = round(hit["t"] - began, 2)
    stopping, was_ready = None, False
    for event in (e for e in states if e["process"] == "inference"):
        if event["new"] == "stopping" and was_ready and stopping is None:
            stopping = event["t"]
        elif event["new"] == "ready":
            if stopping is not None:
                cell.restarts.append(round(event["t"] - stopping, 2))
            stopping, was_ready = None, True
    log = (runs[-1] / "logs" / "inference.log").read_text(errors="replace") if (
        runs[-1] / "logs" / "inference.log").is_file() else ""  # fmt: skip
    cell.phases = first_phases(log)
    if match := IMPORTED.search(log):
        cell.import_s = float(match.group(1))
    steps = sorted(
        r["step"] for r in _lines(runs[-1] / "metrics.jsonl")
        if r.get("type") == "metrics" and "reward/mean" in r.get("data", {})
    )  # fmt: skip
    cell.steps_continuous = steps == list(range(1, len(steps) + 1)) if steps else None


def first_phases(log: str) -> dict[str, float]:
    """vLLM's phases of its first start in ``log`` (``vllm_startup.PHASES``)."""
    found = {}
    for key, pattern in PHASES.items():
        if match := re.search(pattern, log):
            found[key] = float(match.group(1))
    return found


def run_lane(phases: list[list[Cell]], first: int, deadline: float, args: argparse.Namespace,
             save: Any) -> None:  # fmt: skip
    """The phases of one lane in order, the cells of a phase at once."""
    index = first
    for phase in phases:
        with ThreadPoolExecutor(len(phase)) as pool:
            jobs = []
            for cell in phase:
                jobs.append(pool.submit(run_cell, cell, index, deadline, args))
                index += 1
            for job in jobs:
                job.result()
        save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lane", action="append", help="GPUS=PHASES (default: the device's)")
    parser.add_argument("--budget", type=float, default=480.0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--cap", type=float, default=0.0, help="every cell's cap, seconds")
    parser.add_argument("--min-cell", type=float, default=45.0, help="least seconds to start")
    parser.add_argument("--restarts", type=int, default=2, help="lora_restart restarts to time")
    parser.add_argument("--before-set", action="append", default=[], help="KEY.PATH=VALUE")
    parser.add_argument("--cpu", action="store_true", help="built-in server on CPU (plumbing)")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.work = args.out / "work-lifecycle"
    args.work.mkdir(parents=True, exist_ok=True)
    lanes = [parse_lane(text) for text in (args.lane or LANES)]
    cells = [cell for _, phases in lanes for phase in phases for cell in phase]
    deadline = time.time() + args.budget
    info = facts(args)
    lock = threading.Lock()

    def save() -> None:
        with lock:
            raw = {"facts": info, "args": vars(args) | {"work": str(args.work), "out": str(
                args.out)}, "cells": [asdict(c) for c in cells]}  # fmt: skip
            (args.out / "lifecycle_gpu.json").write_text(json.dumps(raw, indent=1))
            (args.out / "lifecycle_gpu.md").write_text(markdown(cells, info, args))

    save()
    firsts = [0]
    for _, phases in lanes[:-1]:
        firsts.append(firsts[-1] + sum(len(p) for p in phases))
    with ThreadPoolExecutor(len(lanes)) as pool:
        jobs = [
            pool.submit(run_lane, phases, first, deadline, args, save)
            for (_, phases), first in zip(lanes, firsts, strict=True)
        ]
        for job in jobs:
            job.result()
    save()
    print((args.out / "lifecycle_gpu.md").read_text(), flush=True)
    return 0 if all(c.status in ("reached", "restarted") or c.hops for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
