"""GPU benchmark of the four weight-sync modes, vLLM and built-in backends, in one device call.

For each (backend, mode) cell this writes a profile and runs ``grpo-tui run PROFILE --json``
(the real supervisor over the real API, inference server, trainer and toy environment) on
a randomly initialised Qwen2 model built on the machine, then reads the run directory's
``metrics.jsonl``: sync latency per sync (median, max), inference tokens/s while training
(``inference/tokens_per_s``, scraped by the supervisor), trainer tokens/s, GPU memory of
each process (``process/<name>/gpu_memory_bytes``, NVML), reward of the first vs the last
steps, and ``alignment/diff_abs_mean`` (trainer vs server logprobs of the sampled tokens).
It adds the shared-mode memory proof (trainer memory with and without its own weight copy)
and the no-orphan check with real vLLM (SIGKILL the supervisor, then look for any process
carrying the run's ``GRPO_TUI_RUN_ID`` and for its pids in NVML's process list).

Cells run concurrently by default (one GPU, 16 cores): the whole thing fits one device
call, and the table says so, since throughput is then shared. Every cell has a deadline;
a cell that fails or times out keeps its partial numbers and its log tails go to the
diagnostics file, so one device call is enough to understand any failure.

    python benchmarks/gpu_modes.py --out OUT                      # the device run (vLLM + builtin)
    python benchmarks/gpu_modes.py --out /tmp/g --backends builtin --device cpu --quick
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import tomli_w

from grpo_trainer.serve.capabilities import restarts_inference
from grpo_trainer.serve.command_lines import SGLANG_REFUSED
from grpo_tui.supervisor.tree import PROCESS_VAR, RUN_ID_VAR, is_alive, tagged

REPO = Path(__file__).resolve().parents[1]
MODES = ("none", "lora_only", "lora_restart", "shared_vllm")
EXTRA_MODES = ("colocate",)
"""Run only when named with --modes (benchmarks/colocate_device.sh: one GPU, vLLM)."""
LORA_MODES = ("lora_only", "lora_restart")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MIB = 1024 * 1024
PORT_BASE = 21000

SEED_SYNC = {
    "colocate": "-",
    "shared_vllm": "~0 ms",
    "lora_only": "1-5 s (hot-swap)",
    "lora_restart": "30-60 s (restart, ~45 s)",
    "none": "30-60 s (restart)",
}
SEED_TOKENS = {
    "colocate": "-",
    "shared_vllm": "172",
    "lora_restart": "108",
    "lora_only": "13",
    "none": "-",
}

GPU_SHAPE = {
    "hidden_size": 1024,
    "num_layers": 4,
    "num_heads": 16,
    "num_kv_heads": 8,
    "intermediate_size": 2816,
}
"""head_dim 64 (vLLM's attention kernels); ~47M parameters, ~94 MB in bf16: large enough
that one weight copy stands out in per-process GPU memory (the shared-mode proof)."""

TINY_SHAPE = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 128,
}
"""The quickstart's model: for CPU cells (--quick, and built-in shared weights on CPU)."""


LAYOUTS = {
    "same": "every process on GPU 0 (`shared_vllm` zero-copy through CUDA IPC)",
    "split": "**split**: the trainer on GPU 0, vLLM alone on GPU 1 (`shared_vllm` syncs by "
    "vLLM's NCCL weight transfer)",
    "fsdp2": "**fsdp2**: a 2-rank FSDP2 trainer (torchrun) on GPUs 0 and 1, vLLM on GPU 1 "
    "beside rank 1 (`shared_vllm`: rank 0 sends over NCCL)",
    "colocate": "**colocate on both GPUs**: a 2-rank FSDP2 trainer (torchrun) on GPUs 0 and "
    "1, one vLLM replica on each (data_parallel_size 2), asleep while the ranks train; each "
    "replica loaded by CUDA IPC from its own rank's gathered weights (on CPU: 2 gloo ranks, "
    "the built-in server's 2 replicas, shared memory)",
}
TRAINER_GPUS = {"split": [0], "fsdp2": [0, 1], "colocate": [0, 1]}
RANKS = 2
"""Trainer ranks and inference replicas of the ``colocate`` layout."""


@dataclass(frozen=True)
class Cell:
    """One (backend, mode) run and the settings it runs with."""

    backend: str
    mode: str
    device: str
    dtype: str
    model: str
    steps: int
    sync_every: int
    lr: float
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.backend}-{self.mode}"


@dataclass
class CellResult:
    """What one cell measured (None where it could not be measured) and how it ended."""

    backend: str
    mode: str
    device: str
    dtype: str
    lr: float
    note: str
    status: str = "not run"
    exit_code: int | None = None
    reason: str = ""
    wall_s: float = 0.0
    run_dir: str = ""
    run_id: str = ""
    steps_done: int = 0
    steps_planned: int = 0
    sync_times: list[float] = field(default_factory=list)
    inference_tok_s: list[float] = field(default_factory=list)
    trainer_tok_s: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    alignment: list[float] = field(default_factory=list)
    off_policy_lag: list[float] = field(default_factory=list)
    peak_memory_gb: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    """Per-step seconds of each phase (``phase/<name>_s``: generating, sleeping, training,
    syncing, waking), from the trainer's metrics."""
    gpu_memory_max: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    leftovers: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, cell: Cell) -> CellResult:
        """An empty result for ``cell``."""
        result = cls(cell.backend, cell.mode, cell.device, cell.dtype, cell.lr, cell.note)
        result.steps_planned = cell.steps
        return result


