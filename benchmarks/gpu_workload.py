"""GRPO at a real workload: the floor, grpo-tui and TRL side by side (issues 15, 31).

A GSM8K-shaped step with no downloads: a Qwen2.5-0.5B or 1.5B shape at random init (real
vocabulary of 151,936, bf16), ``--prompts`` 64 x ``--group-size`` 8 sequences per step,
128-token prompts and 256-token completions of fixed length (``ignore_eos`` everywhere, so
every system does the same work), one synthetic reward (``workload_task.digit_share``).
A lane (``--device cuda:N``, or ``cuda:A+B`` for the two-GPU parts) runs its ``--parts``
one after the other, ``--repeats`` times, alternating (A B A B ...), each inside what is
left of ``--budget`` and its own cap; the lane's JSON (``--json``) is rewritten after every
run, so a lane killed at its deadline keeps what it measured.

One GPU:

  floor     vLLM generating the batch alone (64 concurrent requests, n = 8) and our trainer
            step alone on that batch (``python -m grpo_trainer.train --batches-file``)
  sync      ``grpo-tui run``, ``shared_vllm``, synchronous (``max_batches_offpolicy = 0``)
  trl-best  TRL ``GRPOTrainer``, vLLM colocate, ``vllm_importance_sampling_correction``
            off (TRL at its best for throughput: no extra forward over the batch)
  trl       the same at TRL's defaults (the correction on)
  overlap   ``grpo-tui run``, ``shared_vllm``, one step of overlap: 1-step off-policy
  lora      ``grpo-tui run``, ``lora_only``, synchronous
  colocate  ``grpo-tui run``, ``colocate``

Two GPUs (a lane naming two; the trainer on the first, vLLM on the second):

  split      ``grpo-tui run``, ``shared_vllm``, weights over NCCL, one step of overlap
  trl-async  TRL ``AsyncGRPOTrainer``, ``max_staleness = 1``, its ``vllm serve`` on the second
             GPU, weights over NCCL (``async_trl.py``)
  colocate2  ``grpo-tui run``, ``colocate``, 2 FSDP2 ranks + 2 vLLM replicas, synchronous

Settings shared by every system: vLLM with CUDA graphs (``--eager`` for the second table),
a ``--kv-cache-gib`` KV cache (TRL's colocated vLLM gets ``kv_cache_memory_bytes`` too),
``--max-num-seqs`` = the batch. Step times are wall-clock intervals between consecutive
optimizer steps, the first step not counted (``--steps 11``: 10 counted); start-up is from
the command's start to the end of the first optimizer step, for every system. The report
(``workload_report.py``) pairs runs on the same GPUs and repeat for every ratio.

    python benchmarks/gpu_workload.py --size 0.5b --device cuda:0 --parts sync trl-best \\
        --repeats 1 --out /tmp/w --json OUT/lane-0.json --budget 540
    python benchmarks/gpu_workload.py --size 0.5b --out /tmp/w --dry-run     # profiles, check
    python benchmarks/gpu_workload.py --quick --out /tmp/w                   # CPU, tiny
    python benchmarks/gpu_workload.py --combine OUT/lane-*.json > results.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import tomli_w
from gpu_idle import GpuSampler, wait_empty
from gpu_modes import _lines, facts, free_ports, run_id_of, sweep, tail, vllm_cli
from model_shapes import qwen2_config
from workload_report import PARTS, TWO_GPU_PARTS, Part, combine, save
from workload_startup import run_startup, trl_startup
from workload_task import PROMPT_CHARS, Workload

REPO = Path(__file__).resolve().parents[1]
TASK = "benchmarks.workload_task:Workload"
SIZES = {"0.5b": ("qwen2.5-0.5b", 32), "1.5b": ("qwen2.5-1.5b", 16)}
"""Size -> (shape in model_shapes.py, sequences per micro-batch: activations of one
micro-batch without gradient checkpointing stay well under the GPU beside vLLM)."""
MIB = 1024 * 1024
NEEDS = {"floor": 120, "sync": 120, "trl": 150, "trl-best": 150, "overlap": 120, "lora": 150}
NEEDS |= {"colocate": 120, "split": 130, "trl-async": 150, "colocate2": 150}
"""Seconds a part needs at least (start-up and 11 steps) to be worth starting."""
CAPS = {"floor": 220, "sync": 300, "trl": 330, "trl-best": 300, "overlap": 260, "lora": 420}
CAPS |= {"colocate": 300, "split": 260, "trl-async": 300, "colocate2": 330}
"""Seconds a part may take at most (its deadline), so that one that hangs leaves time to
the next: start-up (60-100 s with CUDA graphs) and 11 steps at the step times of
benchmarks/results/gpu_workload.md with a margin."""


# ------------------------------------------------------------------------- setup


def build_model(path: Path, shape: str, device: str) -> int:
    """Random Qwen2 ``shape`` in bf16 and a tokenizer padded to its vocabulary; parameters."""
    import torch
    from transformers import Qwen2ForCausalLM

    from grpo_trainer.models import build_tiny_tokenizer

    config = qwen2_config(shape, max_position_embeddings=1024)
    tokenizer = build_tiny_tokenizer(vocab_size=config.vocab_size)
    config.bos_token_id = config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    count = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()  # a no-op on CPU
    return count


def ensure_model(models: Path, shape: str, gpu: int | None) -> tuple[Path, int, str]:
    """The model of ``shape`` under ``models``: built (seed 0, the same files every time)
    in a child process when absent, else reused, so that vLLM's compile cache, keyed by the
    model's path, can hit in a later call on a warm machine. The child holds the only CUDA
    context: this process never allocates on the GPU, so the empty-GPU check before each
    run sees none of ours. Returns (path, parameters, how it was had)."""
    path = (models / shape).resolve()
    if not (path / "params.json").is_file():
        staging = path.with_name(f".{path.name}-{os.getpid()}")
        env = dict(os.environ)
        if gpu is not None:
            env |= {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu)}
        device = "cpu" if gpu is None else "cuda:0"
        code = (
            "import json, sys; from pathlib import Path; import gpu_workload as g; "
            "n = g.build_model(Path(sys.argv[1]), sys.argv[2], sys.argv[3]); "
            "(Path(sys.argv[1]) / 'params.json').write_text(json.dumps({'params': n}))"
        )
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "benchmarks"),
                                             env.get("PYTHONPATH", "")])  # fmt: skip
        subprocess.run([sys.executable, "-c", code, str(staging), shape, device],
                       check=True, env=env, cwd=REPO)  # fmt: skip
        try:
            staging.rename(path)
        except OSError:  # a lane of the same call built it first: theirs is the same
            shutil.rmtree(staging, ignore_errors=True)
        how = "built"
    else:
        how = "reused"
    params = int(json.loads((path / "params.json").read_text())["params"])
    return path, params, how


def child_env(args: argparse.Namespace) -> dict[str, str]:
    """Our processes' environment: this lane's GPUs only, multicast off, few CPU threads."""
    env = dict(os.environ)
    if args.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, args.gpus))
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env |= {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    env |= {"NVSHMEM_DISABLE_NVLS": "1", "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "4")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    paths = [str(REPO), str(REPO / "benchmarks"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group we started (``start_new_session``) and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def new_cell(work: Path, part: str, repeat: int) -> Path:
    """A run's own folder, created now: a folder left by an earlier run (another call on a
    warm machine) is refused, never read (issue 39: a lane paired a ``sync`` row from the
    previous call's folder as if it were new)."""
    cell = work / f"{part}-{repeat}"
    cell.parent.mkdir(parents=True, exist_ok=True)
    try:
        cell.mkdir()
    except FileExistsError:
        raise FileExistsError(
            f"{cell} exists: a run folder from an earlier call; each call gets its own "
            "--call-id (and work folder), and a run never reads another's files"
        ) from None
    return cell


# ----------------------------------------------------------------- settings of a run


def placement(args: argparse.Namespace, part: str) -> tuple[list[int], list[int]]:
    """(trainer GPUs, inference GPUs) of a part: the lane's first GPU for one-GPU parts;
    ``split`` the first for the trainer and the second for vLLM; ``colocate2`` both for both.
    Empty on CPU."""
    if args.gpu is None:
        return [], []
    first, *rest = args.gpus
    if part in ("split", "trl-async"):
        return [first], rest[:1]
    if part == "colocate2":
        return list(args.gpus), list(args.gpus)
    return [first], [first]


def inference_table(args: argparse.Namespace, port: int, part: str = "floor") -> dict[str, Any]:
    """``[inference]`` for this size and part (also the floor's server)."""
    table: dict[str, Any] = {"backend": args.backend, "port": port, "dtype": args.dtype}
    table["max_model_len"] = args.prompt_len + args.completion_len + 64
    if part == "colocate2":  # one replica per trainer rank (built-in on CPU: per gloo rank)
        table["data_parallel_size"] = 2
    if args.backend == "vllm":
        table |= {
            "gpus": placement(args, part)[1],
            "gpu_memory_utilization": args.vllm_memory,
            "enforce_eager": args.eager,
            "vllm_executable": vllm_cli(),
            "max_lora_rank": 16,
            # A fixed KV cache: no free-memory profiling beside the trainer, and room for
            # the whole batch (prompts x group x (prompt + completion)) at once (per replica).
            "extra_args": [
                "--kv-cache-memory-bytes",
                str(args.kv_cache_gib * 1024 * MIB),
                "--max-num-seqs",
                str(args.prompts * args.group_size),  # TRL's value too
            ],
        }
        if part == "split":
            table["weight_transfer"] = "nccl"
    else:
        table["device"] = args.device
    return table


def trainer_table(args: argparse.Namespace, mode: str, part: str = "floor") -> dict[str, Any]:
    """``[trainer]``: the loss, batch and optimizer TRL gets too (the global batch: a trainer
    of 2 ranks trains half of it on each)."""
    batch = args.prompts * args.group_size
    table: dict[str, Any] = {
        "device": "cuda" if args.gpu is not None else args.device,
        "dtype": args.dtype,
        "lr": args.lr,
        "loss_type": "grpo",
        "clip_eps": args.clip_eps,
        "beta": 0.0,
        "training_steps": 1000,  # stopped after --steps steps (no final checkpoint)
        "batch_size": args.micro,
        "gradient_accumulation_steps": batch // args.micro,
        "seq_len": args.prompt_len + args.completion_len,
        "checkpoint_interval": 1000,
        "sync_every": 1,
        "max_sync_lag": 1,
    }
    if args.gpu is not None:
        table["gpus"] = placement(args, part)[0]
    elif part == "colocate2":
        table["ranks"] = 2  # gloo ranks on CPU, one per built-in replica
    if mode == "lora_only":
        table |= {"lora_r": 16, "lora_alpha": 32, "lora_target_modules": ["q_proj", "v_proj"]}
    return table


def profile_for(
    args: argparse.Namespace, part: str, mode: str, bound: int, ports: list[int], runs: Path
) -> dict[str, Any]:
    """The profile of one grpo-tui part."""
    return {
        "run": {"name": part, "mode": mode, "model": str(args.model), "output_dir": str(runs)},
        "api": {"port": ports[0], "max_batches_offpolicy": bound},
        "inference": inference_table(args, ports[1], part),
        "trainer": trainer_table(args, mode, part),
        "env": [
            {
                "task": TASK,
                "group_size": args.group_size,
                "max_concurrency": args.prompts,  # the whole batch in flight, as TRL does
                "max_tokens": args.completion_len,
                "ignore_eos": True,
                "temperature": 1.0,
                "max_token_length": args.prompt_len + args.completion_len,
            }
        ],
    }


GRPO_PARTS = {
    "sync": ("shared_vllm", 0),
    "overlap": ("shared_vllm", 1),
    "lora": ("lora_only", 0),
    "colocate": ("colocate", 0),
    "split": ("shared_vllm", 1),
    "colocate2": ("colocate", 0),
}


# ---------------------------------------------------------------------- the parts


def trainer_steps(path: Path) -> list[dict[str, Any]]:
    """The trainer's optimizer-step records of a metrics file, in step order."""
    records = [
        r
        for r in _lines(path)
        if r.get("type") == "metrics" and r.get("step") and "step_time" in r.get("data", {})
    ]
    return sorted(records, key=lambda r: r["step"])


def intervals(records: list[dict[str, Any]]) -> list[float]:
    """Wall time of each step after the first: the gaps between step records."""
    times = [float(r["t"]) for r in records]
    return [b - a for a, b in itertools.pairwise(times)]


def floor_generate(args: argparse.Namespace, cell: Path, result: Part, deadline: float) -> Path:
    """Serve the model alone and time ``--floor-reps`` generations of one batch; returns a
    batches file holding that batch ``--steps`` times, for the trainer-alone half."""
    from grpo_trainer.envs.groups import build_group
    from grpo_trainer.envs.inference import SamplingRequest, complete
    from grpo_trainer.envs.task import Prompt
    from grpo_trainer.envs.tokenizer import load_prompt_tokenizer
    from grpo_trainer.serve.command_lines import inference_command
    from grpo_trainer.serve.launch import ServerProcess
    from grpo_trainer.serve.settings import InferenceSettings

    port = free_ports(1, first=23000 + 100 * (args.gpu or 0))[0]
    table = {k: v for k, v in inference_table(args, port).items() if k != "gpus"}
    settings = InferenceSettings.model_validate(table)
    launch = inference_command(settings, mode="none", model=str(args.model))
    launch = launch.model_copy(update={"env": {**launch.env, **_gpu_env(args)}})
    server = ServerProcess(launch, settings.base_url, cell / "floor-server.log")
    tokenizer = load_prompt_tokenizer(str(args.model))
    task = Workload(seed=0)
    rng = random.Random(1)
    prompts = [tokenizer.encode(task.sample(rng).text) for _ in range(args.prompts)]
    result.extra["prompt_tokens"] = sorted({len(p) for p in prompts})
    request = SamplingRequest("policy", args.group_size, args.completion_len, 1.0, 1.0, True)

    async def batch() -> list[list[Any]]:
        import httpx

        limits = httpx.Limits(max_connections=args.prompts)
        async with httpx.AsyncClient(
            base_url=settings.base_url, timeout=600, limits=limits
        ) as client:
            return await asyncio.gather(*(complete(client, p, request) for p in prompts))

    result.startup_s = server.start(timeout=max(60.0, deadline - time.monotonic() - 30))
    try:
        times, samples = [], []
        for _ in range(args.floor_reps):
            if time.monotonic() > deadline - 20:
                break
            began = time.perf_counter()
            samples = asyncio.run(batch())
            times.append(time.perf_counter() - began)
    finally:
        server.stop()
    result.extra["generate_all_s"] = times
    result.extra["generate_s"] = statistics.median(times[1:]) if len(times) > 1 else None
    lengths = [len(s.token_ids) for group in samples for s in group]
    result.extra["completion_tokens"] = [min(lengths, default=0), max(lengths, default=0)]
    lines = []
    for ids, group in zip(prompts, samples, strict=True):
        scores = [task.score(Prompt(), tokenizer.decode(s.token_ids)) for s in group]
        built = build_group(ids, group, scores, temperature=1.0, policy_version=0)
        lines.append(json.dumps(built.payload(env_id=None)))
    path = cell / "floor-batches.jsonl"
    path.write_text("\n".join(lines * (args.steps + 1)) + "\n")
    return path


def _gpu_env(args: argparse.Namespace) -> dict[str, str]:
    env = child_env(args)
    keys = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_NVLS_ENABLE")
    keys += ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
    return {k: env[k] for k in keys if k in env}


def floor_train(
    args: argparse.Namespace, cell: Path, batches: Path, result: Part, deadline: float
) -> None:
    """Our trainer alone on the floor's batch: ``--steps`` steps, then stopped."""
    table = trainer_table(args, "none")
    table.pop("gpus", None)
    table |= {"sync_every": 0, "max_sync_lag": 0, "group_size": args.group_size}
    metrics = cell / "floor-trainer-metrics.jsonl"
    argv = [sys.executable, "-m", "grpo_trainer.train", "--model-name", str(args.model)]
    for key, value in table.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    argv += ["--batches-file", str(batches), "--metrics-file", str(metrics)]
    argv += ["--save-path", str(cell / "floor-checkpoints"), "--weight-bridge-mode", "none"]
    result.extra["trainer_argv"] = argv[2:]
    with (cell / "floor-trainer.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=child_env(args), cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if len(trainer_steps(metrics)) >= args.steps:
                break
            time.sleep(0.5)
    finally:
        stop_group(proc)
    records = trainer_steps(metrics)
    result.extra["train_s_all"] = intervals(records)
    result.extra["train_compute_s"] = [float(r["data"]["step_time"]) for r in records]
    result.extra["train_s"] = statistics.median(intervals(records)) if len(records) > 1 else None
    result.extra["trainer_peak_gb"] = max(
        (float(r["data"].get("peak_memory_gb", 0)) for r in records), default=None
    )
    if not records:
        result.reason = f"trainer exit {proc.returncode}: {tail(cell / 'floor-trainer.log', 15)}"


def run_floor(args: argparse.Namespace, work: Path, deadline: float) -> Part:
    server = "vLLM" if args.backend == "vllm" else "built-in server"
    result = Part("floor", f"{server} alone + our trainer alone")
    cell = new_cell(work, "floor", args.repeat)
    with GpuSampler(args.gpus or None) as sampler:
        batches = floor_generate(args, cell, result, deadline - 60)
        floor_train(args, cell, batches, result, deadline)
    result.gpu_peak_mib = sampler.peak_mib
    result.extra["gpu_samples"] = sampler.compact()
    gen, train = result.extra.get("generate_s"), result.extra.get("train_s")
    if gen is not None and train is not None:
        result.status = "ok"
        result.extra["sum_s"], result.extra["max_s"] = gen + train, max(gen, train)
        result.step_times = [gen + train]
    else:
        result.status = "failed"
    return result


def run_grpo(args: argparse.Namespace, part: str, work: Path, deadline: float) -> Part:
    """One ``grpo-tui run`` until ``--steps`` optimizer steps, then SIGKILL and sweep. The
    run directory is named on the command line (``--run-dir``, refused if it exists): only
    this run's files are ever read."""
    mode, bound = GRPO_PARTS[part]
    label = f"grpo-tui {mode}, " + ("synchronous" if bound == 0 else f"{bound} step overlap")
    label = two_gpu_label(args, part) or label
    result = Part(part, label)
    trainer_gpus, inference_gpus = placement(args, part)
    used = sorted(set(trainer_gpus + inference_gpus))
    result.gpus = used if len(used) > 1 else []
    cell = new_cell(work, part, args.repeat)
    run_dir = cell / "run"
    ports = free_ports(2, first=21000 + 1000 * (args.gpu or 0) + 10 * PARTS.index(part))
    profile = cell / "profile.toml"
    profile.write_text(tomli_w.dumps(profile_for(args, part, mode, bound, ports, cell / "runs")))
    command = [sys.executable, "-m", "grpo_tui", "run", str(profile), "--json"]
    command += ["--run-dir", str(run_dir)]
    started = time.time()
    run_id = ""
    with GpuSampler(used or None) as sampler:
        with (
            (cell / "supervisor.jsonl").open("wb") as out,
            (cell / "supervisor.err").open("wb") as err,
        ):
            proc = subprocess.Popen(
                command, stdout=out, stderr=err, cwd=REPO, env=child_env(args),
                start_new_session=True,
            )  # fmt: skip
        supervisor = psutil.Process(proc.pid)
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                run_id = run_id or run_id_of(supervisor)
                if len(trainer_steps(run_dir / "metrics.jsonl")) >= args.steps:
                    break
                time.sleep(0.5)
        finally:
            stop_group(proc)  # no final checkpoint: the run is measured, not kept
            result.extra["leftovers"] = sweep(run_id, wait=10.0)
    result.gpu_peak_mib = sampler.peak_mib
    result.extra["gpu_samples"] = sampler.compact()
    records = trainer_steps(run_dir / "metrics.jsonl")
    result.step_times = intervals(records)
    result.extra["step_ends"] = [float(r["t"]) for r in records]
    result.extra["startup"] = run_startup(run_dir, started)
    if records:
        result.startup_s = float(records[0]["t"]) - started  # to the first step's end
        data = [r["data"] for r in records]
        for key in ("step_time", "data_wait_time", "sync_time", "off_policy_lag"):
            result.extra[key] = [float(d[key]) for d in data if key in d]
        result.extra["completion_len"] = [float(d.get("completion_len/mean", 0)) for d in data]
        result.extra["trainer_peak_gb"] = max(float(d.get("peak_memory_gb", 0)) for d in data)
    if len(records) >= 2:
        result.status = "ok" if len(records) >= args.steps else "partial: out of time"
    else:
        result.status = "failed" if proc.returncode not in (None, -9) else "timeout"
        logs = sorted(run_dir.glob("logs/*.log"))
        result.reason = " | ".join(
            f"{p.name}: {tail(p, 6)}" for p in [cell / "supervisor.err", *logs] if tail(p, 1)
        )[-3000:]
    return result


def two_gpu_label(args: argparse.Namespace, part: str) -> str:
    """What a two-GPU part runs, GPUs named (empty for the other parts)."""
    trainer, served = placement(args, part)
    if part == "split":
        if args.gpu is None:
            return "grpo-tui shared_vllm, CPU check: trainer and built-in server, no NCCL"
        return (
            f"grpo-tui shared_vllm split: trainer GPU {trainer[0]}, vLLM GPU {served[0]}, "
            "NCCL sync, 1 step overlap"
        )
    if part == "colocate2":
        where = "2 gloo ranks + 2 built-in replicas (CPU check)"
        if args.gpu is not None:
            where = f"2 FSDP2 ranks + 2 vLLM replicas on GPUs {'+'.join(map(str, trainer))}"
        return f"grpo-tui colocate, {where}, synchronous"
    return ""


TRL_LABELS = {
    "trl-best": "TRL GRPOTrainer, vLLM colocate, IS correction off",
    "trl": "TRL GRPOTrainer, vLLM colocate, TRL defaults (IS correction on)",
    "trl-async": "TRL AsyncGRPOTrainer, max_staleness 1, vllm serve on the second GPU",
}


def trl_argv(args: argparse.Namespace, part: str, out: Path) -> list[str]:
    """``trl_workload.py``'s command line for one TRL part."""
    argv = [sys.executable, str(REPO / "benchmarks/trl_workload.py"), "--model", str(args.model)]
    argv += ["--out", str(out), "--prompts", str(args.prompts)]
    argv += ["--group-size", str(args.group_size), "--prompt-len", str(args.prompt_len)]
    argv += ["--completion-len", str(args.completion_len), "--micro-batch", str(args.micro)]
    argv += ["--steps", str(args.steps), "--lr", str(args.lr), "--clip-eps", str(args.clip_eps)]
    argv += ["--vllm-gpu-memory-utilization", str(args.trl_vllm_memory)]
    argv += ["--kv-cache-gib", str(args.kv_cache_gib)]
    if part == "trl-best":
        argv.append("--no-is-correction")
    if part == "trl-async":
        argv += ["--mode", "async", "--max-staleness", "1"]
    if args.backend != "vllm":
        argv.append("--no-vllm")
    elif args.eager:
        argv.append("--enforce-eager")
    return argv


def trl_server(args: argparse.Namespace, work: Path, gpu: int) -> Any:
    """``vllm serve`` for ``AsyncGRPOTrainer`` on ``gpu``: our command builder's vLLM line
    (same KV cache, max-num-seqs, CUDA graphs or not), with TRL's requirements: dev mode,
    NCCL weight transfer, and the model path as served name (TRL requests that name)."""
    from grpo_trainer.serve.command_lines import inference_command
    from grpo_trainer.serve.launch import ServerProcess
    from grpo_trainer.serve.settings import InferenceSettings

    port = free_ports(1, first=24000 + 100 * gpu)[0]
    table = {k: v for k, v in inference_table(args, port).items() if k != "gpus"}
    table["extra_args"] = [*table["extra_args"], "--weight-transfer-config", '{"backend": "nccl"}']
    settings = InferenceSettings.model_validate(table)
    launch = inference_command(settings, mode="none", model=str(args.model))
    argv = list(launch.argv)
    argv[argv.index("--served-model-name") + 1] = str(args.model)
    env = {**launch.env, **_gpu_env(args), "CUDA_VISIBLE_DEVICES": str(gpu)}
    env["VLLM_SERVER_DEV_MODE"] = "1"
    launch = launch.model_copy(update={"argv": argv, "env": env})
    return ServerProcess(launch, settings.base_url, work / "trl-server.log")


def run_trl(args: argparse.Namespace, part: str, work: Path, deadline: float) -> Part:
    """One TRL run (``trl_workload.py``) in its own process group; ``trl-async`` starts
    its vLLM server on the lane's second GPU first (start-up counts from there)."""
    how = TRL_LABELS[part] if args.backend == "vllm" else "TRL, transformers generate (CPU check)"
    result = Part(part, how)
    cell = new_cell(work, part, args.repeat)
    out = cell / "trl.json"
    argv = trl_argv(args, part, out)
    # TRL's one-process torch.distributed group listens on MASTER_PORT (29500 by default):
    # TRL in lanes on other GPUs of the same call would clash there.
    rendezvous = free_ports(1, first=29500 + 10 * (args.gpu or 0))[0]
    env = child_env(args) | {"MASTER_PORT": str(rendezvous)}
    trainer_gpu, served_gpus = placement(args, part)
    server = None
    proc: subprocess.Popen[bytes] | None = None
    started = time.time()
    with GpuSampler(sorted(set(trainer_gpu + served_gpus)) or None) as sampler:
        try:
            if part == "trl-async":
                result.gpus = [*trainer_gpu, *served_gpus]
                server = trl_server(args, cell, served_gpus[0])
                server.start(timeout=max(60.0, deadline - time.monotonic() - 60))
                env |= {"CUDA_VISIBLE_DEVICES": str(trainer_gpu[0])}
                argv += ["--server-url", server.base_url]
            with (cell / "trl.log").open("wb") as log:
                proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                    start_new_session=True,
                )  # fmt: skip
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            finally:
                stop_group(proc)
        finally:
            if server is not None:
                server.stop()
    result.gpu_peak_mib = sampler.peak_mib
    record: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(out.read_text())
    times = [float(t) for t in record.get("step_times", [])]
    result.step_times = times[1:]
    if record.get("first_step_end"):
        result.startup_s = float(record["first_step_end"]) - started
    keys = ("trl", "datasets", "config", "prompt_tokens", "init_s", "attention", "step_ends")
    keys += ("generate_s_per_step", "gc_s_per_step", "import_s")
    result.extra = {k: record.get(k) for k in keys if k in record}
    result.extra["gpu_samples"] = sampler.compact()
    log = ""
    with contextlib.suppress(OSError), (cell / "trl.log").open("rb") as handle:
        log = handle.read(8 << 20).decode(errors="replace")  # vLLM's start-up comes first
    result.extra["startup"] = trl_startup(record, log, started)
    result.extra["completion_len"] = record.get("completion_mean_length")
    result.extra["peak_memory_gb"] = record.get("peak_memory_gb")
    if record.get("status") == "ok" and len(times) >= args.steps:
        result.status = "ok"
    elif result.step_times:
        result.status = "partial: out of time"
    else:
        code = None if proc is None else proc.returncode
        result.status = "failed" if code not in (None, -9) else "timeout"
        result.reason = record.get("error") or tail(cell / "trl.log", 12)
        if proc is None and server is not None:
            result.reason = f"its vLLM server did not start: {tail(cell / 'trl-server.log', 12)}"
        result.extra["traceback"] = record.get("traceback")
    return result


# --------------------------------------------------------------------------- main


def dry_run(args: argparse.Namespace, work: Path) -> int:
    """Write every grpo-tui part's profile and ``grpo-tui check`` it; print the TRL argv."""
    failures = 0
    two = argparse.Namespace(**vars(args))
    if len(two.gpus) < 2:  # the two-GPU parts are checked on this GPU and the next
        two.gpus = [args.gpu, args.gpu + 1]
    for part in GRPO_PARTS:
        mode, bound = GRPO_PARTS[part]
        lane = two if part in TWO_GPU_PARTS else args
        profile = work / part / "profile.toml"
        profile.parent.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2, first=21000 + 10 * PARTS.index(part))
        profile.write_text(tomli_w.dumps(profile_for(lane, part, mode, bound, ports, work)))
        done = subprocess.run(
            [sys.executable, "-m", "grpo_tui", "check", str(profile)],
            capture_output=True, text=True, cwd=REPO, env=child_env(args),
        )  # fmt: skip
        failures += done.returncode != 0
        print(f"== {part}: check exit {done.returncode}\n{done.stdout[-1500:]}{done.stderr}")
    return 1 if failures else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=list(SIZES), default="0.5b")
    parser.add_argument(
        "--device",
        default="cuda:0",
        help="cuda:N (physical index), cuda:A+B (two GPUs: split, colocate2) or cpu",
    )
    parser.add_argument("--out", type=Path, help="work folder (models, runs, logs)")
    parser.add_argument("--json", type=Path, help="the lane's results (default: in --out)")
    parser.add_argument("--budget", type=float, default=510.0, help="seconds for every part")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--repeats", type=int, default=1, help="passes over --parts")
    parser.add_argument(
        "--order",
        choices=["swap", "same"],
        default="swap",
        help="swap: each pass runs --parts in the reverse order of the pass before (A B, "
        "then B A: both orders on the same GPU); same: A B A B",
    )
    parser.add_argument(
        "--call-id",
        default=None,
        help="this call's id: its runs' folders, the JSON and the report's pairing "
        "(default: the UTC time and pid); a run never pairs with another call's",
    )
    parser.add_argument(
        "--models",
        type=Path,
        default=None,
        help="where the model is built, or reused if there (default: the work folder); "
        "keep it across calls so that vLLM's compile cache, keyed by the model path, hits",
    )
    parser.add_argument(
        "--empty-timeout",
        type=float,
        default=90.0,
        help="seconds to wait before each run for the lane's GPUs to be empty (no compute "
        "process, at most --empty-mib used); the run's row records what was found",
    )
    parser.add_argument(
        "--empty-mib",
        type=float,
        default=1024.0,
        help="memory in use (MiB) at most on an empty GPU (issue 39: 1 GiB)",
    )
    parser.add_argument("--steps", type=int, default=11, help="optimizer steps per run")
    parser.add_argument("--floor-reps", type=int, default=3, help="floor generations")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-len", type=int, default=256)
    parser.add_argument("--micro", type=int, default=None, help="sequences per micro-batch")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--clip-eps", type=float, default=0.2)
    parser.add_argument(
        "--eager",
        action="store_true",
        help="vLLM eager in every system (default: torch.compile and CUDA graphs, vLLM's and "
        "TRL's default; eager start-ups are ~20 s instead of ~60 s)",
    )
    parser.add_argument("--vllm-memory", type=float, default=0.3, help="gpu_memory_utilization")
    parser.add_argument("--kv-cache-gib", type=int, default=16)
    parser.add_argument("--trl-vllm-memory", type=float, default=0.3)
    parser.add_argument("--quick", action="store_true", help="CPU: built-in server, tiny shape")
    parser.add_argument("--dry-run", action="store_true", help="profiles + grpo-tui check only")
    parser.add_argument("--combine", nargs="+", type=Path, help="per-size JSON files to merge")
    args = parser.parse_args(argv)
    if args.combine:
        return args
    if args.out is None:
        parser.error("--out is required")
    shape, micro = SIZES[args.size]
    args.shape, args.micro = (
        ("small", args.micro or 4) if args.quick else (shape, args.micro or micro)
    )
    args.backend = "builtin" if args.quick and not args.dry_run else "vllm"
    if args.backend == "builtin":
        args.device = "cpu"
    args.repeat = 0  # the pass being run (main sets it)
    args.position = 0  # the run's place in its pass (main sets it)
    args.call = args.call_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"
    if args.quick:
        args.completion_len = min(args.completion_len, 8)
        args.prompts, args.steps, args.floor_reps = min(args.prompts, 2), min(args.steps, 3), 2
    args.prompt_len = PROMPT_CHARS  # the task's prompts: one token per character
    args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    head, _, index = args.device.partition(":")
    args.gpus = [int(i) for i in (index or "0").split("+")] if head == "cuda" else []
    if len(args.gpus) > 2 or len(set(args.gpus)) != len(args.gpus):
        parser.error(f"--device {args.device}: one GPU, or two different ones (cuda:A+B)")
    args.gpu = args.gpus[0] if args.gpus else None
    if args.dry_run and args.gpu is None:
        args.gpu, args.gpus = 0, [0]
    if (args.prompts * args.group_size) % args.micro:
        parser.error(f"--micro {args.micro} does not divide the batch")
    return args


