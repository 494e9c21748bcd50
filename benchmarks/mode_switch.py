"""Mode switches and syncs of the inference lifecycle, on the CPU quickstart (issue 26).

    python benchmarks/mode_switch.py [--switches 8] [--steps-between 2] [--out FILE]

One run of ``profiles/quickstart.toml`` (tiny model, built-in server, CPU) under the real
Supervisor and GRPO stack, per way of switching, each cycling through the switches
``shared_vllm -> colocate -> none -> lora_only -> shared_vllm ...``, ``--steps-between``
trainer steps apart:

- **in place**: the plan's answer (inference keeps serving, the trainer switches in its own
  process at a step boundary);
- **trainer restart**: inference keeps serving, the trainer checkpoints, exits and resumes
  in the new mode (what a multi-rank trainer does);
- **both restart**: the switch before issue 26 (inference restarts, then the trainer).

Printed side by side: each switch's seconds from the request to the mode being active (the
stack's ``switch_mode`` returning), the pids kept, and each mode's sync seconds (the
trainer's ``sync_time``: ``none`` reloading in place vs restarting inference), and the
trainer's import time, which a trainer restart pays before anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from grpo_tui.headless import write_run_dir
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import Plan, build_plan
from grpo_tui.stack.modes import SwitchPlan, SwitchPlanner
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[1]
CYCLE = ("shared_vllm", "colocate", "none", "lora_only")
START = "lora_only"
WAYS = ("in place", "trainer restart", "both restart")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def profile(root: Path, mode: str, extra: dict[str, object]) -> Path:
    """The quickstart in ``mode`` with free ports, its output under ``root`` and ``extra``
    in ``[inference]`` (``none_reload`` for the restarting ``none``)."""
    text = tomllib.loads((REPO / "profiles" / "quickstart.toml").read_text())
    text["run"].update(mode=mode, output_dir=str(root / "runs"))
    text["api"]["port"] = free_port()
    text["inference"].update(port=free_port(), **extra)
    text["trainer"].update(training_steps=10_000, checkpoint_interval=10_000)
    path = root / "quickstart.toml"
    path.write_text(tomli_w.dumps(text))
    return path


@dataclass
class Lane:
    way: str
    switches: list[tuple[str, str, float]] = field(default_factory=list)
    """(from, to, seconds) per switch."""
    pids: dict[str, int] = field(default_factory=dict)
    """How many pids each role had over the run."""
    syncs: dict[str, list[float]] = field(default_factory=dict)


def planner_for(way: str, plan: Plan) -> SwitchPlanner | None:
    if way == "in place":
        return plan.mode_switch
    if way == "trainer restart":
        return lambda mode: SwitchPlan(inference=None, trainer="measured: trainer restart")
    return None


async def run_lane(way: str, switches: int, steps_between: int, root: Path) -> Lane:
    plan = build_plan(load_profile(profile(root, START, {})))
    write_run_dir(plan)
    supervisor = Supervisor(plan.specs, plan.run_dir, exit_with=plan.exit_with, respec=plan.respec)
    stack = GrpoStack(supervisor, planner=planner_for(way, plan))
    task = asyncio.create_task(stack.run())
    lane = Lane(way)

    def step() -> int:
        series = supervisor.metrics.series("loss")
        return int(series[-1][1] or 0) if series else 0

    async def until(condition: Callable[[], bool], what: str) -> None:
        async with asyncio.timeout(600):
            while not condition():
                if task.done():
                    raise RuntimeError(f"the run ended while waiting for {what}: {task}")
                await asyncio.sleep(0.05)

    try:
        current = START
        for index in range(switches):
            target = CYCLE[index % len(CYCLE)]
            reached = step() + steps_between
            await until(lambda r=reached: step() >= r, f"step {reached}")
            started = time.perf_counter()
            await stack.switch_mode(target)
            lane.switches.append((current, target, time.perf_counter() - started))
            seconds = lane.switches[-1][2]
            print(f"{way}: {current} -> {target} {seconds:.2f} s", file=sys.stderr, flush=True)
            current = target
        reached = step() + steps_between
        await until(lambda r=reached: step() >= r, f"step {reached}")
    finally:
        await supervisor.shutdown("benchmark done")
        with contextlib.suppress(Exception):
            await task
    lane.pids = {
        name: len(pids) for name, pids in spawned(plan.run_dir, ("trainer", "inference")).items()
    }
    lane.syncs = sync_times(plan.run_dir, START)
    return lane


def records(path: Path) -> list[dict[str, object]]:
    """The complete JSON lines of ``path`` (none before the run wrote it)."""
    if not path.is_file():
        return []
    found = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            found.append(json.loads(line))
    return found


def spawned(run_dir: Path, names: tuple[str, ...]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {name: [] for name in names}
    for event in records(run_dir / "events.jsonl"):
        starting = event.get("type") == "StateChanged" and event.get("new") == "starting"
        if starting and event["process"] in found and event.get("pid"):
            found[event["process"]].append(event["pid"])
    return found


def sync_times(run_dir: Path, start: str) -> dict[str, list[float]]:
    """``sync_time`` per mode, the mode read from the trainer's in-place events and the
    spawns' command lines, in step order."""
    steps = {
        int(r["step"]): r["data"]
        for r in records(run_dir / "metrics.jsonl")
        if r.get("process") == "trainer" and r.get("step") is not None and "loss" in r["data"]
    }
    modes = mode_by_step(run_dir, start, max(steps, default=0))
    times: dict[str, list[float]] = {}
    for number, data in sorted(steps.items()):
        if "sync_time" in data:
            times.setdefault(modes[number], []).append(float(data["sync_time"]))
    return times


