"""Rollout API throughput: ingest (groups/s) and ``GET /batch`` latency, side by side.

Servers compared, each a real process on a free loopback port:

- ``floor``: a bare Starlette app that answers the same requests without parsing or
  storing anything: what HTTP on this machine costs, the limit for everyone;
- ``ours full``: SQLite WAL, ``synchronous=FULL`` (fsync per commit; the default);
- ``ours normal``: SQLite WAL, ``synchronous=NORMAL`` (no fsync; safe against kill -9);
- ``ours memory``: ``--db :memory:`` (nothing durable, the same code path otherwise);
- ``atropos``: atroposlib's ``run-api`` (all in memory), when a venv holding it is given;
  then atroposlib's own environment client code is also run against ours first
  (``api_atropos_client.py``).

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
CLIENT = "api_atropos_client.py"
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
        self.name = kind.name
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
    """Start from an empty server (``/reset_data``) registered for this batch shape."""
    server.client.get("/reset_data").raise_for_status()
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


def measure_ingest(server: Server, bodies: list[bytes], tokens: int, clients: int) -> float:
    """Groups/s for posting ``bodies`` to a freshly registered server."""
    register(server, 64, tokens)
    post_all(server, bodies[:4], clients)  # warm-up
    return len(bodies) / post_all(server, bodies, clients)


def measure_batch(server: Server, bodies: list[bytes], batch: int, tokens: int) -> float:
    """Ms for one ``GET /batch`` of ``batch`` sequences, whole body received."""
    register(server, batch, tokens)
    post_all(server, [bodies[i % len(bodies)] for i in range(batch // GROUP_SIZE)], clients=2)
    start = time.perf_counter()
    answer = server.client.get("/batch")
    elapsed = time.perf_counter() - start
    answer.raise_for_status()
    served = sum(len(g["tokens"]) for g in answer.json()["batch"])
    assert served == batch, f"batch of {served} sequences, wanted {batch}"
    return elapsed * 1000


FLOOR_APP = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

state = {"size": 0, "group": b"{}"}

async def status(request):
    return JSONResponse({"current_step": 0, "queue_size": 0})

async def reset(request):
    return Response(b"Reset successful")

async def register(request):
    state["size"] = (await request.json())["batch_size"]
    return JSONResponse({"uuid": 0})

async def scored(request):
    state["group"] = await request.body()
    return JSONResponse({"status": "received"})

async def batch(request):
    groups = [state["group"]] * (state["size"] // 8)
    return Response(b'{"batch":[' + b",".join(groups) + b"]}", media_type="application/json")

routes = [Route("/status", status), Route("/reset_data", reset),
          Route("/register", register, methods=["POST"]),
          Route("/scored_data", scored, methods=["POST"]), Route("/batch", batch)]
uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=int(sys.argv[1]),
            log_level="warning")
"""
"""Loopback floor: the same requests answered with no parsing and no storage at all."""


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
        ServerKind("floor: HTTP only, no work", [sys.executable, "-c", FLOOR_APP, "{port}"], {}),
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

    def fill(text: str) -> str:
        return text.replace("{port}", str(port)).replace("{zmq}", str(zmq))

    resolved = ServerKind(
        kind.name, [fill(part) for part in kind.command], {k: fill(v) for k, v in kind.env.items()}
    )
    return Server(resolved, port, tmp / f"{kind.name.split()[0].strip(':')}-{port}.log")


def atropos_client_check(venv: Path) -> str:
    """Run atroposlib's env client code (``api_atropos_client.py``) against our server."""
    with tempfile.TemporaryDirectory() as tmp_name:
        kind = ServerKind("ours", [sys.executable, "-m", "grpo_trainer.api"], {})
        kind.command.extend(["--port", "{port}", "--db", ":memory:"])
        server = start(kind, Path(tmp_name))
        try:
            proc = subprocess.run(
                [str(venv / "bin" / "python"), str(Path(__file__).with_name(CLIENT)), server.url],
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            server.stop()
    if proc.returncode == 0:
        return proc.stdout.strip().splitlines()[-1]
    lines = proc.stderr.strip().splitlines()
    return f"FAILED: {lines[-1] if lines else proc.returncode}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atropos", type=Path, help="venv with atroposlib installed")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens/seq for ingest")
    parser.add_argument("--groups", type=int, default=150, help="groups posted per round")
    parser.add_argument("--clients", type=int, default=4, help="concurrent posting clients")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    args = parser.parse_args()

    compat = atropos_client_check(args.atropos) if args.atropos else None
    rng = random.Random(0)
    ingest_bodies = [group_body(args.tokens, rng) for _ in range(8)]
    shape_bodies = {t: [group_body(t, rng) for _ in range(4)] for _, t in BATCH_SHAPES}
    ingest_bodies = [ingest_bodies[i % 8] for i in range(args.groups)]
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        servers = [start(kind, tmp) for kind in kinds(tmp, args.atropos)]
        names = [s.name for s in servers]
        try:
            # Rounds interleave the servers so that load from other processes on a shared
            # machine hits all of them alike; the table shows medians over rounds.
            for round_ in range(args.rounds):
                for server in servers:
                    row = results.setdefault(server.name, {})
                    rate = measure_ingest(server, ingest_bodies, args.tokens, args.clients)
                    row.setdefault("ingest", []).append(rate)
                    for batch, tokens in BATCH_SHAPES:
                        ms = measure_batch(server, shape_bodies[tokens], batch, tokens)
                        row.setdefault(f"{batch}x{tokens}", []).append(ms)
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            for server in servers:
                server.stop()

    header = ["server", f"ingest groups/s (G={GROUP_SIZE}, L={args.tokens})"]
    header += [f"/batch ms {b}x{t}" for b, t in BATCH_SHAPES]
    rows = []
    for name in names:
        row = results[name]
        rows.append(
            [name, f"{statistics.median(row['ingest']):.1f}"]
            + [f"{statistics.median(row[f'{b}x{t}']):.1f}" for b, t in BATCH_SHAPES]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    atropos = next((n for n in names if n.startswith("atropos")), None)
    if atropos is not None:
        base = statistics.median(results[atropos]["ingest"])
        for name in names[1:-1]:
            ratio = statistics.median(results[name]["ingest"]) / base
            print(f"ingest {name} / {atropos}: {ratio:.2f}x")
    if compat is not None:
        print(f"atroposlib env client against ours: {compat}")
    print(
        "\n* normal: survives kill -9 of the API, may lose the last commits on power loss."
        f"\n  {args.clients} posting clients, {args.groups} groups per ingest round; "
        f"medians of {args.rounds} interleaved rounds; /batch times include receiving the "
        "whole body."
    )


if __name__ == "__main__":
    main()
