"""Small real child processes for the dashboard's Pilot tests.

``python tui_children.py server NAME``   prints a few lines, then ``NAME ready``, then a line
                                         every 100 ms until SIGTERM (exit 0).
``python tui_children.py trainer``       like a trainer: ``grpo-trainer ready``, then one
                                         metrics record per 100 ms on ``GRPO_TUI_SOCKET``
                                         (step, loss, mean_ratio, ...); SIGTERM -> exit 0.
``python tui_children.py crasher``       prints a line and exits 1 (a crash loop).
The mode comes from ``STANDIN_MODE`` and is printed at start.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

stopping = False


def _on_term(signum: int, frame: object) -> None:
    global stopping
    stopping = True


def server(name: str) -> int:
    print(f"{name} starting in mode {os.environ.get('STANDIN_MODE', 'none')}", flush=True)
    print(f"{name} ready", flush=True)
    tick = 0
    while not stopping:
        tick += 1
        print(f"{name} tick {tick}", flush=True)
        time.sleep(0.1)
    print(f"{name} stopping", flush=True)
    return 0


def trainer() -> int:
    print(f"trainer mode {os.environ.get('STANDIN_MODE', 'none')}", flush=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["GRPO_TUI_SOCKET"])
    print("grpo-trainer ready", flush=True)
    step = 0
    while not stopping:
        step += 1
        data = {
            "loss": 1.0 / step,
            "mean_ratio": 1.0,
            "clipped_fraction": 0.1,
            "reward/mean": min(1.0, step / 50),
            "training_steps": 1000,
        }
        record = {"type": "metrics", "step": step, "t": time.time(), "data": data}
        sock.sendall((json.dumps(record) + "\n").encode())
        print(f"step {step}", flush=True)
        time.sleep(0.1)
    print("trainer checkpoint written", flush=True)
    sock.close()
    return 0


def crasher() -> int:
    print("crasher: about to fail", flush=True)
    return 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _on_term)
    role = sys.argv[1]
    if role == "server":
        sys.exit(server(sys.argv[2]))
    sys.exit(trainer() if role == "trainer" else crasher())
