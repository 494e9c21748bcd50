"""An inference restart by key, in each weight-sync mode: how soon are fresh weights served?

Issue 35's number: within 10 s of the restart being asked on CPU, within vLLM's start + 5 s
on a GPU. Per mode, one run of ``--profile`` through ``grpo-tui run`` (the CPU quickstart by
default: the built-in server; ``profiles/quickstart-gpu.toml``: vLLM on one GPU). Once the
trainer reached step ``--first``, and every ``--every`` steps after, ``--restarts`` times,
the benchmark asks the supervisor on the run's control socket to restart inference (what
the dashboard's ``i`` key does: a ``restart`` request, no arguments). From the run's files,
per restart, seconds from the request (the supervisor's ``RequestReceived``):

- ``stopped``: the old server is down;
- ``ready``: the new one passed its readiness probe (``stopped -> ready`` is the server's
  start: vLLM's start on a GPU);
- ``served``: the trainer re-attached and reported its weights served to the new
  incarnation (its notice): the rollout API's hold on the environments ends, fresh
  weights are served. The goal: ``served <= 10 s`` on CPU, ``served - ready <= 5 s`` on a
  GPU;
- ``lag-0 back``: the end of the first trainer step after ``served`` with lag-0 groups,
  and the largest lag-0 logprob difference (``alignment/diff_abs_mean_lag0``) of the steps
  from then to the next restart: float level (``--atol``: 1e-4 in float32, 3e-2 in bf16)
  is the proof that they were served exactly the trained weights.

Also per mode: trainer restarts (goal 0) and processes that gave up (goal none).
``--standby`` / ``--no-standby`` set ``[process.inference] standby`` (a next incarnation of
inference spawned ahead, its imports done, waiting at its start gate; the plan's default
is on for vLLM and the restart modes only). Printed
side by side (median / max over the restarts); ``--out`` gets ``inference_restart.md`` and
``inference_restart.json`` after every mode, so a run cut short keeps what it measured.

    python benchmarks/inference_restart.py --out benchmarks/results            # CPU, 5 modes

On a GPU, one device call (vLLM's parts carried as for the other device scripts,
docs/gpu.md; ~90 s a mode):

    run(command="source benchmarks/gpu_setup.sh && python3 benchmarks/inference_restart.py "
        "--profile profiles/quickstart-gpu.toml --restarts 2 --budget 480 --out $OUT",
        carry=[".whl"], kind="nvidia-h200", timeout_s=600)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import tomli_w

from grpo_trainer.control import SOCKET_ENV, ControlError, SupervisorLink

REPO = Path(__file__).resolve().parents[1]
MODES = ("none", "shared_vllm", "colocate", "lora_only", "lora_restart")
SERVED = "weight path re-established"
"""The trainer's notice once its weights are served to a new incarnation
(``train/weight_path.py``)."""
CPU_GOAL_S = 10.0
GPU_GOAL_AFTER_READY_S = 5.0


@dataclass
class Restart:
    """One restart asked, in seconds from the request (None: not seen)."""

    step: int
    stopped: float | None = None
    ready: float | None = None
    served: float | None = None
    lag0_back: float | None = None
    lag0_max: float | None = None


@dataclass
class ModeResult:
    mode: str
    status: str = "not run"
    restarts: list[Restart] = field(default_factory=list)
    trainer_restarts: int = 0
    gave_up: list[str] = field(default_factory=list)
    run_dir: str = ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def profile_copy(args: argparse.Namespace, mode: str, work: Path) -> Path:
    """``--profile`` with free ports, ``work`` as output, enough steps for the restarts and
    a checkpoint every ``--every`` steps (restarts find checkpoints older than the trained
    weights, as in a real run)."""
    profile = tomllib.loads(Path(args.profile).read_text())
    steps = args.first + args.every * args.restarts + args.every
    profile["run"].update(mode=mode, output_dir=str(work))
    profile["api"]["port"] = free_port()
    profile["inference"]["port"] = free_port()
    profile["trainer"].update(training_steps=steps, checkpoint_interval=args.every)
    if args.standby is not None:
        profile.setdefault("process", {}).setdefault("inference", {})["standby"] = args.standby
    path = work / f"{mode}.toml"
    path.write_text(tomli_w.dumps(profile))
    return path


def records(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of ``path``."""
    found = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                found.append(json.loads(line))
    return found


def trainer_steps(run_dir: Path) -> list[dict[str, Any]]:
    return [
        r
        for r in records(run_dir / "metrics.jsonl")
        if r.get("process") == "trainer" and "loss" in r.get("data", {})
    ]


