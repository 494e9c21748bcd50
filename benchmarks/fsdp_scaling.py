"""The trainer on 1 GPU vs 2 GPUs (FSDP2 under torchrun), same global batch, same data.

For each dtype: the real trainer (``python -m grpo_trainer.train`` on ``cuda:0``, then
``torchrun --standalone --nproc-per-node 2 -m grpo_trainer.train`` on GPUs 0-1) trains
``--steps`` steps on one batches file of random-token groups (random init, a Qwen2.5
shape). Reported side by side: trainer tokens/s (median over steps 2..), peak memory per
GPU (torch ``max_memory_allocated``), and the loss / gradient norm of steps 1-2 with
their relative difference (the equivalence of one optimizer step on 1 and 2 ranks).

float32 is the like-for-like pair (both keep float32 weights, gradients and AdamW state).
bfloat16 is not: one process trains pure bf16 weights (as today), FSDP2 keeps float32
master shards and computes in bf16 (``MixedPrecisionPolicy``), so its numbers are stated,
not compared to 1e-5.

    python benchmarks/fsdp_scaling.py --out $OUT [--shape qwen2.5-0.5b] [--steps 6] \
        [--trainer-flag=--gradient-checkpointing]
    python benchmarks/fsdp_scaling.py --out /tmp/x --device cpu --shape small   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from model_shapes import qwen2_config

REPO = Path(__file__).resolve().parents[1]
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def build_model(shape: str, path: Path) -> None:
    """A random-init model of ``shape`` with the tiny tokenizer (ids stay below its vocab)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from grpo_trainer.models import build_tiny_tokenizer

    if (path / "config.json").exists():
        return
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(shape))
    model.to(torch.float32).save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)


def write_batches(path: Path, *, steps: int, groups: int, group_size: int, length: int) -> int:
    """``steps`` batches of random-token groups; returns the tokens per step."""
    rng = random.Random(0)
    prompt = length // 4
    with path.open("w") as handle:
        for _ in range(steps * groups):
            tokens = [[rng.randrange(5, 40) for _ in range(length)] for _ in range(group_size)]
            handle.write(
                json.dumps(
                    {
                        "tokens": tokens,
                        "masks": [[-100] * prompt + seq[prompt:] for seq in tokens],
                        "scores": [rng.random() for _ in tokens],
                        "inference_logprobs": [
                            [1.0] * prompt + [-rng.uniform(5, 15) for _ in seq[prompt:]]
                            for seq in tokens
                        ],
                    }
                )
                + "\n"
            )
    return groups * group_size * length


