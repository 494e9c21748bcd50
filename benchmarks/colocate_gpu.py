"""``colocate`` vs ``shared_vllm`` on one GPU: largest batch that trains, step time, and the
sleep + wake + sync overhead per step, for Qwen2.5 shapes at random init.

Each (shape, mode) cell starts the real inference server with the role layer's own command
(``inference_command``: vLLM with ``--enable-sleep-mode`` and the worker extension for
``colocate``, the worker extension for ``shared_vllm``), attaches the real strategy
(``make_strategy``) to a trainer model on the same GPU and runs real steps: generate (one
``/v1/completions`` request of ``--gen-n`` x ``--gen-tokens``), ``before_train_step``
(``colocate``: sleep), forward/backward through the trainer's chunked logprobs on random
tokens, ``optimizer.step`` (AdamW), ``sync`` (``colocate``: wake weights, CUDA IPC load,
wake KV cache, ``/is_sleeping`` false).

The batch search (``--search-shape``, both modes, same ``gpu_memory_utilization``) runs the
batches of ``--batches`` in order, the whole batch in one forward/backward (no gradient
accumulation: the batch is what must fit), until ``torch.OutOfMemoryError``. The other
shapes (``--shapes``) run ``--overhead-modes`` at the first batch only, for the per-step
sleep + wake + load overhead. Cells that cannot finish inside ``--budget`` are skipped.

GPU (one H200, see benchmarks/colocate_device.sh)::

    python3 benchmarks/colocate_gpu.py --out $OUT

CPU smoke of the harness (built-in server, no vLLM; no OOM to find)::

    python3 benchmarks/colocate_gpu.py --backend builtin --device cpu --shapes small \\
        --search-shape small --batches 1,2 --seq-len 64 --steps 2 --gen-n 2 \\
        --gen-tokens 8 --out /tmp/colocate

Writes ``colocate_gpu.json`` and ``colocate_gpu.md`` (tables side by side) to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
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
    for micro in ids.split(args.micro_batch or batch):
        out = chunked_token_logprobs(
            model, micro, torch.ones_like(micro), torch.ones(len(micro), device=device)
        )
        (-out.logprobs.mean() * len(micro) / batch).backward()
    strategy.before_optimizer_step()
    try:  # an OOM in the step must not leave generation paused (shared_vllm)
        optimizer.step()
    finally:
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

    from grpo_trainer.serve.command_lines import inference_command
    from grpo_trainer.serve.launch import ServerProcess
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
            if time.monotonic() > args.deadline:
                cell["batches"][batch] = {"skipped": "out of time"}
                break
            rows = []
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            oom = None
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
                oom = str(error).splitlines()[0][:200]
            except Exception as error:  # keep the batches measured so far
                cell["batches"][batch] = {"error": repr(error)[:300]}
                break
            if oom is not None:  # outside the except: the failed step's tensors are gone
                optimizer.zero_grad(set_to_none=True)
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                cell["batches"][batch] = {"oom": oom}
                print(f"{shape} {mode} batch {batch}: out of memory", flush=True)
                if strategy.sleeps:  # colocate: wake the engine before we stop
                    try:
                        strategy.sync(model, step)
                    except Exception as error:
                        cell["wake_after_oom"] = repr(error)[:300]
                break
            medians = {k: statistics.median(r[k] for r in rows[1:] or rows) for k in rows[0]}
            medians["step_s"] = medians["train_s"] + medians["sleep_s"] + medians["sync_s"]
            medians["with_generate_s"] = medians["step_s"] + medians["generate_s"]
            if device.type == "cuda":
                medians["peak_gb"] = torch.cuda.max_memory_allocated(device) / GB
            cell["batches"][batch] = medians
            print(f"{shape} {mode} batch {batch}: {json.dumps(medians)}", flush=True)
        if "wake_after_oom" not in cell:
            try:
                cell["served_after"] = generate(server.base_url, settings.served_model_name, args)
            except Exception as error:
                cell["served_after"] = repr(error)[:300]
    finally:
        if strategy is not None:
            strategy.close()
        server.stop(timeout=8)  # vLLM 0.24 may not finish its HTTP shutdown: then SIGKILL
    return cell


def largest(cell: dict) -> tuple[int | None, dict | None]:
    fits = [(b, r) for b, r in cell["batches"].items() if "step_s" in r]
    return max(fits, key=lambda item: item[0]) if fits else (None, None)


def _num(row: dict | None, key: str, spec: str = ".3f") -> str:
    value = (row or {}).get(key)
    return "-" if value is None else f"{value:{spec}}"


def report(cells: list[dict], args: argparse.Namespace) -> str:
    by = {(c["shape"], c["mode"]): c for c in cells}
    micro = "whole batch" if not args.micro_batch else f"micro-batch {args.micro_batch}"
    lines = [
        f"# colocate vs shared_vllm on one GPU ({args.backend}, {args.device}, {args.dtype})",
        "",
        f"- {args.gpu_name}; seq_len {args.seq_len} per sample ({micro} per forward/backward), "
        f"AdamW, gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}; "
        + (
            f"vLLM gpu_memory_utilization {args.gpu_memory_utilization} in both modes, "
            "--enforce-eager, random weights (--load-format dummy)"
            if args.backend == "vllm"
            else "the built-in server (a check of the harness: CPU has no OOM to find)"
        )
        + f"; generate = one request of {args.gen_n} x {args.gen_tokens} tokens",
        "- step s = sleep + train + sync (what the trainer waits for); + generate = the same "
        "plus the generation before it (in a real run `shared_vllm` overlaps generation "
        "with training, `colocate` cannot); medians of steps 2.. at each batch",
        "",
        f"## Largest batch that trains ({args.search_shape})",
        "",
        "| mode | largest batch | OOM at | step s at it | peak GB (torch) | free GB while training "
        "| step s / + generate at batch " + str(args.batches[0]) + " |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        cell = by.get((args.search_shape, mode))
        if cell is None:
            continue
        if cell.get("error"):
            lines.append(f"| {mode} | failed: {cell['error'][:160]} ||||||")
            continue
        batch, row = largest(cell)
        first = cell["batches"].get(args.batches[0])
        oom = next((b for b, r in cell["batches"].items() if "oom" in r), "none")
        lines.append(
            f"| {mode} | {batch} | {oom} | {_num(row, 'step_s')} | {_num(row, 'peak_gb', '.1f')} "
            f"| {_num(row, 'free_in_train_gb', '.1f')} | {_num(first, 'step_s')} / "
            f"{_num(first, 'with_generate_s')} |"
        )
    co, sh = by.get((args.search_shape, "colocate")), by.get((args.search_shape, "shared_vllm"))
    if co and sh and not co.get("error") and not sh.get("error"):
        (cb, crow), (sb, srow) = largest(co), largest(sh)
        if cb and sb:
            at_sb = co["batches"].get(sb) or {}
            same_batch = (
                f"at batch {sb}, shared_vllm's largest: colocate {at_sb['step_s']:.3f} s vs "
                f"{srow['step_s']:.3f} s ({at_sb['step_s'] / srow['step_s']:.2f}x)"
                if "step_s" in at_sb
                else f"colocate has no step at batch {sb}"
            )
            lines += [
                "",
                f"colocate / shared_vllm largest batch: {cb} / {sb} = {cb / sb:.2f}x (goal "
                ">= 1.5x; the batch list's resolution). Step time (goal <= 1.1x): "
                f"{same_batch}; at each one's largest batch {crow['step_s']:.3f} s / "
                f"{srow['step_s']:.3f} s, per sample {crow['step_s'] / cb * 1000:.1f} ms / "
                f"{srow['step_s'] / sb * 1000:.1f} ms "
                f"({crow['step_s'] / cb / (srow['step_s'] / sb):.2f}x)",
            ]
    lines += [
        "",
        f"## Per step at batch {args.batches[0]}: sleep + wake + load overhead",
        "",
        "| shape | params | mode | sleep s | wake s | load s | sync total s | train s | "
        "step s | generate s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in dict.fromkeys([args.search_shape, *args.shapes]):
        for mode in MODES:
            cell = by.get((shape, mode))
            if cell is None:
                continue
            row = cell["batches"].get(args.batches[0])
            if cell.get("error") or not row or "step_s" not in row:
                why = cell.get("error") or (row or {}).get("oom") or "not run"
                lines.append(f"| {shape} | - | {mode} | n/a: {str(why)[:120]} |||||||")
                continue
            lines.append(
                f"| {shape} | {cell['params'] / 1e9:.2f}e9 | {mode} "
                f"| {_num(row, 'sleep_s', '.4f')} "
                f"| {_num(row, 'sync_wake_s', '.4f')} | {_num(row, 'sync_push_s', '.4f')} "
                f"| {_num(row, 'sync_s', '.4f')} | {_num(row, 'train_s')} | {_num(row, 'step_s')} "
                f"| {_num(row, 'generate_s')} |"
            )
    return "\n".join(lines) + "\n"


def gpu_name(device: str) -> str:
    import torch

    if not device.startswith("cuda"):
        return "cpu"
    props = torch.cuda.get_device_properties(torch.device(device))
    return f"{props.name}, {props.total_memory / GB:.0f} GB, torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", default="/tmp/colocate_gpu")
    parser.add_argument("--backend", choices=["vllm", "builtin"], default="vllm")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--shapes",
        type=lambda s: [x for x in s.split(",") if x],
        default=["qwen2.5-0.5b", "qwen2.5-3b"],
        help="overhead shapes (the search shape is reported too)",
    )
    parser.add_argument("--overhead-modes", type=lambda s: s.split(","), default=["colocate"])
    parser.add_argument("--search-shape", default="qwen2.5-1.5b")
    parser.add_argument(
        "--batches",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[4, 8, 12, 16, 24, 32, 48, 64, 96, 128],
    )
    parser.add_argument("--micro-batch", type=int, default=0, help="0 = the whole batch")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--gen-n", type=int, default=16)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2, help="steps per batch")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument(
        "--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=False
    )
    parser.add_argument("--start-timeout", type=float, default=240)
    parser.add_argument("--budget", type=float, default=1e9, help="seconds for all cells")
    parser.add_argument(
        "--cell-seconds", type=float, default=90, help="a cell starts only with this much left"
    )
    args = parser.parse_args()
    # SIGTERM (the device script's time cap) unwinds like an exception: every cell's
    # `finally` stops its server, which runs in its own session and would outlive us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    unknown = [s for s in {*args.shapes, args.search_shape} if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    args.deadline = time.monotonic() + args.budget
    args.gpu_name = gpu_name(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    plan = [(args.search_shape, mode, args.batches) for mode in MODES]
    plan += [
        (shape, mode, args.batches[:1])
        for shape in args.shapes
        if shape != args.search_shape
        for mode in args.overhead_modes
    ]
    cells = []
    for shape, mode, batches in plan:
        if args.deadline - time.monotonic() < args.cell_seconds:
            print(f"{shape} {mode}: skipped, out of time", flush=True)
            cells.append({"shape": shape, "mode": mode, "batches": {}, "error": "out of time"})
            continue
        try:
            cells.append(run_cell(shape, mode, batches, args))
        except Exception as error:  # one failed cell must not lose the others' numbers
            print(f"{shape} {mode} failed: {error!r}", flush=True)
            cells.append({"shape": shape, "mode": mode, "batches": {}, "error": repr(error)})
        (args.out / "colocate_gpu.json").write_text(json.dumps(cells, indent=1, default=str))
        (args.out / "colocate_gpu.md").write_text(report(cells, args))
    table = report(cells, args)
    (args.out / "colocate_gpu.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