def wait_for(condition: Any, deadline: float, what: str, proc: subprocess.Popen[bytes]) -> Any:
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc.poll() is not None:
            raise RuntimeError(f"the run exited ({proc.returncode}) waiting for {what}")
        time.sleep(0.1)
    raise TimeoutError(f"waiting for {what}")


def control_socket(run_dir: Path) -> str | None:
    """The run's control socket, from its trainer's environment (``GRPO_TUI_SOCKET``)."""
    spawned = [
        e["pid"]
        for e in records(run_dir / "events.jsonl")
        if e.get("type") == "StateChanged" and e.get("process") == "trainer" and e.get("pid")
    ]
    for pid in reversed(spawned):
        with contextlib.suppress(psutil.Error):
            return psutil.Process(pid).environ().get(SOCKET_ENV)
    return None


def run_mode(args: argparse.Namespace, mode: str, deadline: float) -> ModeResult:
    """One run in ``mode`` with its restarts; never raises (the status says what failed)."""
    result = ModeResult(mode)
    work = Path(args.work) / mode
    work.mkdir(parents=True, exist_ok=True)
    profile = profile_copy(args, mode, work)
    log = (work / "console.log").open("ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_tui", "run", str(profile)],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True,
    )  # fmt: skip
    link = None
    try:
        run_dir = wait_for(
            lambda: next((p for p in work.iterdir() if p.is_dir()), None), deadline, "run", proc
        )
        result.run_dir = str(run_dir)

        def step() -> int:
            steps = trainer_steps(run_dir)
            return int(steps[-1]["step"]) if steps else 0

        path = wait_for(lambda: control_socket(run_dir), deadline, "the trainer", proc)
        link = SupervisorLink(path, process="benchmark")
        for n in range(args.restarts):
            target = args.first + n * args.every
            wait_for(lambda t=target: step() >= t, deadline, f"step {target}", proc)
            print(f"{mode}: restarting inference after step {step()}", flush=True)
            link.request(
                "restart", process="inference", timeout=max(deadline - time.monotonic(), 1)
            )
        last = args.first + args.restarts * args.every
        wait_for(lambda: step() >= last, deadline, f"step {last}", proc)
        result.status = "ok"
    except (RuntimeError, TimeoutError, ControlError) as error:
        result.status = f"{type(error).__name__}: {error}"
    finally:
        if link is not None:
            link.close()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    if result.run_dir:
        measure(Path(result.run_dir), result)
    return result


def measure(run_dir: Path, result: ModeResult) -> None:
    """Fill ``result`` from the run's ``events.jsonl`` and ``metrics.jsonl``."""
    events = records(run_dir / "events.jsonl")
    steps = trainer_steps(run_dir)
    asked = [
        e["t"]
        for e in events
        if e["type"] == "RequestReceived"
        and e.get("process") == "benchmark"
        and e.get("action") == "restart"
    ]
    spawns = [
        e for e in events
        if e["type"] == "StateChanged" and e["process"] == "trainer" and e["new"] == "starting"
    ]  # fmt: skip
    result.trainer_restarts = max(len(spawns) - 1, 0)
    result.gave_up = [
        e["process"] for e in events if e["type"] == "StateChanged" and e["new"] == "failed"
    ]
    for n, t0 in enumerate(asked):
        until = asked[n + 1] if n + 1 < len(asked) else float("inf")

        def first(match: Any, since: float = t0, limit: float = until) -> float | None:
            times = [e["t"] for e in events if since <= e["t"] < limit and match(e)]
            return min(times) - since if times else None

        before = [s for s in steps if s["t"] < t0]
        row = Restart(step=int(before[-1]["step"]) if before else 0)
        row.stopped = first(lambda e: _inference(e, "stopped"))
        row.ready = first(lambda e: _inference(e, "ready"))
        row.served = first(lambda e: e["type"] == "Notice" and SERVED in e.get("message", ""))
        if row.served is not None:
            after = [
                s for s in steps
                if t0 + row.served <= s["t"] < until
                and "alignment/diff_abs_mean_lag0" in s["data"]
            ]  # fmt: skip
            if after:
                row.lag0_back = after[0]["t"] - t0
                row.lag0_max = max(s["data"]["alignment/diff_abs_mean_lag0"] for s in after)
        result.restarts.append(row)


def _inference(event: dict[str, Any], state: str) -> bool:
    return (
        event["type"] == "StateChanged"
        and event["process"] == "inference"
        and event["new"] == state
    )