def run_order(parts: list[str], repeats: int, order: str) -> list[tuple[int, int, str]]:
    """(pass, place in the pass, part) of every run of a lane: ``swap`` reverses every
    other pass (A B, B A, A B ...), so a pair of two parts runs in both orders."""
    out = []
    for repeat in range(repeats):
        names = parts[::-1] if order == "swap" and repeat % 2 else parts
        out += [(repeat, position, name) for position, name in enumerate(names)]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.combine:
        print(combine(args.combine), end="")
        return 0
    # SIGTERM (the device script's timeout) unwinds, so a running part stops its process
    # group in its ``finally`` instead of leaving a run behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    end = began + args.budget
    out: Path = args.out.resolve()
    work = out / f"work-{args.size}" / args.call  # this call's runs only
    work.mkdir(parents=True, exist_ok=True)
    info = facts(args)
    with contextlib.suppress(Exception):
        import importlib.metadata

        info["trl"] = importlib.metadata.version("trl")
    info["call"] = args.call
    models = (args.models or work).resolve()
    gpu = None if args.dry_run else args.gpu
    args.model, args.params, how = ensure_model(models, args.shape, gpu)
    print(f"gpu_workload {args.size}: call {args.call}, model {args.params / 1e9:.2f} B "
          f"{how} in {time.monotonic() - began:.0f} s ({args.model}); {info}",
          flush=True)  # fmt: skip
    if args.dry_run:
        return dry_run(args, work)
    path = args.json.resolve() if args.json else out / f"gpu_workload_{args.size}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    runs: list[Part] = []
    for repeat, position, name in run_order(args.parts, args.repeats, args.order):
        args.repeat, args.position = repeat, position  # the run's folder and its pairing
        result = run_part(args, name, work, end)
        result.repeat, result.position, result.call = repeat, position, args.call
        print(f"gpu_workload {args.size}: {name} #{repeat} {result.status} steps "
              f"{[round(t, 2) for t in result.step_times]}", flush=True)  # fmt: skip
        runs.append(result)
        save(args, runs, info, path)  # after every run: a killed lane keeps its rows
    print(save(args, runs, info, path), flush=True)
    print(f"gpu_workload {args.size}: done in {time.monotonic() - began:.0f} s", flush=True)
    return 0 if all(p.status == "ok" for p in runs) else 1


