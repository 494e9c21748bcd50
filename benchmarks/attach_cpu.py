"""A run attached to a kept built-in server against a cold run, side by side (issue 37).

    python benchmarks/attach_cpu.py [--passes 2] [--steps 5] [--mode shared_vllm]
        [--out benchmarks/results/attach_cpu.md]

The CPU quickstart (a copy with free ports, ``--steps`` steps), through the real commands:
``grpo-tui serve`` keeps its built-in server (started once, not timed), then each pass runs
the profile cold (``grpo-tui run``: its own server) and attached (``grpo-tui run
--inference-url``), in swapped order every other pass (cold, attached; attached, cold), so
that neither always runs on a warmer page cache or a quieter machine. Per run: seconds from
the command to the trainer's first step and to the run's end, the first steps' mean reward,
and the lag-0 logprob difference (sampler vs trainer on groups sampled at the weights being
trained) of the first step: an attached run starts from the base, whatever the run before
it trained, exactly as a cold one. Printed side by side, written to ``--out`` (markdown)
with the machine, its load, the date and the versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import tomli_w

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "profiles" / "quickstart.toml"
LEASE = "/grpo/lease"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def profile_copy(work: Path, name: str, mode: str, steps: int) -> tuple[Path, str]:
    """The quickstart with free ports, ``steps`` steps, runs under ``work``; the URL of
    the inference server it starts (its own, or the kept one for ``serve``)."""
    data = tomllib.loads(QUICKSTART.read_text())
    data["run"].update(mode=mode, output_dir=str(work / "runs"))
    data["api"]["port"] = free_port()
    data["inference"]["port"] = port = free_port()
    data["trainer"].update(training_steps=steps, checkpoint_interval=1000)
    path = work / f"{name}.toml"
    path.write_text(tomli_w.dumps(data))
    return path, f"http://127.0.0.1:{port}"


def grpo_tui(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "grpo_tui", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )


def wait_for_server(url: str, serving: subprocess.Popen[bytes], log: Path) -> float:
    began = time.monotonic()
    while True:
        if serving.poll() is not None:
            raise SystemExit(f"grpo-tui serve exited {serving.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}{LEASE}", timeout=2).status_code == 200:
                return time.monotonic() - began
        except httpx.HTTPError:
            pass
        time.sleep(0.25)


def trainer_records(run_dir: Path) -> list[dict[str, Any]]:
    """The trainer's step records in ``metrics.jsonl`` (none when the run wrote none)."""
    path = run_dir / "metrics.jsonl"
    records: list[dict[str, Any]] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("process") == "trainer" and "loss" in record.get("data", {}):
            records.append(record)
    return records


def one_run(profile: Path, work: Path, name: str, url: str | None) -> dict[str, Any]:
    """One ``grpo-tui run`` (attached to ``url`` if given), timed from the command."""
    run_dir = work / "runs" / name
    extra = ["--inference-url", url] if url else []
    began = time.time()
    run = grpo_tui("run", str(profile), "--run-dir", str(run_dir), *extra, log=work / f"{name}.log")
    code = run.wait()
    ended = time.time()
    records = trainer_records(run_dir)
    first = records[0] if records else None
    lag0 = first["data"].get("alignment/diff_abs_mean_lag0") if first else None
    return {
        "run": name,
        "attached": url is not None,
        "exit": code,
        "first_step_s": (float(first["t"]) - began) if first else None,
        "end_s": ended - began,
        "rewards": [round(r["data"].get("reward/mean", float("nan")), 3) for r in records[:5]],
        "lag0_first_step": lag0,
    }


def pass_ratios(rows: list[dict[str, Any]]) -> list[float]:
    """Attached / cold first step of each pass (two runs back to back, under one load)."""
    ratios = []
    for index in range(0, len(rows) - 1, 2):
        pair = {row["attached"]: row["first_step_s"] for row in rows[index : index + 2]}
        if pair.get(True) and pair.get(False):
            ratios.append(pair[True] / pair[False])
    return ratios


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| run | server | exit | first step (s from the command) | end (s) "
        "| rewards, steps 1-5 | lag-0 diff, step 1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        first = f"{row['first_step_s']:.1f}" if row["first_step_s"] is not None else "-"
        lag0 = f"{row['lag0_first_step']:.1e}" if row["lag0_first_step"] is not None else "-"
        server = "kept (attached)" if row["attached"] else "its own (cold)"
        lines.append(
            f"| {row['run']} | {server} | {row['exit']} | {first} | {row['end_s']:.1f} | "
            f"{row['rewards']} | {lag0} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mode", default="shared_vllm")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="attach-cpu-"))
    kept, url = profile_copy(work, "kept", args.mode, args.steps)
    profile, _ = profile_copy(work, "quickstart", args.mode, args.steps)
    load_before = load()
    serve_log = work / "serve.log"
    serving = grpo_tui("serve", str(kept), "--run-dir", str(work / "runs" / "serve"), log=serve_log)
    rows: list[dict[str, Any]] = []
    try:
        ready = wait_for_server(url, serving, serve_log)
        print(f"kept server at {url} after {ready:.1f} s (not timed in the runs)", flush=True)
        for index in range(args.passes):
            order = [None, url] if index % 2 == 0 else [url, None]
            for target in order:
                name = f"{'attached' if target else 'cold'}-{index + 1}"
                row = one_run(profile, work, name, target)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        os.killpg(serving.pid, signal.SIGINT)
        serve_exit = serving.wait(timeout=120)
    cold = [r["first_step_s"] for r in rows if not r["attached"] and r["first_step_s"]]
    attached = [r["first_step_s"] for r in rows if r["attached"] and r["first_step_s"]]
    ratio = statistics.median(attached) / statistics.median(cold) if cold and attached else None
    summary = (
        f"median first step: attached {statistics.median(attached):.1f} s, cold "
        f"{statistics.median(cold):.1f} s: {ratio:.2f}x (goal <= 0.5x); per pass (the two "
        f"runs back to back): {', '.join(f'{r:.2f}x' for r in pass_ratios(rows))}"
        if ratio is not None
        else "no ratio: a run did not reach its first step"
    )
    lines = [
        "# A run attached to a kept built-in server vs a cold run (CPU quickstart)",
        "",
        f"`python benchmarks/attach_cpu.py --passes {args.passes} --steps {args.steps} "
        f"--mode {args.mode}`, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}: "
        f"{os.cpu_count()} CPUs, load (1/5/15 min) {load_before} before and {load()} after "
        f"(a machine shared with other work); python {platform.python_version()}, torch "
        f"{version('torch')}, transformers {version('transformers')}. The kept server: "
        f"`grpo-tui serve`, ready after {ready:.1f} s (once, not in the runs), exit "
        f"{serve_exit} on Ctrl-C.",
        "",
        *table(rows),
        "",
        summary,
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
