"""Built-in server: sync latency per weight-sync mode and generation tokens/s, side by side.

For each mode this starts the real built-in server (a child process) on a tiny model,
attaches the real strategy to a trainer model in this process, then repeats: one AdamW
step (with the strategy's pause hooks) + ``strategy.sync``. Restart modes are served by an
in-process restarter that does what the supervisor does on a ``restart`` request (stop
the server's process group, start it with the new model/adapter, wait for ``/health``).
Generation throughput: ``n`` samples x ``max_tokens`` per request, ``ignore_eos``.

    python benchmarks/inference_sync.py                      # CPU, tiny model
    python benchmarks/inference_sync.py --device cuda --hidden-size 1024 --num-layers 4
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from grpo_trainer.models import build_tiny_model, load_model
from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.sync.base import MODES, SyncContext
from grpo_trainer.sync.registry import make_strategy

SEED_SYNC = {"none": "30-60 s", "lora_restart": "~45 s", "lora_only": "1-5 s", "shared_vllm": "~0"}
SEED_TOKENS = {"none": "-", "lora_restart": "108", "lora_only": "13", "shared_vllm": "172"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """The server of one mode, restartable like the supervisor's role layer does."""

    def __init__(self, mode: str, model: Path, run: Path, device: str) -> None:
        self.mode, self.model, self.run = mode, str(model), run
        self.settings = InferenceSettings(port=free_port(), device=device)
        self.process: ServerProcess | None = None
        self.restarts = 0

    def start(self, model: str | None = None, adapter: str | None = None) -> None:
        launch = inference_command(
            self.settings,
            mode=self.mode,
            model=model or self.model,
            adapter=adapter,
            shared_dir=str(self.run / "shared"),
        )
        log = self.run / f"server-{self.restarts}.log"
        self.process = ServerProcess(launch, self.settings.base_url, log)
        self.process.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class LocalRestarter:
    """Answers the strategy's ``restart`` request the way the supervisor does."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def request(
        self, action: str, process: str | None = None, args: dict | None = None, timeout: float = 0
    ) -> dict[str, Any]:
        self.server.stop()
        self.server.restarts += 1
        self.server.start(model=(args or {}).get("model"), adapter=(args or {}).get("lora_path"))
        return {}

    def send_event(self, level: str, message: str) -> None:
        print(f"[{level}] {message}")


def trainer_model(base: Path, mode: str, device: str) -> nn.Module:
    model = load_model(base, device=device)
    if mode.startswith("lora"):
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    return model


def tokens_per_s(url: str, model: str, n: int, max_tokens: int, requests: int) -> float:
    body = {"model": model, "prompt": "repeat 3:", "n": n, "max_tokens": max_tokens}
    generated, start = 0, time.perf_counter()
    for seed in range(requests):
        answer = httpx.post(
            f"{url}/v1/completions", json={**body, "seed": seed, "ignore_eos": True}, timeout=300
        ).json()
        generated += answer["usage"]["completion_tokens"]
    return generated / (time.perf_counter() - start)


def bench_mode(mode: str, base: Path, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    run = root / mode
    run.mkdir()
    server = Server(mode, base, run, args.device)
    start = time.perf_counter()
    server.start()
    startup = time.perf_counter() - start
    try:
        context = SyncContext(server.settings.base_url, "policy", run / "checkpoints", "builtin")
        strategy = make_strategy(mode, context, link=LocalRestarter(server))  # type: ignore[arg-type]
        model = strategy.attach(trainer_model(base, mode, args.device))
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], 1e-3)
        ids = torch.randint(5, 40, (4, 32), device=args.device)
        syncs = []
        for step in range(1, args.syncs + 1):
            loss = model(input_ids=ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            strategy.before_optimizer_step()
            optimizer.step()
            strategy.after_optimizer_step()
            syncs.append(strategy.sync(model, step).sync_time)
        speed = tokens_per_s(server.settings.base_url, "policy", args.n, args.max_tokens, 3)
        strategy.close()
    finally:
        server.stop()
    return {"mode": mode, "startup": startup, "syncs": syncs, "tokens_per_s": speed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        heads = max(4, args.hidden_size // 64)
        base = build_tiny_model(
            root / "model",
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=heads,
            num_kv_heads=heads // 2,
            intermediate_size=args.hidden_size * 2,
        )
        results = [bench_mode(mode, base, root, args) for mode in args.modes]
    print(f"\nbuilt-in server on {args.device}, hidden {args.hidden_size} x {args.num_layers}")
    print(f"n={args.n} x {args.max_tokens} tokens per request; {args.syncs} syncs per mode\n")
    header = "| mode | server start | sync median (max) | seed sync | gen tok/s | seed tok/s |"
    print(header)
    print("|---|---|---|---|---|---|")
    for r in results:
        sync = f"{statistics.median(r['syncs']):.3f} s ({max(r['syncs']):.3f} s)"
        print(
            f"| {r['mode']} | {r['startup']:.1f} s | {sync} | {SEED_SYNC[r['mode']]} "
            f"| {r['tokens_per_s']:.0f} | {SEED_TOKENS[r['mode']]} |"
        )


if __name__ == "__main__":
    main()