def mode_by_step(run_dir: Path, start: str, last: int) -> dict[int, str]:
    """The mode each step trained in, from the stack's ``mode X active ... after step N``."""
    changes: list[tuple[int, str]] = []
    for event in records(run_dir / "events.jsonl"):
        message = event.get("message", "") if event.get("type") == "Notice" else ""
        if message.startswith("mode ") and "active" in message:
            changes.append((event["t"], message.split()[1]))
    stamps = {}
    for record in records(run_dir / "metrics.jsonl"):
        if record.get("process") == "trainer" and record.get("step") is not None:
            stamps[int(record["step"])] = float(record["t"])
    modes = {}
    for number in range(1, last + 1):
        mode = start
        for t, changed in changes:
            if stamps.get(number, 0.0) > t:
                mode = changed
        modes[number] = mode
    return modes


def import_seconds() -> float:
    """What a restarted trainer pays first: importing torch, transformers and the loop."""
    code = "import grpo_trainer.train.session"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})
    return time.perf_counter() - started


def report(lanes: list[Lane], imports: float, none_restart: list[float]) -> str:
    lines = [
        "| switch | " + " | ".join(lane.way for lane in lanes) + " |",
        "|---|" + "---|" * len(lanes),
    ]
    for index, (old, new, _) in enumerate(lanes[0].switches):
        cells = [f"{lane.switches[index][2]:.2f} s" for lane in lanes]
        lines.append(f"| {old} -> {new} | " + " | ".join(cells) + " |")
    medians = [statistics.median(s for *_, s in lane.switches) for lane in lanes]
    lines.append("| median | " + " | ".join(f"**{m:.2f} s**" for m in medians) + " |")
    pids = [f"trainer {lane.pids['trainer']}, inference {lane.pids['inference']}" for lane in lanes]
    lines.append("| pids over the run | " + " | ".join(pids) + " |")
    lines += ["", "| mode | sync median (in-place run) | syncs |", "|---|---|---|"]
    for mode, values in sorted(lanes[0].syncs.items()):
        lines.append(f"| {mode} | {statistics.median(values) * 1000:.0f} ms | {len(values)} |")
    if none_restart:
        median = statistics.median(none_restart)
        lines.append(
            f"| none (none_reload = restart) | {median * 1000:.0f} ms | {len(none_restart)} |"
        )
    lines.append(f"\nTrainer imports (a restarted trainer pays them first): {imports:.1f} s")
    return "\n".join(lines)


async def none_restart_syncs(steps: int, root: Path) -> list[float]:
    """``sync_time`` of ``none`` restarting inference at each sync (the old behaviour)."""
    plan = build_plan(load_profile(profile(root, "none", {"none_reload": "restart"})))
    write_run_dir(plan)
    supervisor = Supervisor(plan.specs, plan.run_dir, exit_with=plan.exit_with, respec=plan.respec)
    task = asyncio.create_task(GrpoStack(supervisor).run())
    async with asyncio.timeout(900):
        while len(sync_times(plan.run_dir, "none").get("none", [])) < steps and not task.done():
            await asyncio.sleep(0.2)
    await supervisor.shutdown("benchmark done")
    with contextlib.suppress(Exception):
        await task
    return sync_times(plan.run_dir, "none").get("none", [])


async def one_lane(lane: str, args: argparse.Namespace) -> dict[str, object]:
    """One lane in this process (each lane runs in a fresh interpreter, as runs do)."""
    prefix = "none-restart-" if lane == "none restart" else "mode-switch-"
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        if lane == "none restart":
            return {"syncs": await none_restart_syncs(args.none_restarts, Path(root))}
        result = await run_lane(lane, args.switches, args.steps_between, Path(root))
        return {"switches": result.switches, "pids": result.pids, "syncs": result.syncs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--switches", type=int, default=8)
    parser.add_argument("--steps-between", type=int, default=2)
    parser.add_argument("--none-restarts", type=int, default=3, help="restarting none syncs")
    parser.add_argument("--out", type=Path, default=None, help="write the tables here too")
    parser.add_argument("--lane", choices=[*WAYS, "none restart"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lane is not None:
        print(json.dumps(asyncio.run(one_lane(args.lane, args))), flush=True)
        return
    answers = {}
    for lane in [*WAYS, "none restart"]:
        command = [sys.executable, __file__, "--lane", lane, "--switches", str(args.switches),
                   "--steps-between", str(args.steps_between),
                   "--none-restarts", str(args.none_restarts)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        sys.stderr.write(done.stderr[-2000:] if done.returncode else "")
        done.check_returncode()
        answers[lane] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{lane}: done", flush=True)
    lanes = [
        Lane(way, [tuple(s) for s in answers[way]["switches"]], answers[way]["pids"],
             answers[way]["syncs"])
        for way in WAYS
    ]  # fmt: skip
    text = report(lanes, import_seconds(), answers["none restart"]["syncs"])
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
