"""Trainer step: chunked selected-token logprobs vs the naive full log-softmax.

One training step (forward, GRPO loss, backward) of a randomly initialised Qwen2 model on
random sequences, run for each variant in a fresh subprocess so peak memory is its own.
Prints tokens/s and peak memory side by side, one chunked row per ``--chunk-size`` (several
sizes in one call save GPU time). Each chunked row comes twice: the LM head over every
position (``all``, the trainer before issue 31) and over the trained positions only
(``trained``, the trainer now: ``positions`` = the loss mask, the first ``--prompt-len``
tokens untrained, as a GRPO prompt). When TRL is importable, its ``selective_log_softmax``
(TRL's memory-saving logprob path over full logits) joins as a row, with the same GRPO
loss on top. ``--entropy`` also computes the per-token entropy, as the trainer does for
its metrics. ``--optimizers`` times one AdamW step with torch's foreach and fused kernels
on the same gradients and prints their largest difference after ``--steps`` steps (fused
is the trainer's default on CUDA: that row is the GPU's equality check).

    python benchmarks/trainer_step.py                       # CPU, small model
    python benchmarks/trainer_step.py --shape qwen2.5-0.5b --device cuda --dtype bfloat16 \\
        --seq-len 384 --prompt-len 128 --batch 32 --chunk-size 256 --entropy --optimizers

CPU peak memory is the step's peak RSS above the RSS before the first step; CUDA peak
memory is ``torch.cuda.max_memory_allocated`` during the timed steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import time

from model_shapes import SHAPES


def measure(args: argparse.Namespace) -> dict:
    import psutil
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_trainer.models import DTYPES
    from grpo_trainer.train.logprobs import (
        TokenLogprobs,
        chunked_token_logprobs,
        naive_token_logprobs,
    )
    from grpo_trainer.train.loss import LossSettings, policy_loss

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[args.shape], max_position_embeddings=max(args.seq_len, 512))
    model = Qwen2ForCausalLM(config).to(device=args.device, dtype=DTYPES[args.dtype])
    model.train()
    b, length = args.batch, args.seq_len
    ids = torch.randint(0, config.vocab_size, (b, length), device=args.device)
    attention = torch.ones_like(ids)
    mask = torch.ones(b, length - 1, device=args.device)
    mask[:, : args.prompt_len - 1] = 0  # the first trained label is the completion's first
    mu = torch.full((b, length - 1), -5.0, device=args.device)
    adv = torch.randn(b, 1, device=args.device).expand(b, length - 1)
    temps = torch.ones(b, device=args.device)

    def step() -> None:
        if args.variant in ("chunked", "trained"):
            out = chunked_token_logprobs(
                model,
                ids,
                attention,
                temps,
                chunk_size=args.chunk_size[0],
                with_entropy=args.entropy,
                positions=mask if args.variant == "trained" else None,
            )
        elif args.variant == "trl":
            from trl.trainer.utils import selective_log_softmax

            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
            logp = selective_log_softmax(logits / temps[:, None, None], ids[:, 1:])
            out = TokenLogprobs(logp, None)
        else:
            out = naive_token_logprobs(model, ids, attention, temps, with_entropy=args.entropy)
        loss = policy_loss(
            out.logprobs,
            mu,
            adv,
            mask,
            LossSettings(),
            step_sequences=b,
            step_tokens=int(mask.sum()),
            max_len=length,
        ).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    cuda = args.device.startswith("cuda")
    rss_before = psutil.Process().memory_info().rss
    step()  # warm-up (allocator, kernels)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 1e9
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before) / 1e9
    names = {"chunked": "chunked {} all", "trained": "chunked {} trained"}
    return {
        "variant": names.get(args.variant, args.variant).format(args.chunk_size[0]),
        "tokens_per_s": b * length * args.steps / elapsed,
        "step_s": elapsed / args.steps,
        "peak_gb": peak,
    }


def measure_optimizers(args: argparse.Namespace) -> dict:
    """One AdamW step per kernel (foreach, fused) on the same gradients: seconds per step
    and the largest parameter difference after ``--steps`` steps."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_trainer.models import DTYPES

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[args.shape], max_position_embeddings=512)
    model = Qwen2ForCausalLM(config).to(device=args.device, dtype=DTYPES[args.dtype])
    ids = torch.randint(0, config.vocab_size, (2, 64), device=args.device)
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    start = [p.detach().clone() for p in model.parameters()]
    cuda = args.device.startswith("cuda")
    out: dict = {"variant": "optimizers"}
    finals = {}
    for kernel in ("foreach", "fused"):
        with torch.no_grad():
            for p, s in zip(model.parameters(), start, strict=True):
                p.copy_(s)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, **{kernel: True})
        times = []
        for _ in range(args.steps + 1):  # the first step allocates the state: not counted
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g.clone()
            if cuda:
                torch.cuda.synchronize()
            began = time.perf_counter()
            optimizer.step()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
        out[f"{kernel}_step_s"] = sorted(times[1:])[len(times[1:]) // 2]
        finals[kernel] = [p.detach().clone() for p in model.parameters()]
        del optimizer
    diff = max(
        float((a.float() - b.float()).abs().max()) for a, b in zip(*finals.values(), strict=True)
    )
    moved = max(
        float((a.float() - s.float()).abs().max())
        for a, s in zip(finals["fused"], start, strict=True)
    )
    out |= {"max_abs_diff": diff, "max_move": moved, "steps": args.steps + 1}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, nargs="+", default=[256])
    parser.add_argument("--prompt-len", type=int, help="untrained leading tokens (seq_len / 3)")
    parser.add_argument("--entropy", action="store_true", help="also compute the entropy")
    parser.add_argument("--optimizers", action="store_true", help="AdamW foreach vs fused")
    parser.add_argument(
        "--variant",
        choices=["chunked", "trained", "naive", "trl", "optimizers"],
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args()
    args.prompt_len = args.prompt_len or args.seq_len // 3
    if args.variant:
        result = measure_optimizers(args) if args.variant == "optimizers" else measure(args)
        print(json.dumps(result))
        return
    rows = []
    runs = [(kind, size) for size in args.chunk_size for kind in ("chunked", "trained")]
    runs.append(("naive", args.chunk_size[0]))
    if importlib.util.find_spec("trl") is not None:
        runs.append(("trl", args.chunk_size[0]))
    for variant, size in runs:
        # The last --chunk-size on the command line wins: the child measures one size.
        argv = [sys.executable, __file__, *sys.argv[1:], "--variant", variant]
        child = subprocess.run([*argv, "--chunk-size", str(size)], capture_output=True, text=True)
        if child.returncode != 0:  # e.g. out of memory: report it, keep the other rows
            tail = child.stderr.strip().splitlines()[-1:] or [f"exit {child.returncode}"]
            print(f"{variant} {size} failed: {tail[0]}", file=sys.stderr)
            continue
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
    print(
        f"shape={args.shape} device={args.device} dtype={args.dtype} batch={args.batch} "
        f"seq_len={args.seq_len} prompt_len={args.prompt_len} steps={args.steps} "
        f"entropy={args.entropy}"
    )
    naive = next((row for row in rows if row["variant"] == "naive"), None)
    print(f"{'variant':<22}{'tokens/s':>12}{'step s':>10}{'peak GB':>10}{'memory':>9}{'speed':>8}")
    for row in rows:
        ratios = ""
        if naive is not None:
            ratios = (
                f"{row['peak_gb'] / naive['peak_gb']:>8.2f}x"
                f"{row['tokens_per_s'] / naive['tokens_per_s']:>7.2f}x"
            )
        print(
            f"{row['variant']:<22}{row['tokens_per_s']:>12.0f}{row['step_s']:>10.3f}"
            f"{row['peak_gb']:>10.3f}{ratios}"
        )
    print("memory and speed are relative to naive; target: memory <= 0.60x at speed >= 1.00x")
    if args.optimizers:
        argv = [sys.executable, __file__, *sys.argv[1:], "--variant", "optimizers"]
        child = subprocess.run(argv, capture_output=True, text=True)
        if child.returncode != 0:
            tail = child.stderr.strip().splitlines()[-1:] or [f"exit {child.returncode}"]
            print(f"optimizers failed: {tail[0]}", file=sys.stderr)
            return
        row = json.loads(child.stdout.strip().splitlines()[-1])
        print(
            f"AdamW step: foreach {row['foreach_step_s'] * 1e3:.1f} ms, fused "
            f"{row['fused_step_s'] * 1e3:.1f} ms "
            f"({row['foreach_step_s'] / row['fused_step_s']:.2f}x);"
            f" after {row['steps']} steps of lr 1e-5 the kernels differ by at most "
            f"{row['max_abs_diff']:.3g} (largest move {row['max_move']:.3g})"
        )


if __name__ == "__main__":
    main()