# ----------------------------------------------------------------------------- setup


def free_ports(count: int, first: int = PORT_BASE) -> list[int]:
    """``count`` loopback ports from ``first`` upward that nothing listens on.

    Below Linux's ephemeral range (32768+), so that the ports vLLM and the OS pick for
    their own sockets while the cells start cannot take one of ours.
    """
    ports: list[int] = []
    candidate = first
    while len(ports) < count:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
                ports.append(candidate)
            except OSError:
                pass
        candidate += 1
    return ports


def build_model(path: Path, shape: dict[str, int]) -> tuple[Path, int]:
    """Build the tiny-tokenizer Qwen2 model at ``path``; returns (path, parameter count).

    Final norm 1 (Qwen2's init), the shape behind benchmarks/results/gpu_modes.md and this
    script's learning rates; the quickstart's final norm 6 needs its KL recipe instead.
    """
    from safetensors import safe_open

    from grpo_trainer.models import build_tiny_model

    build_tiny_model(path, seed=0, final_norm_weight=1.0, **shape)
    count = 0
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as weights:
            for key in weights.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shape_of = weights.get_slice(key).get_shape()
                numel = 1
                for dim in shape_of:
                    numel *= int(dim)
                count += numel
    return path, count


def sglang_cli() -> list[str]:
    """SGLang's server through the running interpreter. ``SGLANG_PATH`` (set by
    ``sglang_device.sh``: SGLang's own transformers pin) goes first on its PYTHONPATH only,
    so the trainer and environments keep the image's transformers."""
    cli = [sys.executable, "-m", "sglang.launch_server"]
    extra = os.environ.get("SGLANG_PATH")
    if not extra:
        return cli
    return ["env", f"PYTHONPATH={extra}:{os.environ.get('PYTHONPATH', '')}", *cli]


def sglang_settings(mode: str) -> dict[str, Any]:
    """``[inference]`` keys every SGLang cell of ours sets, whatever the recipe."""
    return {
        "enforce_eager": True,  # --disable-cuda-graph: seconds, not a minute, per start
        "sglang_executable": sglang_cli(),
        # Triton kernels and torch sampling: nothing for flashinfer to JIT-compile on a
        # machine without the CUDA toolkit or network.
        "extra_args": ["--attention-backend", "triton", "--sampling-backend", "pytorch"]
        + (["--lora-backend", "triton"] if mode in LORA_MODES else []),
    }


