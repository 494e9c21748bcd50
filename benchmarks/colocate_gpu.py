"""``colocate`` vs ``shared_vllm`` on one GPU: largest batch that trains, step time, and the
sleep + wake + sync overhead per step, for Qwen2.5 shapes at random init.

Each (shape, mode) cell starts the real inference server with the role layer's own command
(``inference_command``: vLLM with ``--enable-sleep-mode`` and ``ipc`` weight transfer for
``colocate``, the worker extension for ``shared_vllm``), attaches the real strategy
(``make_strategy``) to a trainer model on the same GPU and runs real steps: generate (one
``/v1/completions`` request of ``--gen-n`` x ``--gen-tokens``), ``before_train_step``
(``colocate``: sleep), forward/backward through the trainer's chunked logprobs on random
tokens, ``optimizer.step`` (AdamW), ``sync`` (``colocate``: wake weights, IPC push, wake
KV cache, ``/is_sleeping`` false). The batch search doubles the batch (``--batches``)
until ``torch.OutOfMemoryError``; the other shapes run at the first batch only.

GPU (one H200, see benchmarks/colocate_device.sh)::

    python3 benchmarks/colocate_gpu.py --out $OUT

CPU smoke of the harness (built-in server, no vLLM; no OOM to find)::

    python3 benchmarks/colocate_gpu.py --backend builtin --device cpu --shapes small \\
        --search-shape small --batches 1,2 --seq-len 64 --steps 2 --out /tmp/colocate

Writes ``colocate_gpu.json`` and ``colocate_gpu.md`` (tables side by side) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from model_shapes import SHAPES, qwen2_config

MODES = ("shared_vllm", "colocate")
GB = 1e9


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_for(args: argparse.Namespace, port: int) -> Any:
    """The ``[inference]`` table the role layer would get."""
    from grpo_trainer.serve.settings import InferenceSettings

    if args.backend == "builtin":
        return InferenceSettings(port=port, device=args.device, dtype=args.dtype)
    return InferenceSettings(
        backend="vllm",
        port=port,
        dtype=args.dtype,
        enforce_eager=True,
        max_model_len=args.seq_len + args.gen_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        gpus=[0],
        vllm_executable=[sys.executable, "-m", "vllm.entrypoints.cli.main"],
        extra_args=["--load-format", "dummy", "--skip-tokenizer-init"],
    )


def generate(url: str, model: str, args: argparse.Namespace) -> float:
    """One rollout-sized request; seconds (the engine must be awake and serving)."""
    import httpx

    body = {
        "model": model,
        "prompt": list(range(1, 33)),
        "n": args.gen_n,
        "max_tokens": args.gen_tokens,
        "ignore_eos": True,
        "temperature": 1.0,
    }
    start = time.perf_counter()
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    if len(response.json()["choices"]) != args.gen_n:
        raise RuntimeError(f"expected {args.gen_n} choices: {response.text[:300]}")
    return time.perf_counter() - start


def one_step(model: Any, optimizer: Any, strategy: Any, batch: int, step: int, args) -> dict:
    """generate is timed by the caller; here sleep, train, sync with their seconds."""
    import torch

    from grpo_trainer.train.logprobs import chunked_token_logprobs

    device = next(model.parameters()).device
    times: dict[str, float] = {}
    start = time.perf_counter()
    strategy.before_train_step()
    times["sleep_s"] = time.perf_counter() - start
    if device.type == "cuda":
        times["free_in_train_gb"] = torch.cuda.mem_get_info(device)[0] / GB
    start = time.perf_counter()
    ids = torch.randint(1, 30000, (batch, args.seq_len), device=device)
    for micro in ids.split(args.micro_batch):
        out = chunked_token_logprobs(
            model, micro, torch.ones_like(micro), torch.ones(len(micro), device=device)
        )
        (-out.logprobs.mean() * len(micro) / batch).backward()
    strategy.before_optimizer_step()
    optimizer.step()
    strategy.after_optimizer_step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times["train_s"] = time.perf_counter() - start
    result = strategy.sync(model, step)
    times["sync_s"] = result.sync_time
    times.update({f"sync_{k}_s": v for k, v in result.phases.items()})
    return times


def run_cell(shape: str, mode: str, batches: list[int], args: argparse.Namespace) -> dict:
    """One server + trainer; steps at each batch until OOM (or the list ends)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from grpo_trainer.serve.launch import ServerProcess
    from grpo_trainer.serve.settings import inference_command
    from grpo_trainer.sync.base import SyncContext
    from grpo_trainer.sync.registry import make_strategy

    work = Path(args.work) / f"{shape}-{mode}"
    work.mkdir(parents=True, exist_ok=True)
    config = qwen2_config(shape, max_position_embeddings=args.seq_len + args.gen_tokens)
    model_dir = work / "model"
    port = free_port()
    settings = settings_for(args, port)
    if args.backend == "builtin":  # the built-in server loads real files
        from grpo_trainer.models import build_tiny_tokenizer

        Qwen2ForCausalLM(config).save_pretrained(model_dir)
        build_tiny_tokenizer().save_pretrained(model_dir)
    else:
        config.save_pretrained(model_dir)
    launch = inference_command(
        settings, mode=mode, model=str(model_dir), shared_dir=str(work / "shared")
    )
    server = ServerProcess(launch, settings.base_url, work / "server.log")
    cell: dict[str, Any] = {"shape": shape, "mode": mode, "batches": {}}
    cell["server_start_s"] = server.start(timeout=args.start_timeout)
    strategy = None
    try:
        device = torch.device(args.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.manual_seed(0)
        dtype = getattr(torch, args.dtype)
        if args.backend == "builtin":
            model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        else:
            with torch.device(device):
                model = Qwen2ForCausalLM(config).to(dtype=dtype)
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        cell["params"] = sum(p.numel() for p in model.parameters())
        context = SyncContext(server.base_url, settings.served_model_name, work, args.backend)
        strategy = make_strategy(mode, context)
        model = strategy.attach(model)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        step = 0
        for batch in batches:
            rows = []
            try:
                for _ in range(args.steps):
                    step += 1
                    gen = generate(server.base_url, settings.served_model_name, args)
                    rows.append(
                        {
                            "generate_s": gen,
                            **one_step(model, optimizer, strategy, batch, step, args),
                        }
                    )
            except torch.OutOfMemoryError as error:
                optimizer.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                cell["batches"][batch] = {"oom": str(error).splitlines()[0][:200]}
                strategy.sync(model, step)  # colocate: wake the engine before we stop
                break
            medians = {k: statistics.median(r[k] for r in rows[1:] or rows) for k in rows[0]}
            medians["step_s"] = medians["train_s"] + medians["sleep_s"] + medians["sync_s"]
            if device.type == "cuda":
                medians["peak_gb"] = torch.cuda.max_memory_allocated(device) / GB
            cell["batches"][batch] = medians
            print(f"{shape} {mode} batch {batch}: {json.dumps(medians)}", flush=True)
        cell["served_after"] = generate(server.base_url, settings.served_model_name, args) > 0
    finally:
        if strategy is not None:
            strategy.close()
        server.stop(timeout=30)
    return cell


def largest(cell: dict) -> tuple[int | None, dict | None]:
    fits = [(b, r) for b, r in cell["batches"].items() if "oom" not in r]
    return max(fits, key=lambda item: item[0]) if fits else (None, None)


def report(cells: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"# colocate vs shared_vllm ({args.backend}, {args.device}, {args.dtype}, seq_len "
        f"{args.seq_len}, gpu_memory_utilization {args.gpu_memory_utilization}, "
        f"gradient checkpointing {args.gradient_checkpointing})",
        "",
        f"## Largest batch that trains ({args.search_shape})",
        "",
        "| mode | largest batch | step s at it | step s at batch "
        f"{args.batches[0]} | free GB while training | OOM at |",
        "|---|---|---|---|---|---|",
    ]
    by = {(c["shape"], c["mode"]): c for c in cells}
    for mode in MODES:
        cell = by.get((args.search_shape, mode))
        if cell is None:
            continue
        batch, row = largest(cell)
        first = cell["batches"].get(args.batches[0], {})
        oom = next((b for b, r in cell["batches"].items() if "oom" in r), "-")
        lines.append(
            f"| {mode} | {batch} | {row['step_s']:.3f} | {first.get('step_s', float('nan')):.3f} "
            f"| {row.get('free_in_train_gb', float('nan')):.1f} | {oom} |"
            if row
            else f"| {mode} | none | - | - | - | {oom} |"
        )
    lines += [
        "",
        f"## Per-step overhead at batch {args.batches[0]} (median of steps 2..{args.steps})",
        "",
        "| shape | params | colocate sleep s | wake s | push s | sync total s | "
        "shared_vllm sync s | step s colocate / shared_vllm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for shape in args.shapes:
        co = by.get((shape, "colocate"), {}).get("batches", {}).get(args.batches[0])
        sh = by.get((shape, "shared_vllm"), {}).get("batches", {}).get(args.batches[0])
        if not co or not sh or "oom" in co or "oom" in sh:
            lines.append(f"| {shape} | - | n/a (a cell failed or ran out of memory) |||||")
            continue
        params = by[(shape, "colocate")]["params"]
        wake, push = co.get("sync_wake_s", float("nan")), co.get("sync_push_s", float("nan"))
        lines.append(
            f"| {shape} | {params / 1e9:.2f}e9 | {co['sleep_s']:.4f} | {wake:.4f} | {push:.4f} "
            f"| {co['sync_s']:.4f} | {sh['sync_s']:.4f} | {co['step_s']:.3f} / {sh['step_s']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", default="/tmp/colocate_gpu")
    parser.add_argument("--backend", choices=["vllm", "builtin"], default="vllm")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--shapes",
        type=lambda s: s.split(","),
        default=["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"],
    )
    parser.add_argument("--search-shape", default="qwen2.5-1.5b")
    parser.add_argument(
        "--batches", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32, 64, 128]
    )
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--gen-n", type=int, default=16)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument(
        "--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false"
    )
    parser.add_argument("--start-timeout", type=float, default=240)
    args = parser.parse_args()
    unknown = [s for s in {*args.shapes, args.search_shape} if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    cells = []
    for shape in dict.fromkeys([args.search_shape, *args.shapes]):
        batches = args.batches if shape == args.search_shape else args.batches[:1]
        for mode in MODES:
            try:
                cells.append(run_cell(shape, mode, batches, args))
            except Exception as error:  # one failed cell must not lose the others' numbers
                print(f"{shape} {mode} failed: {error!r}", flush=True)
                cells.append({"shape": shape, "mode": mode, "batches": {}, "error": repr(error)})
            (args.out / "colocate_gpu.json").write_text(json.dumps(cells, indent=1, default=str))
    table = report(cells, args)
    (args.out / "colocate_gpu.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
