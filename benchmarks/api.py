"""Rollout API throughput: ingest (groups/s) and ``GET /batch`` latency, side by side.

Servers compared, each a real process on a free loopback port:

- ``ours full``: SQLite WAL, ``synchronous=FULL`` (fsync per commit; the default);
- ``ours normal``: SQLite WAL, ``synchronous=NORMAL`` (no fsync; safe against kill -9);
- ``ours memory``: ``--db :memory:`` (nothing durable, the same code path otherwise);
- ``atropos``: atroposlib's ``run-api`` (all in memory), when a venv holding it is given.

Groups are realistic: 8 sequences of L tokens with masks, scores and inference logprobs.
Request bodies are encoded once up front, so the client costs little; responses are asked
for with ``Accept-Encoding: identity`` (no response gzip on either server).

    python benchmarks/api.py                                  # ours only
    python benchmarks/api.py --atropos /tmp/atropos-venv      # plus atroposlib's run-api
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

GROUP_SIZE = 8
BATCH_SHAPES = ((64, 512), (256, 1024), (512, 2048))
"""(sequences per batch, tokens per sequence) measured for ``GET /batch``."""


@dataclass(frozen=True)
class ServerKind:
    name: str
    command: list[str]
    env: dict[str, str]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A server process in its own process group, stopped by signalling that group."""

    def __init__(self, kind: ServerKind, port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                kind.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **kind.env},
            )
        self.client = httpx.Client(
            base_url=self.url, timeout=120.0, headers={"Accept-Encoding": "identity"}
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind.name} exited: {log.read_text()[-2000:]}")
            try:
                if self.client.get("/status").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"{kind.name} did not come up: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def group_body(tokens: int, rng: random.Random) -> bytes:
    """One scored group as an environment would post it (prompt of 64 tokens)."""
    prompt = 64
    seqs = [[rng.randrange(32000) for _ in range(tokens)] for _ in range(GROUP_SIZE)]
    return json.dumps(
        {
            "tokens": seqs,
            "masks": [[-100] * prompt + s[prompt:] for s in seqs],
            "scores": [rng.random() for _ in range(GROUP_SIZE)],
            "inference_logprobs": [
                [1.0] * prompt + [-rng.random() * 5 for _ in range(tokens - prompt)]
                for _ in range(GROUP_SIZE)
            ],
            "generation_params": {"temperature": 1.0},
            "env_id": None,
        }
    ).encode()


def register(server: Server, batch_size: int, tokens: int) -> None:
    answer = server.client.post(
        "/register",
        json={
            "wandb_group": "",
            "wandb_project": "",
            "batch_size": batch_size,
            "max_token_len": tokens,
            "checkpoint_dir": "",
            "save_checkpoint_interval": 0,
            "starting_step": 0,
            "num_steps": 1000,
        },
    )
    answer.raise_for_status()


def post_all(server: Server, bodies: list[bytes], clients: int) -> float:
    """Post every body (``clients`` at a time); returns the seconds it took."""
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}

    def post(body: bytes) -> None:
        answer = server.client.post("/scored_data", content=body, headers=headers)
        answer.raise_for_status()
        assert answer.json()["status"] == "received", answer.text

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(post, bodies))
    return time.perf_counter() - start


def measure_ingest(server: Server, tokens: int, groups: int, clients: int) -> float:
    rng = random.Random(0)
    variants = [group_body(tokens, rng) for _ in range(8)]
    register(server, 64, tokens)
    post_all(server, variants[:4], clients)  # warm-up
    seconds = post_all(server, [variants[i % 8] for i in range(groups)], clients)
    return groups / seconds


def measure_batch(server: Server, batch: int, tokens: int, repeats: int) -> float:
    """Median ms for a ``GET /batch`` of ``batch`` sequences, body fully received."""
    rng = random.Random(1)
    register(server, batch, tokens)
    variants = [group_body(tokens, rng) for _ in range(4)]
    per_batch = batch // GROUP_SIZE
    post_all(server, [variants[i % 4] for i in range(per_batch * repeats)], clients=2)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        answer = server.client.get("/batch")
        elapsed = time.perf_counter() - start
        answer.raise_for_status()
        served = sum(len(g["tokens"]) for g in answer.json()["batch"])
        assert served == batch, f"batch of {served} sequences, wanted {batch}"
        times.append(elapsed * 1000)
    return statistics.median(times)


def kinds(tmp: Path, atropos: Path | None) -> list[ServerKind]:
    def ours(name: str, db: str, sync: str) -> ServerKind:
        return ServerKind(
            name,
            [
                *(sys.executable, "-m", "grpo_trainer.api", "--port", "{port}", "--db", db),
                *("--synchronous", sync, "--max-body-bytes", str(512 * 1024 * 1024)),
            ],
            {},
        )

    found = [
        ours("ours full (durable)", str(tmp / "full-{port}.db"), "full"),
        ours("ours normal (durable*)", str(tmp / "normal-{port}.db"), "normal"),
        ours("ours memory", ":memory:", "normal"),
    ]
    if atropos is not None:
        found.append(
            ServerKind(
                "atropos run-api (memory)",
                [str(atropos / "bin" / "run-api"), "--host", "127.0.0.1", "--port", "{port}"],
                {"ATROPOS_ZMQ_PORT": "{zmq}", "WANDB_MODE": "disabled"},
            )
        )
    return found


def start(kind: ServerKind, tmp: Path) -> Server:
    port, zmq = free_port(), free_port()
    fill = {"port": str(port), "zmq": str(zmq)}
    resolved = ServerKind(
        kind.name,
        [part.format(**fill) for part in kind.command],
        {k: v.format(**fill) for k, v in kind.env.items()},
    )
    return Server(resolved, port, tmp / f"{kind.name.split()[0]}-{port}.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atropos", type=Path, help="venv with atroposlib installed")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens/seq for ingest")
    parser.add_argument("--groups", type=int, default=300, help="groups posted for ingest")
    parser.add_argument("--clients", type=int, default=4, help="concurrent posting clients")
    parser.add_argument("--repeats", type=int, default=3, help="/batch calls per shape")
    args = parser.parse_args()

    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for kind in kinds(tmp, args.atropos):
            server = start(kind, tmp)
            try:
                ingest = measure_ingest(server, args.tokens, args.groups, args.clients)
            finally:
                server.stop()
            row = [kind.name, f"{ingest:.1f}"]
            for batch, tokens in BATCH_SHAPES:
                server = start(kind, tmp)
                try:
                    row.append(f"{measure_batch(server, batch, tokens, args.repeats):.1f}")
                finally:
                    server.stop()
            rows.append(row)
            print(" | ".join(row), file=sys.stderr, flush=True)

    header = ["server", f"ingest groups/s (G={GROUP_SIZE}, L={args.tokens})"] + [
        f"/batch ms {b}x{t}" for b, t in BATCH_SHAPES
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print(
        "\n* normal: survives kill -9 of the API, may lose the last commits on power loss."
        f"\n  {args.clients} posting clients, /batch median of {args.repeats}, "
        "times include receiving the whole body."
    )


if __name__ == "__main__":
    main()