def vllm_cli() -> list[str]:
    """vLLM's CLI through the running interpreter (its wheels may sit on PYTHONPATH only)."""
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def profile_for(
    cell: Cell, *, ports: tuple[int, int], output_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The profile (as a TOML-ready dict) that runs ``cell``."""
    inference: dict[str, Any] = {
        "backend": cell.backend,
        "port": ports[1],
        "dtype": cell.dtype,
        "max_model_len": 512,
        "max_lora_rank": 16,
    }
    if args.layout == "same" and args.pin_gpu is not None and cell.device != "cpu":
        inference["gpus"] = [args.pin_gpu]
    if args.layout == "colocate":  # one replica per trainer rank
        inference["data_parallel_size"] = RANKS
    if cell.backend == "vllm":
        if args.layout == "colocate":
            inference["gpus"] = TRAINER_GPUS["colocate"]
        elif args.layout != "same":  # vLLM on GPU 1, alone (split) or beside rank 1 (fsdp2)
            inference["gpus"] = [1]
            if cell.mode == "shared_vllm":
                inference["weight_transfer"] = "nccl"
        inference |= {
            "enforce_eager": True,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "vllm_executable": vllm_cli(),
            # A fixed KV cache skips vLLM's free-memory profiling, which asserts when another
            # process on the GPU frees memory meanwhile (concurrent cells restart servers).
            "extra_args": ["--kv-cache-memory-bytes", str(args.kv_cache_bytes)],
        }
    elif cell.backend == "sglang":
        inference |= {
            "gpu_memory_utilization": args.gpu_memory_utilization,
            **sglang_settings(cell.mode),
        }
    else:
        inference["device"] = cell.device
    on_gpu = cell.device != "cpu"
    trainer: dict[str, Any] = {
        **({"gpus": TRAINER_GPUS[args.layout]} if args.layout != "same" and on_gpu else {}),
        **({"ranks": RANKS} if args.layout == "colocate" and not on_gpu else {}),
        **({"gpus": inference["gpus"]} if args.layout == "same" and "gpus" in inference else {}),
        "device": cell.device,
        "dtype": cell.dtype,
        "lr": cell.lr,
        "training_steps": cell.steps,
        "batch_size": args.prompts * args.group_size,
        "seq_len": 256,
        "sync_every": cell.sync_every,
        "max_sync_lag": cell.sync_every,
        "checkpoint_interval": 0,
        "keep_checkpoints": 2,
    }
    if cell.mode in LORA_MODES:
        trainer |= {"lora_r": 16, "lora_alpha": 32, "lora_target_modules": LORA_TARGETS}
    return {
        "run": {
            "name": cell.name,
            "mode": cell.mode,
            "model": cell.model,
            "output_dir": str(output_dir),
            "seed": 0,
        },
        "api": {"port": ports[0]}
        | (
            {"max_batches_offpolicy": args.max_batches_offpolicy}
            if args.max_batches_offpolicy is not None
            else {}
        ),
        "inference": inference,
        "trainer": trainer,
        "env": [{"task": "toy", "group_size": args.group_size, "max_concurrency": 8}],
    }


def plan_cells(args: argparse.Namespace, gpu_model: str, tiny_model: str) -> list[Cell]:
    """The cells to run, in table order."""
    cells = []
    for backend in args.backends:
        for mode in args.modes:
            if backend == "sglang" and mode in SGLANG_REFUSED:
                continue  # refused at check time, with the reason (docs/inference.md)
            restart = restarts_inference(mode)
            steps = args.restart_steps if restart else args.steps
            sync_every = args.restart_sync_every if restart else 1
            lr = args.lora_lr if mode in LORA_MODES else args.lr
            device, dtype, model, note = args.device, args.dtype, gpu_model, ""
            if args.quick:
                lr = args.tiny_lr if mode not in LORA_MODES else args.tiny_lora_lr
            cells.append(Cell(backend, mode, device, dtype, model, steps, sync_every, lr, note))
    return cells


# ------------------------------------------------------------------------- running


def run_id_of(supervisor: psutil.Process) -> str:
    """The ``GRPO_TUI_RUN_ID`` its children carry (empty before the first child starts)."""
    with contextlib.suppress(psutil.Error):
        for child in supervisor.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                value = child.environ().get(RUN_ID_VAR)
                if value:
                    return value
    return ""


def describe(proc: psutil.Process) -> str:
    """``pid name [GRPO_TUI_PROCESS] cmdline...`` for a report."""
    try:
        env = proc.environ().get(PROCESS_VAR, "?")
        cmd = " ".join(proc.cmdline())[:140]
        return f"{proc.pid} {proc.name()} [{env}] {cmd}"
    except psutil.Error:
        return f"{proc.pid} (gone)"


def stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the supervisor (ordered shutdown), SIGKILL it after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def sweep(run_id: str, wait: float) -> list[str]:
    """Processes of this run still alive after ``wait`` s (then killed: they are ours)."""
    if not run_id:
        return []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        left = tagged(run_id)
        if not left:
            return []
        time.sleep(0.5)
    left = tagged(run_id)
    described = [describe(p) for p in left]
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return described


def child_env() -> dict[str, str]:
    """The cells' environment: few CPU threads each (many processes share 16 cores)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cell(
    cell: Cell, ports: tuple[int, int], work: Path, deadline: float, args: argparse.Namespace
) -> CellResult:
    """Run one cell to completion or deadline; returns its result (never raises)."""
    result = CellResult.of(cell)
    cell_dir = work / cell.name
    cell_dir.mkdir(parents=True, exist_ok=True)
    profile = cell_dir / "profile.toml"
    profile.write_text(
        tomli_w.dumps(profile_for(cell, ports=ports, output_dir=cell_dir / "runs", args=args))
    )
    started = time.monotonic()
    command = [sys.executable, "-m", "grpo_tui", "run", str(profile), "--json"]
    try:
        with (
            (cell_dir / "supervisor.jsonl").open("wb") as out,
            (cell_dir / "supervisor.err").open("wb") as err,
        ):
            proc = subprocess.Popen(command, stdout=out, stderr=err, cwd=REPO, env=child_env())
            supervisor = psutil.Process(proc.pid)
            timed_out = False
            while proc.poll() is None:
                if not result.run_id:
                    result.run_id = run_id_of(supervisor)
                if time.monotonic() > deadline:
                    timed_out = True
                    stop(proc, grace=args.stop_grace)
                    break
                time.sleep(1.0)
            result.exit_code = proc.wait()
        result.status = "timeout" if timed_out else ("ok" if result.exit_code == 0 else "failed")
    except Exception as error:  # a broken cell must not stop the others
        result.status, result.reason = "error", f"{type(error).__name__}: {error}"
    result.wall_s = time.monotonic() - started
    result.leftovers = sweep(result.run_id, wait=15.0)
    read_run(result, cell_dir)
    return result


def read_run(result: CellResult, cell_dir: Path) -> None:
    """Fill ``result`` from the cell's run directory and the supervisor's JSON lines."""
    runs = sorted((cell_dir / "runs").glob("*/")) if (cell_dir / "runs").is_dir() else []
    if not runs:
        result.reason = result.reason or "no run directory was created"
        return
    run_dir = runs[-1]
    result.run_dir = str(run_dir)
    for line in _lines(cell_dir / "supervisor.jsonl"):
        if line.get("type") == "RunFinished":
            result.reason = str(line.get("reason", ""))
        elif line.get("type") == "Restarting":
            result.restarts += 1
    records = [r for r in _lines(run_dir / "metrics.jsonl") if r.get("type") == "metrics"]
    trainer = [r for r in records if r.get("process") == "trainer" and r.get("step") is not None]
    supervisor = [r for r in records if r.get("process") == "supervisor"]
    for record in trainer:
        data = record["data"]
        if "reward/mean" not in data:
            continue
        result.steps_done = max(result.steps_done, int(record["step"]))
        result.rewards.append(float(data["reward/mean"]))
        for key, target in (
            ("sync_time", result.sync_times),
            ("tokens_per_s", result.trainer_tok_s),
            ("alignment/diff_abs_mean", result.alignment),
            ("off_policy_lag", result.off_policy_lag),
            ("peak_memory_gb", result.peak_memory_gb),
        ):
            if key in data:
                target.append(float(data[key]))
        for key, value in data.items():
            if key.startswith("phase/") and key.endswith("_s") and isinstance(value, int | float):
                result.phases.setdefault(key[6:-2], []).append(float(value))
    window = (trainer[0]["t"], trainer[-1]["t"]) if trainer else None
    for record in supervisor:
        data = record["data"]
        for key, value in data.items():
            if key.startswith("process/") and key.endswith("/gpu_memory_bytes"):
                name = key.split("/")[1]
                result.gpu_memory_max[name] = max(result.gpu_memory_max.get(name, 0), int(value))
        rate = data.get("inference/tokens_per_s")
        if rate is not None and window and window[0] <= record["t"] <= window[1]:
            result.inference_tok_s.append(float(rate))