def run_part(args: argparse.Namespace, name: str, work: Path, end: float) -> Part:
    """One run of one part inside what is left of the budget and the part's own cap, on
    GPUs checked empty first (the check goes in its row)."""
    if name in TWO_GPU_PARTS and args.gpu is not None and len(args.gpus) != 2:
        reason = f"not run: needs two GPUs (a lane such as {args.size}:0+1:{name})"
        return Part(name, name, status=reason)
    if name == "trl-async" and args.backend != "vllm":
        return Part(name, name, status="not run: AsyncGRPOTrainer needs a vllm serve (GPU)")
    trainer, served = placement(args, name)
    gpus = sorted(set(trainer + served))
    empty = wait_empty(
        gpus,
        timeout=max(0.0, min(args.empty_timeout, end - time.monotonic())),
        max_used_mib=args.empty_mib,
    )
    print(f"gpu_workload {args.size}: GPUs {gpus or '-'} before {name}: {empty.describe()}",
          flush=True)  # fmt: skip
    left = end - time.monotonic()
    if left < (20 if args.quick else NEEDS[name]):
        result = Part(name, name, status=f"not run: out of time ({left:.0f} s left)")
    else:
        print(f"gpu_workload {args.size}: {name} #{args.repeat} with {left:.0f} s left",
              flush=True)  # fmt: skip
        deadline = min(end, time.monotonic() + CAPS[name] * (3 if args.quick else 1))
        try:
            if name == "floor":
                result = run_floor(args, work, deadline)
            elif name in TRL_LABELS:
                result = run_trl(args, name, work, deadline)
            else:
                result = run_grpo(args, name, work, deadline)
        except Exception as error:  # one broken part must not cost the others
            result = Part(name, name, status="error", reason=f"{type(error).__name__}: {error}")
    result.extra["gpu_before"] = empty.to_json()
    return result


if __name__ == "__main__":
    sys.exit(main())