def run(args: argparse.Namespace, ranks: int, dtype: str, work: Path) -> dict[str, Any]:
    # the trainer checkpoints at its end (weights + optimizer: ~8 GB for 0.5B in float32):
    # in memory when /dev/shm exists, and dropped after the run
    scratch = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
    save = scratch / f"fsdp_scaling-ck-{ranks}-{dtype}"
    metrics = work / f"metrics-{ranks}-{dtype}.jsonl"
    metrics.unlink(missing_ok=True)
    flags = [
        "--model-name", str(work / "model"), "--batches-file", str(work / "batches.jsonl"),
        "--save-path", str(save), "--metrics-file", str(metrics),
        "--device", "cuda" if args.device == "cuda" else "cpu", "--dtype", dtype,
        "--training-steps", str(args.steps), "--sync-every", "0", "--lr", "1e-5",
        "--loss-type", "dapo", "--batch-size", str(args.micro_batch),
        "--gradient-accumulation-steps", str(args.groups * args.group_size // args.micro_batch),
        "--seq-len", str(args.length), "--checkpoint-interval", "0", "--keep-checkpoints", "1",
        *args.trainer_flag,
    ]  # fmt: skip
    env = {**os.environ, **NCCL_ENV, "PYTHONUNBUFFERED": "1"}
    if args.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(ranks))
    head = [sys.executable, "-m"]
    if ranks > 1:
        head += ["torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), "-m"]
    started = time.monotonic()
    done = subprocess.run(
        [*head, "grpo_trainer.train", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    shutil.rmtree(save, ignore_errors=True)
    row: dict[str, Any] = {"ranks": ranks, "dtype": dtype, "wall_s": time.monotonic() - started}
    if done.returncode != 0:
        row["error"] = (done.stdout + done.stderr)[-2000:]
        return row
    records = [json.loads(line)["data"] for line in metrics.read_text().splitlines()]
    row["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in records[1:] or records)
    row["step_time_s"] = statistics.median(r["step_time"] for r in records[1:] or records)
    row["peak_gb"] = [
        records[-1].get(f"gpu_memory_gb/rank{r}", records[-1]["peak_memory_gb"])
        for r in range(ranks)
    ]
    row["loss"] = [r["loss"] for r in records[:2]]
    row["grad_norm"] = [r["grad_norm"] for r in records[:2]]
    return row


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def table(args: argparse.Namespace, rows: list[dict[str, Any]], tokens: int) -> str:
    lines = [
        "# Trainer on 1 vs 2 GPUs (FSDP2), same global batch",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; device: {args.device}",
        f"- model: random {args.shape}; batch: {args.groups} groups x {args.group_size} x "
        f"{args.length} tokens = {tokens} tokens per step; micro-batch {args.micro_batch}; "
        f"{args.steps} steps (median over steps 2..); AdamW; loss dapo; extra trainer flags: "
        f"{' '.join(args.trainer_flag) or 'none'}",
        "",
        "| dtype | ranks | tokens/s | speed-up | step s | peak GB per GPU | vs 1 GPU "
        "| loss step 1, 2 | grad norm step 1, 2 | max rel. diff vs 1 GPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dtype in args.dtypes:
        one = next((r for r in rows if r["dtype"] == dtype and r["ranks"] == 1), None)
        for row in (r for r in rows if r["dtype"] == dtype):
            if "error" in row:
                lines.append(f"| {dtype} | {row['ranks']} | failed | | | | | | | |")
                continue
            base = one if one is not None and "error" not in one else None
            speed = f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
            memory = f"{max(row['peak_gb']) / max(base['peak_gb']):.2f}x" if base else "-"
            diff = "-"
            if base and row["ranks"] > 1:
                pairs = zip(
                    row["loss"] + row["grad_norm"], base["loss"] + base["grad_norm"], strict=True
                )
                diff = f"{max(rel(a, b) for a, b in pairs):.1e}"
            lines.append(
                f"| {dtype} | {row['ranks']} | {row['tokens_per_s']:.0f} | {speed} "
                f"| {row['step_time_s']:.3f} | {', '.join(f'{g:.2f}' for g in row['peak_gb'])} "
                f"| {memory} | {', '.join(f'{v:.6g}' for v in row['loss'])} "
                f"| {', '.join(f'{v:.6g}' for v in row['grad_norm'])} | {diff} |"
            )
    lines += [
        "",
        "Goals (issue 12): tokens/s on 2 GPUs >= 1.8x, peak memory per GPU <= 0.6x, float32 "
        "loss and grad norm within 1e-5 (relative). bfloat16: 1 GPU trains pure bf16 weights, "
        "2 GPUs float32 master shards with bf16 compute: different numerics, stated only.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/fsdp_scaling_work"))
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument(
        "--trainer-flag",
        action="append",
        default=[],
        help="extra trainer flag for every run, e.g. --trainer-flag=--gradient-checkpointing",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    build_model(args.shape, args.work / "model")
    tokens = write_batches(
        args.work / "batches.jsonl",
        steps=args.steps,
        groups=args.groups,
        group_size=args.group_size,
        length=args.length,
    )
    rows = []
    for dtype in args.dtypes:
        for ranks in (1, 2):
            row = run(args, ranks, dtype, args.work)
            print(f"fsdp_scaling: {json.dumps(row)[:600]}", flush=True)
            rows.append(row)
    text = table(args, rows, tokens)
    print(text, flush=True)
    (args.out / "fsdp_scaling.md").write_text(text)
    (args.out / "fsdp_scaling.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
