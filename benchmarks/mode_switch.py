"""Mode switches, syncs and inference restarts of the inference lifecycle (issues 26, 27).

    python benchmarks/mode_switch.py [--profile profiles/quickstart.toml] [--switches 8]
        [--steps-between 2] [--lanes "in place" "trainer restart" "both restart"
        "none restart" reattach] [--out FILE]

One run of ``--profile`` (default the CPU quickstart; ``profiles/quickstart-gpu.toml`` for
vLLM on a GPU) under the real Supervisor and GRPO stack per lane, each lane in its own
interpreter:

- **in place**: the switches ``shared_vllm -> colocate -> none -> lora_only -> ...`` as the
  plan answers them (inference keeps serving, the trainer switches in its own process at a
  step boundary), ``--steps-between`` trainer steps apart;
- **trainer restart**: the same switches with the trainer restarting into each mode
  (inference kept: what a multi-rank trainer does);
- **both restart**: the same switches as before issue 26 (inference restarts, then the
  trainer);
- **none restart**: ``none`` with ``none_reload = "restart"``: its sync restarts inference;
- **reattach**: inference SIGKILLed (by pid: the run's own child) mid-run in
  ``--reattach-mode`` (``shared_vllm`` by default);
  the seconds from the kill to inference ready again, to the trainer's re-attach, and to
  its next step, and whether the trainer kept its pid.

Printed side by side: each switch's seconds from the request to the mode being active (the
stack's ``switch_mode`` returning), the pids each role had, each mode's sync (the trainer's
``sync_time``), the re-attach timeline, and the trainer's import time (what a restarted
trainer pays first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

from grpo_tui.headless import write_run_dir
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import Plan, SwitchPlan, build_plan
from grpo_tui.stack.modes import SwitchPlanner
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.supervisor import RunOutcome, Supervisor

REPO = Path(__file__).resolve().parents[1]
CYCLE = ("shared_vllm", "colocate", "none", "lora_only")
START = "lora_only"
SWITCHING = ("in place", "trainer restart", "both restart")
LANES = (*SWITCHING, "none restart", "reattach")
REATTACHED = "weight path re-established"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def profile(source: Path, root: Path, mode: str, extra: dict[str, object]) -> Path:
    """``source`` in ``mode`` with free ports, its output under ``root`` and ``extra`` in
    ``[inference]`` (``none_reload`` for the restarting ``none``); vLLM through this
    interpreter when its CLI is not on PATH."""
    text = tomllib.loads(source.read_text())
    text["run"].update(mode=mode, output_dir=str(root / "runs"))
    text["api"]["port"] = free_port()
    text["inference"].update(port=free_port(), **extra)
    if text["inference"].get("backend") == "vllm" and shutil.which("vllm") is None:
        text["inference"]["vllm_executable"] = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    text["trainer"].update(training_steps=10_000, checkpoint_interval=10_000)
    path = root / source.name
    path.write_text(tomli_w.dumps(text))
    return path


def planner_for(lane: str, plan: Plan) -> SwitchPlanner | None:
    if lane == "in place":
        return plan.mode_switch
    if lane == "trainer restart":
        return lambda mode: SwitchPlan(inference=None, trainer="measured: trainer restart")
    return None


class Run:
    """One supervised run of a profile in this process's event loop."""

    def __init__(self, path: Path, lane: str) -> None:
        self.plan = build_plan(load_profile(path))
        write_run_dir(self.plan)
        plan = self.plan
        self.supervisor = Supervisor(
            plan.specs, plan.run_dir, exit_with=plan.exit_with, respec=plan.respec
        )
        self.stack = GrpoStack(self.supervisor, planner=planner_for(lane, plan))
        self.task: asyncio.Task[RunOutcome] = asyncio.create_task(self.stack.run())

    def step(self) -> int:
        series = self.supervisor.metrics.series("loss")
        return int(series[-1][1] or 0) if series else 0

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        async with asyncio.timeout(900):
            while not condition():
                if self.task.done():
                    raise RuntimeError(f"the run ended while waiting for {what}: {self.task}")
                await asyncio.sleep(0.05)

    async def steps(self, count: int) -> None:
        reached = self.step() + count
        await self.until(lambda: self.step() >= reached, f"step {reached}")

    async def close(self) -> None:
        await self.supervisor.shutdown("benchmark done")
        with contextlib.suppress(Exception):
            await self.task


