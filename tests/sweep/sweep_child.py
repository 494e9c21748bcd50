"""A small real cell process for the sweep tests: reports metrics, then exits 0.

Reads ``SCALE`` (a number, from ``--set process.work.env.SCALE=...``): it sends ``STEPS``
trainer-like metrics records on the supervisor's control socket, ``reward/mean`` rising to
``SCALE``. With ``GATE_DIR`` set it first waits until the file ``GATE_DIR/<SCALE>`` exists,
so a test decides when each cell may finish.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path


def main() -> int:
    scale = float(os.environ["SCALE"])
    steps = int(os.environ.get("STEPS", "6"))
    gate = os.environ.get("GATE_DIR")
    if gate:
        flag = Path(gate) / os.environ["SCALE"]
        while not flag.exists():
            time.sleep(0.05)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(os.environ["GRPO_TUI_SOCKET"])
        for step in range(1, steps + 1):
            data = {
                "training_steps": steps,
                "loss": 1.0 / step,
                "reward/mean": scale * step / steps,
                "kl": 0.01 * scale * step,
            }
            record = {"type": "metrics", "step": step, "t": time.time(), "data": data}
            conn.sendall((json.dumps(record) + "\n").encode())
    print("cell done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
