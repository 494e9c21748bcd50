"""TRL's ``GRPOTrainer`` on the GPU workload, for ``gpu_workload.py`` to run side by side.

The same model directory, batch (``--prompts`` x ``--group-size``), lengths (``--prompt-len``
letters, one token each; ``--completion-len`` tokens, fixed with ``ignore_eos``), loss
(``loss_type`` ``grpo``, clip ``epsilon`` = ``epsilon_high``, ``beta``), micro-batch and
gradient accumulation, learning rate, bf16 weights, no gradient checkpointing, and the same
reward (``workload_task.digit_share``) as grpo-tui's run. One generation of the whole batch
per optimizer step (TRL's ``steps_per_generation`` = gradient accumulation).

Writes ``--out`` (JSON): the wall time of every optimizer step (a ``TrainerCallback``),
the wall-clock time (``time.time()``) of each step's end (start-up is measured to the
first, as for grpo-tui; the GPU's clock samples are cut at them), per step the seconds in
its vLLM's ``generate`` and in Python's garbage collection (issue 39: what makes TRL's
steps vary), the imports' and the trainer construction's seconds, peak GPU memory (torch,
this process: TRL's trainer and its in-process vLLM), versions; on failure, the exception
and its traceback, so the table shows why TRL did not run.

Two TRL trainers:

- ``--mode colocate`` (default): ``GRPOTrainer``, vLLM in the trainer's process on its GPU.
  ``--no-is-correction`` sets ``vllm_importance_sampling_correction=False`` (TRL's default
  is on: an extra no-grad forward over the whole batch each step). ``--kv-cache-gib`` gives
  its vLLM the same fixed KV cache as ours (``kv_cache_memory_bytes``).
- ``--mode async``: ``trl.experimental.async_grpo.AsyncGRPOTrainer`` against a ``vllm
  serve`` that ``gpu_workload.py`` started on another GPU (``--server-url``): generation runs
  continuously beside training, samples at most ``--max-staleness`` versions old (1, as
  ours with one step of overlap), weights over NCCL after every step (``async_trl.py``).

    python benchmarks/trl_workload.py --model DIR --out trl.json            # vLLM colocate
    python benchmarks/trl_workload.py --model DIR --out t.json --no-vllm \\
        --prompts 2 --prompt-len 8 --completion-len 4 --micro-batch 4 --steps 2   # CPU smoke
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from workload_task import prompt_text, trl_reward

STEP_CLOCKS = {"generate": 0.0, "gc": 0.0}
"""Seconds in vLLM's ``generate`` and in garbage collection since the last step's end."""


def count_gc() -> None:
    """Add every garbage collection's duration to ``STEP_CLOCKS["gc"]`` (``gc.callbacks``)."""
    began = {"t": 0.0}

    def callback(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            began["t"] = time.perf_counter()
        elif began["t"]:
            STEP_CLOCKS["gc"] += time.perf_counter() - began["t"]
            began["t"] = 0.0

    gc.callbacks.append(callback)


def step_timer(record: dict[str, Any], out: str) -> Any:
    """A ``TrainerCallback`` that records each optimizer step's wall time (generation
    included), its end (``time.time()``: start-up ends at the first) and its generate and
    gc seconds in ``record``, and rewrites ``out`` after every step, so partial results
    survive a kill."""
    from transformers import TrainerCallback

    steps: list[float] = []
    marks = {"last": 0.0}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            marks["last"] = marks["last"] or time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            now = time.perf_counter()
            record.setdefault("first_step_end", time.time())
            record.setdefault("step_ends", []).append(time.time())
            record.setdefault("generate_s_per_step", []).append(round(STEP_CLOCKS["generate"], 4))
            record.setdefault("gc_s_per_step", []).append(round(STEP_CLOCKS["gc"], 4))
            STEP_CLOCKS.update(generate=0.0, gc=0.0)
            steps.append(now - marks["last"])
            marks["last"] = now
            record["step_times"] = steps
            Path(out).write_text(json.dumps(record, indent=1))

    return StepTimer()


def timed_generate(llm: Any) -> Any:
    """``llm`` with its ``generate`` timed into ``STEP_CLOCKS["generate"]``."""
    generate = llm.generate

    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            STEP_CLOCKS["generate"] += time.perf_counter() - began

    llm.generate = timed
    return llm


def shared_settings(args: argparse.Namespace, on_gpu: bool) -> dict[str, Any]:
    """What both TRL trainers (``GRPOConfig``, ``AsyncGRPOConfig``) take from the workload:
    the batch, lengths, optimizer, clip and steps of ours, no checkpoints, no reporting."""
    return {
        "output_dir": str(Path(args.out).with_suffix("")) + "-run",
        "per_device_train_batch_size": args.micro_batch,
        "gradient_accumulation_steps": args.prompts * args.group_size // args.micro_batch,
        "num_generations": args.group_size,
        "max_completion_length": args.completion_len,
        "temperature": 1.0,
        "learning_rate": args.lr,
        "lr_scheduler_type": "constant",
        "max_grad_norm": 1.0,
        "epsilon": args.clip_eps,
        "epsilon_high": args.clip_eps,
        "max_steps": args.steps,
        "bf16": on_gpu,
        "use_cpu": not on_gpu,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 0,
    }


def run(args: argparse.Namespace, record: dict[str, Any]) -> None:
    began = time.perf_counter()
    import torch
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    if not args.no_vllm:  # TRL has no flags for these: its colocated LLM gets the keywords
        from trl.generation import vllm_generation

        engine = vllm_generation.LLM
        extra: dict[str, Any] = {"enforce_eager": args.enforce_eager}
        if args.kv_cache_gib:
            extra["kv_cache_memory_bytes"] = args.kv_cache_gib << 30

        def with_extra(*a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            llm = engine(*a, **(kw | extra))
            record["vllm_init_s"] = time.perf_counter() - started
            return timed_generate(llm)

        vllm_generation.LLM = with_extra
    record["import_s"] = time.perf_counter() - began  # torch, transformers, TRL (+ vLLM)
    count_gc()

    rng = random.Random(0)
    prompts = [prompt_text(rng, args.prompt_len) for _ in range(args.prompts * (args.steps + 1))]
    # A given fingerprint: datasets would otherwise hash the Arrow table with dill, which
    # fails on newer pyarrow types (PicklingError: MonthDayNano, datasets 5.2 + pyarrow 26).
    dataset = Dataset(InMemoryTable.from_pydict({"prompt": prompts}), fingerprint="workload")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    lengths = {len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts[:8]}
    record["prompt_tokens"] = sorted(lengths)
    vllm = {} if args.no_vllm else {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": args.vllm_gpu_memory_utilization,
        "vllm_max_model_length": args.prompt_len + args.completion_len + 16,
        "vllm_importance_sampling_correction": not args.no_is_correction,
    }  # fmt: skip
    fixed = {"ignore_eos": True} if not args.no_vllm else {"min_new_tokens": args.completion_len}
    on_gpu = torch.cuda.is_available() and not args.no_vllm
    config = GRPOConfig(
        **shared_settings(args, on_gpu),
        warmup_steps=0,
        loss_type=args.loss_type,
        beta=args.beta,
        num_iterations=1,
        model_init_kwargs={"dtype": "bfloat16" if on_gpu else "float32"},
        generation_kwargs=fixed,
        shuffle_dataset=False,
        **vllm,
    )
    record["enforce_eager"] = args.enforce_eager
    record["kv_cache_gib"] = args.kv_cache_gib
    record["config"] = {
        k: getattr(config, k)
        for k in (
            "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
            "steps_per_generation", "num_generations", "max_completion_length", "loss_type",
            "epsilon", "epsilon_high", "beta", "use_vllm", "vllm_mode", "gradient_checkpointing",
            "bf16", "vllm_importance_sampling_correction",
        )
    }  # fmt: skip
    started = time.perf_counter()
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=trl_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[step_timer(record, args.out)],
    )
    record["init_s"] = time.perf_counter() - started  # model load + vLLM start-up
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    if on_gpu:
        record["peak_memory_gb"] = torch.cuda.max_memory_reserved() / 1e9
    lengths = [
        float(entry["completions/mean_length"])
        for entry in trainer.state.log_history
        if "completions/mean_length" in entry
    ]
    record["completion_mean_length"] = lengths
    record["status"] = "ok"


def run_async(args: argparse.Namespace, record: dict[str, Any]) -> None:
    """``AsyncGRPOTrainer`` against the vLLM server at ``--server-url`` (``async_trl.py``)."""
    from async_trl import train_async

    train_async(args, record)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--completion-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--loss-type", default="grpo")
    parser.add_argument("--clip-eps", type=float, default=0.2)
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--mode", choices=["colocate", "async"], default="colocate")
    parser.add_argument(
        "--no-is-correction",
        action="store_true",
        help="vllm_importance_sampling_correction=False (TRL's default: on)",
    )
    parser.add_argument("--kv-cache-gib", type=int, default=0, help="vLLM KV cache, GiB")
    parser.add_argument("--server-url", default="http://127.0.0.1:8000", help="async: vLLM")
    parser.add_argument("--max-staleness", type=int, default=1, help="async: policy lag")
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.25)
    parser.add_argument("--no-vllm", action="store_true", help="transformers generate (CPU)")
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs")
    args = parser.parse_args(argv)
    record: dict[str, Any] = {
        "status": "failed",
        "mode": "no-vllm" if args.no_vllm else args.mode,
        "started": time.time(),
    }
    for dist in ("trl", "transformers", "torch", "vllm", "datasets", "accelerate"):
        try:
            record[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            record[dist] = "not installed"
    try:
        (run_async if args.mode == "async" else run)(args, record)
    except BaseException as error:  # the table shows why TRL did not run, never a crash
        record["error"] = f"{type(error).__name__}: {error}"[:2000]
        record["traceback"] = traceback.format_exc()[-6000:]
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "traceback"})[:3000], flush=True)
    return 0 if record["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