def records(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of ``path`` (none before the run wrote it)."""
    if not path.is_file():
        return []
    found = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            found.append(json.loads(line))
    return found


def pids(run_dir: Path) -> dict[str, int]:
    """How many processes each of trainer and inference had over the run."""
    found: dict[str, int] = {"trainer": 0, "inference": 0}
    for event in records(run_dir / "events.jsonl"):
        starting = event.get("type") == "StateChanged" and event.get("new") == "starting"
        if starting and event["process"] in found and event.get("pid"):
            found[event["process"]] += 1
    return found


def sync_times(run_dir: Path, start: str) -> dict[str, list[float]]:
    """``sync_time`` per mode; each step's mode is the last one the stack said was active
    before the step's record."""
    changes = [
        (float(e["t"]), e["message"].split()[1])
        for e in records(run_dir / "events.jsonl")
        if e.get("type") == "Notice"
        and e.get("message", "").startswith("mode ")
        and "active" in e["message"]
    ]
    times: dict[str, list[float]] = {}
    for record in records(run_dir / "metrics.jsonl"):
        data = record.get("data") or {}
        if record.get("process") != "trainer" or "sync_time" not in data:
            continue
        mode = start
        for t, changed in changes:
            if float(record["t"]) > t:
                mode = changed
        times.setdefault(mode, []).append(float(data["sync_time"]))
    return times


async def switching(source: Path, lane: str, args: argparse.Namespace, root: Path) -> dict:
    run = Run(profile(source, root, START, {}), lane)
    switches: list[tuple[str, str, float]] = []
    try:
        current = START
        for index in range(args.switches):
            target = CYCLE[index % len(CYCLE)]
            await run.steps(args.steps_between)
            started = time.perf_counter()
            await run.stack.switch_mode(target)
            switches.append((current, target, time.perf_counter() - started))
            print(f"{lane}: {current} -> {target} {switches[-1][2]:.2f} s", file=sys.stderr)
            current = target
        await run.steps(args.steps_between)
    finally:
        await run.close()
    run_dir = run.plan.run_dir
    return {"switches": switches, "pids": pids(run_dir), "syncs": sync_times(run_dir, START)}


async def none_restarting(source: Path, args: argparse.Namespace, root: Path) -> dict:
    """``sync_time`` of ``none`` restarting inference at each sync (the old behaviour)."""
    run = Run(profile(source, root, "none", {"none_reload": "restart"}), "none restart")
    run_dir = run.plan.run_dir
    try:
        await run.until(
            lambda: len(sync_times(run_dir, "none").get("none", [])) >= args.none_restarts,
            f"{args.none_restarts} restarting syncs",
        )
    finally:
        await run.close()
    return {"syncs": sync_times(run_dir, "none")}


async def reattach(source: Path, args: argparse.Namespace, root: Path) -> dict:
    """Inference SIGKILLed in ``--reattach-mode``: kill -> ready -> re-attached -> next step."""
    run = Run(profile(source, root, args.reattach_mode, {}), "reattach")
    run_dir = run.plan.run_dir
    try:
        await run.steps(args.steps_between)
        victim = run.supervisor.status()["inference"].pid
        assert victim is not None
        killed_at, step = time.time(), run.step()
        os.kill(victim, signal.SIGKILL)
        await run.until(lambda: run.step() > step + 1, "a step after the re-attach")
    finally:
        await run.close()
    events = records(run_dir / "events.jsonl")
    ready = min(
        float(e["t"])
        for e in events
        if e.get("type") == "StateChanged"
        and e["process"] == "inference"
        and e["new"] == "ready"
        and float(e["t"]) > killed_at
    )
    attached = min(
        float(e["t"])
        for e in events
        if e.get("type") == "Notice" and REATTACHED in e.get("message", "")
    )
    stepped = min(
        float(r["t"])
        for r in records(run_dir / "metrics.jsonl")
        if r.get("process") == "trainer" and (r.get("step") or 0) > step and r["t"] > attached
    )
    return {
        "mode": args.reattach_mode,
        "to_ready": ready - killed_at,
        "to_reattached": attached - killed_at,
        "to_next_step": stepped - killed_at,
        "trainer_kept": pids(run_dir)["trainer"] == 1,
    }


async def one_lane(lane: str, args: argparse.Namespace) -> dict:
    """One lane in this process (each lane runs in a fresh interpreter, as runs do)."""
    source = args.profile.resolve()
    with tempfile.TemporaryDirectory(prefix="mode-switch-") as root:
        if lane == "none restart":
            return await none_restarting(source, args, Path(root))
        if lane == "reattach":
            return await reattach(source, args, Path(root))
        return await switching(source, lane, args, Path(root))


def import_seconds() -> float:
    """What a restarted trainer pays first: importing torch, transformers and the loop."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import grpo_trainer.train.session"], check=True)
    return time.perf_counter() - started


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms" if values else "-"


def report(answers: dict[str, dict], imports: float) -> str:
    lines: list[str] = []
    ways = [lane for lane in SWITCHING if lane in answers]
    if ways:
        lines += ["| switch | " + " | ".join(ways) + " |", "|---|" + "---|" * len(ways)]
        for index, (old, new, _) in enumerate(answers[ways[0]]["switches"]):
            cells = [f"{answers[way]['switches'][index][2]:.2f} s" for way in ways]
            lines.append(f"| {old} -> {new} | " + " | ".join(cells) + " |")
        medians = [statistics.median(s for *_, s in answers[way]["switches"]) for way in ways]
        lines.append("| median | " + " | ".join(f"**{m:.2f} s**" for m in medians) + " |")
        counts = [answers[way]["pids"] for way in ways]
        cells = [f"trainer {c['trainer']}, inference {c['inference']}" for c in counts]
        lines.append("| pids over the run | " + " | ".join(cells) + " |")
        lines += ["", f"| mode | sync median ({ways[0]} run) | syncs |", "|---|---|---|"]
        for mode, values in sorted(answers[ways[0]]["syncs"].items()):
            lines.append(f"| {mode} | {ms(values)} | {len(values)} |")
    if "none restart" in answers:
        values = answers["none restart"]["syncs"].get("none", [])
        lines.append(f"| none (none_reload = restart) | {ms(values)} | {len(values)} |")
    if "reattach" in answers:
        seen = answers["reattach"]
        lines += [
            "",
            f"| inference SIGKILLed in {seen['mode']} | seconds from the kill |",
            "|---|---|",
            f"| inference ready again | {seen['to_ready']:.1f} s |",
            f"| trainer re-attached, weights pushed | {seen['to_reattached']:.1f} s |",
            f"| trainer's next step | {seen['to_next_step']:.1f} s |",
            f"| trainer kept its process | {seen['trainer_kept']} |",
        ]
    lines.append(f"\nTrainer imports (a restarted trainer pays them first): {imports:.1f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, default=REPO / "profiles" / "quickstart.toml")
    parser.add_argument("--switches", type=int, default=8)
    parser.add_argument("--steps-between", type=int, default=2)
    parser.add_argument("--none-restarts", type=int, default=3, help="restarting none syncs")
    parser.add_argument("--lanes", nargs="+", choices=LANES, default=list(LANES))
    parser.add_argument("--reattach-mode", default="shared_vllm", help="the reattach lane's mode")
    parser.add_argument("--out", type=Path, default=None, help="write the tables here too")
    parser.add_argument("--lane", choices=LANES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lane is not None:
        print(json.dumps(asyncio.run(one_lane(args.lane, args))), flush=True)
        return
    answers = {}
    for lane in args.lanes:
        command = [sys.executable, __file__, "--lane", lane, "--profile", str(args.profile),
                   "--switches", str(args.switches), "--steps-between", str(args.steps_between),
                   "--none-restarts", str(args.none_restarts),
                   "--reattach-mode", args.reattach_mode]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.stderr.write(done.stderr[-3000:])
            done.check_returncode()
        answers[lane] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{lane}: done", flush=True)
    text = report(answers, import_seconds())
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