def gap(start: float | None, end: float | None) -> float | None:
    """``end - start`` where both were seen."""
    return None if start is None or end is None else end - start


def cell(values: list[float | None], digits: int = 1) -> str:
    seen = [v for v in values if v is not None]
    if not seen:
        return "-"
    missing = f" ({len(values) - len(seen)} unseen)" if len(seen) < len(values) else ""
    return f"{statistics.median(seen):.{digits}f} / {max(seen):.{digits}f}{missing}"


def table(results: list[ModeResult], args: argparse.Namespace, gpu: bool) -> str:
    goal = (
        f"asked -> served - stopped -> ready <= {GPU_GOAL_AFTER_READY_S:g} s"
        if gpu
        else f"asked -> served <= {CPU_GOAL_S:g} s"
    )
    lines = [
        f"Inference restarted by key (the control socket's `restart`), {args.restarts} times "
        f"a run, every {args.every} steps from step {args.first}; median / max seconds from "
        f"the request. Goal: {goal}; lag-0 difference below {args.atol:g}.",
        "",
        "| | " + " | ".join(r.mode for r in results) + " |",
        "|---|" + "---|" * len(results),
    ]
    rows = [
        ("restarts measured", lambda r: str(len(r.restarts))),
        ("asked -> old stopped", lambda r: cell([x.stopped for x in r.restarts])),
        ("asked -> new ready", lambda r: cell([x.ready for x in r.restarts])),
        (
            "stopped -> ready (server start)",
            lambda r: cell([gap(x.stopped, x.ready) for x in r.restarts]),
        ),
        ("**asked -> fresh weights served**", lambda r: cell([x.served for x in r.restarts])),
        ("served - ready", lambda r: cell([gap(x.ready, x.served) for x in r.restarts])),
        ("asked -> first lag-0 step after", lambda r: cell([x.lag0_back for x in r.restarts])),
        (
            "largest lag-0 difference after",
            lambda r: (
                cell([x.lag0_max for x in r.restarts], digits=7)
                if any(x.lag0_max is not None for x in r.restarts)
                else "-"
            ),
        ),
        ("goal met", lambda r: _goal(r, args.atol, gpu)),
        ("trainer restarts", lambda r: str(r.trainer_restarts)),
        ("gave up", lambda r: ", ".join(r.gave_up) or "none"),
        ("status", lambda r: r.status),
    ]
    for name, value in rows:
        lines.append(f"| {name} | " + " | ".join(value(r) for r in results) + " |")
    return "\n".join(lines) + "\n"


def _goal(result: ModeResult, atol: float, gpu: bool) -> str:
    if not result.restarts:
        return "-"
    met = 0
    for x in result.restarts:
        if x.served is None or x.lag0_max is None or x.lag0_max >= atol:
            continue
        if gpu:
            met += x.ready is not None and x.served - x.ready <= GPU_GOAL_AFTER_READY_S
        else:
            met += x.served <= CPU_GOAL_S
    return f"{met} of {len(result.restarts)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=str(REPO / "profiles" / "quickstart.toml"))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--first", type=int, default=4)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--atol", type=float, default=None, help="lag-0 float level")
    parser.add_argument(
        "--standby",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="[process.inference] standby (default: the plan's; on for vLLM and the restart "
        "modes): a next incarnation of inference, imports done, waiting at its start gate",
    )
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds for all modes")
    parser.add_argument("--work", default="/tmp/inference_restart")
    parser.add_argument("--out", default=None, help="folder for the .md and .json")
    args = parser.parse_args(argv)
    profile = tomllib.loads(Path(args.profile).read_text())
    gpu = profile.get("inference", {}).get("backend") == "vllm"
    if args.atol is None:
        args.atol = 1e-4 if profile.get("inference", {}).get("dtype") == "float32" else 3e-2
    started = time.monotonic()
    results: list[ModeResult] = []
    header = (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, profile {args.profile}"
        f"{'' if args.standby is None else f', inference standby {args.standby}'}\n\n"
    )
    for n, mode in enumerate(args.modes):
        left = args.budget - (time.monotonic() - started)
        share = left / (len(args.modes) - n)
        results.append(run_mode(args, mode, time.monotonic() + share))
        text = header + table(results, args, gpu)
        print(text, flush=True)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "inference_restart.md").write_text(text)
            data = [asdict(r) for r in results]
            (out / "inference_restart.json").write_text(json.dumps(data, indent=1))
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
