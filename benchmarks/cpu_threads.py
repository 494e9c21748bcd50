"""CPU threads: trainer step time while the built-in server generates, by thread setting.

The quickstart's situation on a small CPU machine: the built-in inference server answers a
steady stream of completions (what the environment asks for) while the trainer trains on
the tiny model. Each row runs a real server and a real trainer process with one thread
setting for both (``--cpu-threads``; 0 = torch's default, one thread per core) and prints
the trainer's median step time and the server's completions per second side by side.

    python benchmarks/cpu_threads.py                # rows: 0 (torch default) and 1
    python benchmarks/cpu_threads.py --threads 0 1 2 --steps 12
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings

REPO = Path(__file__).resolve().parents[1]
PROMPT_LEN = 8
COMPLETION_LEN = 24


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_groups(path: Path, *, groups: int, group_size: int, seed: int = 0) -> Path:
    """Random groups in the API's shape; the step's cost does not depend on the values."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(groups):
            prompt = [rng.randrange(5, 44) for _ in range(PROMPT_LEN)]
            tokens = [
                prompt + [rng.randrange(5, 44) for _ in range(COMPLETION_LEN)]
                for _ in range(group_size)
            ]
            group = {
                "tokens": tokens,
                "masks": [[-100] * PROMPT_LEN + seq[PROMPT_LEN:] for seq in tokens],
                "scores": [rng.random() for _ in tokens],
                "inference_logprobs": [[1.0] * PROMPT_LEN + [-3.7] * COMPLETION_LEN] * group_size,
                "generation_params": {"temperature": 1.0},
            }
            handle.write(json.dumps(group) + "\n")
    return path


class Load:
    """Completions requested back to back, like an environment with one worker."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.done = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": "policy", "prompt": "what is 7:", "n": 8, "max_tokens": 24}
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                client.post(f"{self.url}/v1/completions", json=body).raise_for_status()
                self.done += 1


def run_row(threads: int, model: Path, groups: Path, work: Path, steps: int) -> dict:
    settings = InferenceSettings(port=free_port(), cpu_threads=threads)
    launch = inference_command(settings, mode="none", model=str(model))
    server = ServerProcess(launch, settings.base_url, work / f"server-{threads}.log")
    server.start()
    load = Load(settings.base_url)
    metrics = work / f"metrics-{threads}.jsonl"
    command = [
        sys.executable,
        "-m",
        "grpo_trainer.train",
        "--model-name",
        str(model),
        "--batches-file",
        str(groups),
        "--save-path",
        str(work / f"ckpt-{threads}"),
        "--sync-every",
        "0",
        "--training-steps",
        str(steps),
        "--batch-size",
        "16",
        "--seq-len",
        "64",
        "--checkpoint-interval",
        "0",
        "--cpu-threads",
        str(threads),
        "--metrics-file",
        str(metrics),
    ]
    try:
        load.thread.start()
        started = time.monotonic()
        subprocess.run(command, cwd=REPO, check=True, capture_output=True)
        elapsed = time.monotonic() - started
        served = load.done
    finally:
        load.stop.set()
        load.thread.join(120)
        server.stop()
    times = [json.loads(line)["data"]["step_time"] for line in metrics.read_text().splitlines()]
    return {
        "threads": "torch default" if threads == 0 else str(threads),
        "step_s": statistics.median(times[1:]),
        "completions_per_s": served / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    os.environ.pop("OMP_NUM_THREADS", None)  # torch's default must be torch's own
    from grpo_trainer.models import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="grpo-threads-") as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "model", seed=0)
        groups = write_groups(work / "groups.jsonl", groups=args.steps * 2, group_size=8)
        rows = [run_row(t, model, groups, work, args.steps) for t in args.threads]
    print(f"cores: {os.cpu_count()}, tiny model, trainer batch 16 x 64 tokens, server n=8 x 24")
    print(f"{'threads (both)':>16} {'trainer step s (median)':>24} {'server completions/s':>21}")
    for row in rows:
        print(f"{row['threads']:>16} {row['step_s']:>24.3f} {row['completions_per_s']:>21.2f}")


if __name__ == "__main__":
    main()
