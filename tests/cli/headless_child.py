"""A small real child for the headless-run tests: prints, serves, reports, sleeps, exits.

Usage: headless_child.py NAME [--ready-after S] [--life S] [--exit CODE] [--pid-dir DIR]
                              [--grandchild] [--metrics STEPS] [--ignore-term]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def send_metrics(steps: int) -> None:
    """Report ``steps`` metrics records on the supervisor's control socket."""
    path = os.environ["GRPO_TUI_SOCKET"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        for step in range(1, steps + 1):
            data = {"loss": 1.0 / step, "reward/mean": 0.1 * step, "mean_ratio": 1.0}
            record = {"type": "metrics", "step": step, "t": time.time(), "data": data}
            conn.sendall((json.dumps(record) + "\n").encode())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--life", type=float, default=3600.0)
    parser.add_argument("--exit", type=int, default=0)
    parser.add_argument("--pid-dir", type=Path)
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--metrics", type=int, default=0)
    args = parser.parse_args()
    if args.pid_dir is not None:
        (args.pid_dir / f"{args.name}.pid").write_text(str(os.getpid()))
    if args.grandchild:
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        if args.pid_dir is not None:
            (args.pid_dir / f"{args.name}-grandchild.pid").write_text(str(grandchild.pid))
    time.sleep(args.ready_after)
    if args.metrics:
        send_metrics(args.metrics)
    print(f"{args.name} ready", flush=True)
    deadline = time.monotonic() + args.life
    while time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"{args.name} exiting with {args.exit}", flush=True)
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
