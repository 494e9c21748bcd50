"""Environment throughput: toy groups per second against the real API and built-in server.

Starts the rollout API (in-memory queue) and the built-in inference server on a tiny
model, registers a stand-in trainer, then runs the toy environment in-process for a
fixed number of groups at several ``max_concurrency`` values and prints them side by
side (groups/s, completion tokens/s, share of groups dropped for equal scores).

    python benchmarks/envs.py                      # concurrency 1, 4, 8; 64 groups each
    python benchmarks/envs.py --concurrency 1 16 --groups 128 --device cuda
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from grpo_trainer.envs.base import Connection, EnvRunner
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.envs.tokenizer import FastTokenizer
from grpo_trainer.envs.toy import LENGTH, RepeatDigit
from grpo_trainer.models import build_tiny_model


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(argv: list[str], log: Path, health: str) -> subprocess.Popen[bytes]:
    """Start a server in its own process group and wait (deadline 120 s) for its health."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[2]} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(health, timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{health} not healthy in 120 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


async def measure(
    api: str, inference: str, model: Path, concurrency: int, groups: int, group_size: int
) -> tuple[float, int, int]:
    """Seconds to send ``groups`` groups, and the groups dropped / scored on the way."""
    settings = EnvSettings(group_size=group_size, max_concurrency=concurrency, max_groups=groups)
    runner = EnvRunner(
        RepeatDigit(), settings, Connection(api, inference), FastTokenizer.from_dir(model)
    )
    started = time.perf_counter()
    stats = await runner.run()
    elapsed = time.perf_counter() - started
    dropped = stats.counts["groups_dropped_equal_scores"]
    return elapsed, dropped, stats.counts["groups_sent"] + dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 8])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "model", seed=0)
        api_port, serve_port = free_port(), free_port()
        api, inference = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{serve_port}"
        procs = []
        try:
            procs.append(start(
                [sys.executable, "-m", "grpo_trainer.api", "--port", str(api_port), "--db",
                 ":memory:", "--max-batches-offpolicy", "100000"],
                root / "api.log", f"{api}/health",
            ))  # fmt: skip
            procs.append(start(
                [sys.executable, "-m", "grpo_trainer.serve", str(model), "--port",
                 str(serve_port), "--served-model-name", "policy", "--device", args.device],
                root / "serve.log", f"{inference}/health",
            ))  # fmt: skip
            body = {"batch_size": args.group_size, "max_token_len": 64, "num_steps": 1}
            httpx.post(f"{api}/register", json=body).raise_for_status()
            httpx.get(f"{api}/batch").raise_for_status()
            rows = []
            for concurrency in args.concurrency:
                elapsed, dropped, scored = asyncio.run(
                    measure(api, inference, model, concurrency, args.groups, args.group_size)
                )
                tokens = scored * args.group_size * LENGTH
                rows.append(
                    (concurrency, args.groups / elapsed, tokens / elapsed, dropped / scored)
                )
        finally:
            for proc in reversed(procs):
                stop(proc)
    print(f"\ntoy environment, {args.groups} groups of {args.group_size}, built-in server on "
          f"{args.device}")  # fmt: skip
    print(f"{'concurrency':>11} {'groups/s':>9} {'tokens/s':>9} {'dropped':>8}")
    for concurrency, groups_per_s, tokens_per_s, dropped in rows:
        print(f"{concurrency:>11} {groups_per_s:>9.1f} {tokens_per_s:>9.0f} {dropped:>8.0%}")


if __name__ == "__main__":
    main()