def _lines(path: Path) -> list[dict[str, Any]]:
    """JSON objects of a JSON-lines file; unreadable lines are skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                out.append(value)
    return out


# --------------------------------------------------------------------- orphan check


def gpu_pids() -> dict[int, int] | None:
    """``pid -> GPU memory bytes`` from NVML; None when NVML is not usable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    found: dict[int, int] = {}
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            found[proc.pid] = found.get(proc.pid, 0) + int(proc.usedGpuMemory or 0)
    return found


def orphan_check(
    cell: Cell, ports: tuple[int, int], work: Path, deadline: float, args: argparse.Namespace
) -> dict[str, Any]:
    """Start a run, wait for inference ready and a trainer step, SIGKILL the supervisor only.

    Passes when no process carrying the run's ``GRPO_TUI_RUN_ID`` (nor any recorded
    descendant pid) is alive afterwards and NVML lists none of their pids.
    """
    report: dict[str, Any] = {"backend": cell.backend, "passed": False, "steps_seen": 0}
    cell_dir = work / "orphan-check"
    cell_dir.mkdir(parents=True, exist_ok=True)
    profile = cell_dir / "profile.toml"
    body = profile_for(cell, ports=ports, output_dir=cell_dir / "runs", args=args)
    body["run"]["name"] = f"orphan-{cell.backend}"
    body["trainer"] |= {"training_steps": 100_000, "sync_every": 0}
    profile.write_text(tomli_w.dumps(body))
    command = [sys.executable, "-m", "grpo_tui", "run", str(profile), "--json"]
    with (
        (cell_dir / "supervisor.jsonl").open("wb") as out,
        (cell_dir / "supervisor.err").open("wb") as err,
    ):
        proc = subprocess.Popen(command, stdout=out, stderr=err, cwd=REPO, env=child_env())
    supervisor = psutil.Process(proc.pid)
    started = time.monotonic()
    ready_at: float | None = None
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            runs = sorted((cell_dir / "runs").glob("*/"))
            if runs:
                events = _lines(runs[-1] / "events.jsonl")
                if ready_at is None and any(
                    e.get("type") == "StateChanged"
                    and e.get("process") == "inference"
                    and e.get("new") == "ready"
                    for e in events
                ):
                    ready_at = time.monotonic()
                steps = [
                    r
                    for r in _lines(runs[-1] / "metrics.jsonl")
                    if r.get("process") == "trainer" and r.get("step")
                ]
                report["steps_seen"] = len(steps)
                if ready_at is not None and (steps or time.monotonic() - ready_at > 60):
                    break
            time.sleep(1.0)
        report["inference_ready_s"] = None if ready_at is None else round(ready_at - started, 1)
        if proc.poll() is not None:
            report["error"] = f"supervisor exited early with {proc.returncode}"
            return report
        if ready_at is None:
            report["error"] = "inference never became ready before the deadline"
        run_id = run_id_of(supervisor)
        report["run_id"] = run_id
        members = supervisor.children(recursive=True)
        members += [p for p in tagged(run_id) if p.pid not in {m.pid for m in members}]
        memory = gpu_pids()
        report["before"] = [
            {
                "process": describe(p),
                "gpu_mib": None if memory is None else round(memory.get(p.pid, 0) / MIB),
            }
            for p in members
        ]
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left: list[psutil.Process] = []
        while time.monotonic() - killed_at < args.orphan_wait:
            left = [p for p in members if is_alive(p)] + [
                p for p in tagged(run_id) if p.pid not in {m.pid for m in members}
            ]
            if not left:
                break
            time.sleep(0.5)
        report["gone_after_s"] = round(time.monotonic() - killed_at, 1)
        report["left"] = [describe(p) for p in left]
        pids = {p.pid for p in members}
        gpu_left: dict[int, int] = {}
        while time.monotonic() - killed_at < args.orphan_wait + 10:
            memory = gpu_pids()
            gpu_left = {} if memory is None else {p: m for p, m in memory.items() if p in pids}
            if not gpu_left:
                break
            time.sleep(0.5)
        report["nvml_available"] = memory is not None
        report["gpu_pids_left"] = {str(p): round(m / MIB) for p, m in gpu_left.items()}
        held = sum(entry["gpu_mib"] or 0 for entry in report["before"])
        report["gpu_mib_held_before"] = held
        report["passed"] = bool(ready_at) and not left and not gpu_left
        for proc_left in left:
            with contextlib.suppress(psutil.Error):
                proc_left.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        report["run_dir"] = str(next(iter(sorted((cell_dir / "runs").glob("*/"))), ""))
    return report


# ------------------------------------------------------------------------- report


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def reward_change(result: CellResult, window: int, margin: float) -> tuple[str, bool | None]:
    """``first -> last`` mean reward over ``window`` steps and whether it rose by ``margin``."""
    if len(result.rewards) < 2:
        return "n/a", None
    k = max(1, min(window, len(result.rewards) // 2))
    first = statistics.fmean(result.rewards[:k])
    last = statistics.fmean(result.rewards[-k:])
    rose = last - first >= margin
    return f"{first:.3f} -> {last:.3f} ({'rose' if rose else 'did not rise'})", rose


def why_missing(result: CellResult, what: str) -> str:
    """A short reason for an empty cell."""
    if result.status in ("failed", "error", "not run") and not result.steps_done:
        return f"n/a ({result.status})"
    if what == "sync" and result.steps_done:
        return "n/a (no sync reached)"
    if what == "gpu" and result.device == "cpu":
        return "n/a (CPU)"
    return "n/a"


def table(results: list[CellResult], args: argparse.Namespace) -> list[str]:
    """The side-by-side table, one row per cell."""
    rows = [
        "| backend | mode | device, dtype, lr | status | steps | syncs | sync median / max "
        "| seed sync | inference tok/s (mean / max) | trainer tok/s (median) | seed tok/s "
        "| GPU MiB inference / trainer | reward first -> last | alignment diff_abs_mean "
        "(step 1 / median) | off-policy lag (mean) |",
        "|" + "---|" * 15,
    ]
    for r in results:
        syncs = len(r.sync_times)
        sync = (
            f"{_seconds(_median(r.sync_times))} / {_seconds(max(r.sync_times))}"
            if r.sync_times
            else why_missing(r, "sync")
        )
        inf = (
            f"{statistics.fmean(r.inference_tok_s):.0f} / {max(r.inference_tok_s):.0f}"
            if r.inference_tok_s
            else why_missing(r, "inference")
        )
        trn = _fmt(_median(r.trainer_tok_s), ".0f") if r.trainer_tok_s else why_missing(r, "t")
        if r.gpu_memory_max:
            gpu = " / ".join(
                f"{r.gpu_memory_max.get(n, 0) / MIB:.0f}" for n in ("inference", "trainer")
            )
        else:
            gpu = why_missing(r, "gpu")
        reward, _ = reward_change(r, args.reward_window, args.reward_margin)
        align = (
            f"{r.alignment[0]:.2e} / {_median(r.alignment):.2e}"
            if r.alignment
            else why_missing(r, "a")
        )
        lag = _fmt(statistics.fmean(r.off_policy_lag), ".2f") if r.off_policy_lag else "n/a"
        status = r.status if r.status == "ok" else f"**{r.status}**"
        device = f"{r.device}, {r.dtype}, lr {r.lr:g}" + (f" ({r.note})" if r.note else "")
        rows.append(
            f"| {r.backend} | {r.mode} | {device} | {status} | {r.steps_done}/{r.steps_planned} "
            f"| {syncs} | {sync} | {SEED_SYNC[r.mode]} | {inf} | {trn} | {SEED_TOKENS[r.mode]} "
            f"| {gpu} | {reward} | {align} | {lag} |"
        )
    return rows


def phase_lines(results: list[CellResult]) -> list[str]:
    """Median seconds per step in each phase (``phase/<name>_s``), cells that report them."""
    reported = [r for r in results if r.phases]
    names = sorted({name for r in reported for name in r.phases})
    if not reported:
        return []
    lines = [
        "Seconds per step in each phase (median over steps; the trainer's `phase/<name>_s`):",
        "",
        "| backend | mode | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for r in reported:
        cells = [_fmt(_median(r.phases.get(name, [])), ".3f") for name in names]
        lines.append(f"| {r.backend} | {r.mode} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def memory_proof(results: list[CellResult], weight_bytes: int) -> list[str]:
    """Shared mode holds one weight copy: the trainer's memory drops by about one copy."""
    lines = ["## Shared-mode memory proof", ""]
    by_key = {(r.backend, r.mode): r for r in results}
    shared, baseline = by_key.get(("vllm", "shared_vllm")), by_key.get(("vllm", "none"))
    if shared is None or baseline is None:
        lines.append("n/a: needs the vllm shared_vllm and vllm none cells.")
        return lines
    copy = weight_bytes / MIB
    lines.append(f"One weight copy of the model (trainer dtype): {copy:.0f} MiB.")
    lines.append("")
    lines.append("| measure | shared_vllm | none (own copy) | none - shared | verdict |")
    lines.append("|---|---|---|---|---|")
    pairs = [
        (
            "trainer GPU MiB (NVML, max)",
            shared.gpu_memory_max.get("trainer"),
            baseline.gpu_memory_max.get("trainer"),
            MIB,
        ),
        (
            "trainer torch peak MiB (max_memory_allocated)",
            max(shared.peak_memory_gb, default=None),
            max(baseline.peak_memory_gb, default=None),
            1e9 / MIB,
        ),
        (
            "inference GPU MiB (NVML, max)",
            shared.gpu_memory_max.get("inference"),
            baseline.gpu_memory_max.get("inference"),
            MIB,
        ),
    ]
    for label, a, b, scale in pairs:
        if a is None or b is None:
            lines.append(f"| {label} | n/a | n/a | n/a | not measured |")
            continue
        a_mib = a / MIB if scale == MIB else a * scale
        b_mib = b / MIB if scale == MIB else b * scale
        diff = b_mib - a_mib
        if label.startswith("inference"):
            verdict = "same server memory either way" if abs(diff) < 0.5 * copy else "differs"
        elif 0.5 * copy <= diff <= 1.5 * copy:
            verdict = "about one copy less: the trainer uses vLLM's weights"
        elif label.startswith("trainer GPU") and abs(diff) < 0.5 * copy:
            verdict = (
                f"{diff / copy:.2f} copies: NVML may count the CUDA-IPC-mapped vLLM weights in "
                "the trainer too; the torch row counts the trainer's own allocations only"
            )
        else:
            verdict = f"{diff / copy:.2f} copies (expected ~1)"
        lines.append(f"| {label} | {a_mib:.0f} | {b_mib:.0f} | {diff:.0f} | {verdict} |")
    return lines


def orphan_lines(report: dict[str, Any] | None) -> list[str]:
    """The orphan check in words."""
    lines = ["## No-orphan check (SIGKILL of the supervisor)", ""]
    if report is None:
        return [*lines, "not run"]
    verdict = "PASSED" if report.get("passed") else "FAILED"
    lines.append(
        f"{verdict} ({report['backend']} backend): inference ready after "
        f"{report.get('inference_ready_s')} s, {report.get('steps_seen')} trainer steps seen, "
        f"then SIGKILL of the supervisor pid only."
    )
    if "error" in report:
        lines.append(f"error: {report['error']}")
    lines.append("")
    lines.append(f"Processes of run {report.get('run_id', '?')} before the kill:")
    lines.append("")
    for entry in report.get("before", []):
        gpu = "n/a" if entry["gpu_mib"] is None else f"{entry['gpu_mib']} MiB"
        lines.append(f"- `{entry['process']}` GPU {gpu}")
    lines.append("")
    lines.append(
        f"After: all gone within {report.get('gone_after_s')} s; still alive: "
        f"{report.get('left') or 'none'}; NVML pids of the run still holding GPU memory: "
        f"{report.get('gpu_pids_left') or 'none'} (NVML available: "
        f"{report.get('nvml_available')}); GPU memory they held before: "
        f"{report.get('gpu_mib_held_before')} MiB."
    )
    return lines


def facts(args: argparse.Namespace) -> dict[str, str]:
    """Device, versions and date for the results header."""
    out = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
    }
    for dist in ("torch", "transformers", "vllm", "sglang", "peft"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        driver = pynvml.nvmlSystemGetDriverVersion()
        out["device"] = (
            f"{name if isinstance(name, str) else name.decode()}, {total / 2**30:.0f} GiB"
        )
        out["driver"] = driver if isinstance(driver, str) else driver.decode()
    except Exception:
        out["device"] = f"CPU only ({os.cpu_count()} cores)"
    out["cpus"] = str(os.cpu_count())
    return out


def markdown(
    results: list[CellResult],
    orphan: dict[str, Any] | None,
    info: dict[str, str],
    weight_bytes: int,
    params: int,
    args: argparse.Namespace,
) -> str:
    """The whole results file."""
    shape = TINY_SHAPE if args.quick else GPU_SHAPE
    concurrent = args.parallel > 1 and len(results) > 1
    lines = [
        f"# Weight-sync modes on a GPU: {', '.join(args.backends)}",
        "",
        f"- date: {info['date']}; device: {info['device']}"
        + (f", driver {info['driver']}" if "driver" in info else "")
        + f"; {info['cpus']} CPU cores",
        f"- versions: python {info['python']}, torch {info['torch']}, transformers "
        f"{info['transformers']}, vLLM {info['vllm']}, SGLang {info['sglang']}, "
        f"peft {info['peft']}",
        f"- model: random Qwen2 {shape} ({params / 1e6:.1f} M parameters, "
        f"{weight_bytes / MIB:.1f} MiB per copy in {args.dtype}), 44-token char tokenizer",
        f"- layout: {LAYOUTS[args.layout]}",
        f"- run: `grpo-tui run` headless per cell, toy task, {args.prompts} prompts x group "
        f"{args.group_size} per step; sync every step (lora_only, shared_vllm) or every "
        f"{args.restart_sync_every} steps (none, lora_restart); AdamW, lr per cell below "
        "(LoRA: r 16 on all linear layers); vLLM --enforce-eager, "
        f"--kv-cache-memory-bytes {args.kv_cache_bytes}",
        "- "
        + (
            f"cells ran **concurrently** ({args.parallel} at a time) on one machine "
            f"({info['device']}, {info['cpus']} cores): throughput is shared between cells, "
            "so tokens/s are lower bounds for a dedicated device; sync latencies include "
            "that contention too."
            if concurrent
            else "cells ran one after another."
        ),
        f"- reward: mean of the first vs the last {args.reward_window} steps; 'rose' = up by "
        f">= {args.reward_margin}. Alignment: |trainer logprob - server logprob| of the "
        "sampled tokens, step 1 (same weights) and median over the run (includes off-policy "
        "drift between syncs).",
        "",
        *table(results, args),
        "",
        *phase_lines(results),
        "Seed figures (Atropos example trainer): shared ~0 ms, LoRA hot-swap 1-5 s, restart "
        "30-60 s; 172 / 108 / 13 tok/s for shared / lora_restart / lora_only.",
        "",
        *(memory_proof(results, weight_bytes) if args.layout == "same" else []),
        "",
        *orphan_lines(orphan),
        "",
    ]
    problems = [r for r in results if r.status != "ok" or r.leftovers]
    if problems:
        lines += ["## Cells that did not finish cleanly", ""]
        for r in problems:
            lines.append(
                f"- {r.backend}/{r.mode}: {r.status}, exit {r.exit_code}, {r.reason or '-'}; "
                f"restarts {r.restarts}; leftovers {r.leftovers or 'none'} "
                "(log tails in gpu_diagnostics.md)"
            )
    return "\n".join(lines) + "\n"


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file (read from the end, cheap on big logs)."""
    if not path.is_file():
        return ""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 200_000))
        text = handle.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def first_errors(path: Path, lines: int = 80) -> str:
    """The first lines that look like an error and the context after them: the root cause
    of a crash usually comes long before the tail (vLLM's engine core traceback)."""
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace").splitlines()
    marker = ("Traceback", "Error", "ERROR", "Exception")
    start = next((i for i, line in enumerate(text) if any(m in line for m in marker)), None)
    return "" if start is None else "\n".join(text[max(0, start - 5) : start + lines])


def diagnostics(results: list[CellResult], orphan: dict[str, Any] | None, work: Path) -> str:
    """Log tails of every process of every cell that did not end ok (all cells: short)."""
    out = ["# Diagnostics", ""]
    for r in results:
        bad = r.status != "ok" or r.leftovers
        out.append(f"## {r.backend}/{r.mode}: {r.status} (exit {r.exit_code}) {r.reason}")
        out.append(f"run dir {r.run_dir}; restarts {r.restarts}; wall {r.wall_s:.0f} s")
        cell_dir = work / f"{r.backend}-{r.mode}"
        logs = sorted(Path(r.run_dir, "logs").glob("*.log")) if r.run_dir else []
        for path in [cell_dir / "supervisor.err", *logs]:
            text = tail(path, 60 if bad else 8)
            if text:
                out += [f"### {path.name}", "```", text, "```"]
            first = first_errors(path) if bad else ""
            if first:
                out += [f"### {path.name}: first error lines", "```", first, "```"]
        notices = [
            e
            for e in _lines(Path(r.run_dir, "events.jsonl") if r.run_dir else Path("-"))
            if e.get("type") == "Notice" and e.get("level") in ("warning", "error")
        ]
        if notices:
            out += ["### warnings and errors (events.jsonl)", "```"]
            out += [f"{e.get('level')}: {e.get('message')}" for e in notices[-30:]]
            out.append("```")
    if orphan is not None:
        out += ["## orphan check", "```", json.dumps(orphan, indent=1)[:20_000], "```"]
        run_dir = orphan.get("run_dir")
        for path in sorted(Path(run_dir, "logs").glob("*.log")) if run_dir else []:
            out += [f"### {path.name}", "```", tail(path, 30), "```"]
    return "\n".join(out) + "\n"


def pack_runs(work: Path, target: Path, lines: int) -> None:
    """A small tarball: each run's profile, metrics, events tail and log tails."""
    with tarfile.open(target, "w:gz") as tar:
        for run_dir in sorted(work.glob("*/runs/*/")):
            for path in sorted(run_dir.rglob("*")):
                if not path.is_file():
                    continue
                relative = path.relative_to(work)
                if path.suffix == ".log" or path.name == "events.jsonl":
                    data = tail(path, lines).encode()
                elif path.name in ("profile.toml", "metrics.jsonl"):
                    data = path.read_bytes()
                else:
                    continue
                info = tarfile.TarInfo(str(relative))
                info.size = len(data)
                info.mtime = int(time.time())
                tar.addfile(info, io.BytesIO(data))
        for extra in sorted(work.glob("*/supervisor.err")):
            data = tail(extra, lines).encode()
            info = tarfile.TarInfo(str(extra.relative_to(work)))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


# --------------------------------------------------------------------------- main


def dry_run(cells: list[Cell], work: Path, args: argparse.Namespace) -> int:
    """Write every cell's profile and print the plan ``grpo-tui check`` resolves from it."""
    failures = 0
    ports = free_ports(2 * len(cells), args.port_base)
    for index, cell in enumerate(cells):
        profile = work / cell.name / "profile.toml"
        profile.parent.mkdir(parents=True, exist_ok=True)
        pair = (ports[2 * index], ports[2 * index + 1])
        body = profile_for(cell, ports=pair, output_dir=work / cell.name / "runs", args=args)
        profile.write_text(tomli_w.dumps(body))
        done = subprocess.run(
            [sys.executable, "-m", "grpo_tui", "check", str(profile)],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        failures += done.returncode != 0
        print(f"== {cell.name}: check exit {done.returncode}\n{done.stdout}{done.stderr}")
    return 1 if failures else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="results folder ($OUT)")
    parser.add_argument("--work", type=Path, default=None, help="run dirs (default OUT/../work)")
    parser.add_argument("--backends", nargs="+", default=["vllm", "builtin"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=[*MODES, *EXTRA_MODES])
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--layout",
        choices=["same", "split", "fsdp2", "colocate"],
        default="same",
        help="same: every process on GPU 0; split: the trainer on GPU 0 and vLLM alone on "
        "GPU 1 (shared_vllm over NCCL); fsdp2: a 2-rank FSDP2 trainer on GPUs 0 and 1 "
        "(torchrun), vLLM on GPU 1 beside rank 1; split and fsdp2 run vLLM cells only; "
        "colocate: 2 ranks and 2 inference replicas, one of each per GPU (mode colocate; "
        "on CPU the built-in server's replicas)",
    )
    parser.add_argument(
        "--pin-gpu",
        type=int,
        default=None,
        help="same layout: pin inference and trainer to this GPU index ([..] gpus = [N])",
    )
    parser.add_argument(
        "--port-base", type=int, default=PORT_BASE, help="first port tried for the cells"
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps (CPU check)")
    parser.add_argument("--steps", type=int, default=None, help="steps, sync-every-step modes")
    parser.add_argument("--restart-steps", type=int, default=None, help="steps, restart modes")
    parser.add_argument("--restart-sync-every", type=int, default=None)
    parser.add_argument("--lr", type=float, default=3e-4, help="full-weight lr (GPU model)")
    parser.add_argument("--lora-lr", type=float, default=3e-3, help="LoRA lr (GPU model)")
    parser.add_argument("--tiny-lr", type=float, default=3e-3, help="full-weight lr, tiny model")
    parser.add_argument("--tiny-lora-lr", type=float, default=1e-2, help="LoRA lr, tiny model")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument(
        "--max-batches-offpolicy",
        type=int,
        default=None,
        help="the API's queue bound (default: the API's); 0 = synchronous, every sample drawn "
        "from the weights the trainer holds when it trains on it (off-policy lag 0)",
    )
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=0, help="cells at a time (0 = all)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for everything")
    parser.add_argument("--stop-grace", type=float, default=25.0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.05)
    parser.add_argument("--kv-cache-bytes", type=int, default=512 * MIB)
    parser.add_argument(
        "--orphan-backend", choices=["vllm", "sglang", "builtin", "off"], default="vllm"
    )
    parser.add_argument("--orphan-wait", type=float, default=30.0)
    parser.add_argument("--reward-window", type=int, default=3)
    parser.add_argument("--reward-margin", type=float, default=0.05)
    parser.add_argument("--tail-lines", type=int, default=200, help="log lines kept per file")
    parser.add_argument(
        "--dry-run", action="store_true", help="write the profiles and `grpo-tui check` them"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.steps = args.steps or (8 if quick else 60)
    args.restart_steps = args.restart_steps or (8 if quick else 25)
    args.restart_sync_every = args.restart_sync_every or (4 if quick else 10)
    if quick:
        args.dtype = "float32" if args.device == "cpu" else args.dtype
    if args.layout in ("split", "fsdp2"):
        args.backends = ["vllm"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    deadline = began + args.budget
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = (args.work or out.parent / f"{out.name}-work").resolve()
    work.mkdir(parents=True, exist_ok=True)
    info = facts(args)
    print(f"gpu_modes: {info}", flush=True)
    tiny_model, _ = build_model(work / "model-tiny", TINY_SHAPE)
    if args.quick:
        gpu_model, params = tiny_model, _
    else:
        gpu_model, params = build_model(work / "model", GPU_SHAPE)
    weight_bytes = params * (4 if args.dtype == "float32" else 2)
    cells = plan_cells(args, str(gpu_model), str(tiny_model))
    print(f"gpu_modes: {len(cells)} cells, model {params / 1e6:.1f} M params", flush=True)
    if args.dry_run:
        return dry_run(cells, work, args)
    cell_deadline = deadline - args.stop_grace - 30
    ports = free_ports(2 * len(cells) + 2, args.port_base)
    pairs = [(ports[i], ports[i + 1]) for i in range(0, len(ports), 2)]
    parallel = args.parallel or len(cells) + 1
    args.parallel = parallel
    orphan: dict[str, Any] | None = None
    orphan_thread = None
    if args.orphan_backend != "off":
        orphan_cell = next(
            (c for c in cells if c.backend == args.orphan_backend and c.mode == "none"),
            Cell(args.orphan_backend, "none", args.device, args.dtype, str(gpu_model), 1, 0, 1e-3),
        )
        box: dict[str, Any] = {}

        def orphan_run() -> None:
            try:
                box["report"] = orphan_check(orphan_cell, pairs[-1], work, cell_deadline, args)
            except Exception as error:
                box["report"] = {"backend": orphan_cell.backend, "error": repr(error)}

        orphan_thread = threading.Thread(target=orphan_run, name="orphan-check")
        orphan_thread.start()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [
            pool.submit(run_cell, c, pairs[i], work, cell_deadline, args)
            for i, c in enumerate(cells)
        ]
        results = []
        for cell, future in zip(cells, futures, strict=True):
            try:
                result = future.result()
            except Exception as error:
                result = CellResult.of(cell)
                result.status, result.reason = "error", repr(error)
            results.append(result)
            print(
                f"gpu_modes: {result.backend}/{result.mode}: {result.status} "
                f"{result.steps_done}/{result.steps_planned} steps, {result.wall_s:.0f} s",
                flush=True,
            )
    if orphan_thread is not None:
        orphan_thread.join()
        orphan = box.get("report")
    text = markdown(results, orphan, info, weight_bytes, params, args)
    (out / "gpu_modes.md").write_text(text)
    raw = {
        "facts": info,
        "args": {k: str(v) for k, v in vars(args).items()},
        "params": params,
        "weight_bytes": weight_bytes,
        "cells": [asdict(r) for r in results],
        "orphan_check": orphan,
    }
    (out / "gpu_modes.json").write_text(json.dumps(raw, indent=1))
    (out / "gpu_diagnostics.md").write_text(diagnostics(results, orphan, work))
    pack_runs(work, out / "gpu_runs.tar.gz", args.tail_lines)
    print(text, flush=True)
    print(f"gpu_modes: done in {time.monotonic() - began:.0f} s", flush=True)
    ok = all(r.status == "ok" for r in results) and (orphan is None or orphan.get("passed"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
