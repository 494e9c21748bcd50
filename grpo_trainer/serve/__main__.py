"""``python -m grpo_trainer.serve MODEL ...``: start the built-in server (vLLM's flag names).

Bad arguments (an unreadable model, a malformed ``--lora-modules``, shared weights that do
not fit the model) exit with status 2 and the reason, before the port is bound.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import sys
import time
from pathlib import Path

import torch
import uvicorn
from transformers import AutoConfig
from transformers.utils import logging as hf_logging

from grpo_trainer.api.settings import is_loopback
from grpo_trainer.models import DTYPES, load_model, load_tokenizer
from grpo_trainer.serve.app import create_app
from grpo_trainer.serve.engine import Engine
from grpo_trainer.serve.lora import AdapterError, AdapterSet
from grpo_trainer.serve.replicas import Replicas
from grpo_trainer.serve.service import InferenceService
from grpo_trainer.serve.settings import API_KEY_ENV
from grpo_trainer.serve.shared import SharedWeightsError, attach_server
from grpo_trainer.start_gate import wait_for_command
from grpo_trainer.stop_signal import exit_zero_on_stop


def _lora_module(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _threads(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def torch_threads(requested: int | None, device: str) -> int | None:
    """Threads for ``torch.set_num_threads`` (None: torch's default).

    Unset on CPU means 1: the server shares a few cores with the trainer, and torch's
    default of one thread per core in each process made training steps about 10x slower.
    ``0`` asks for torch's default. On CUDA, unset leaves torch's default.
    """
    if requested is not None:
        return requested or None
    return 1 if device == "cpu" else None


def build_parser() -> argparse.ArgumentParser:
    """The command line, with vLLM's flag names for the options both servers share."""
    parser = argparse.ArgumentParser(prog="python -m grpo_trainer.serve")
    parser.add_argument("model", help="model directory or hub id")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001)
    parser.add_argument("--served-model-name", default=None, help="defaults to MODEL")
    parser.add_argument("--tokenizer", default=None, help="defaults to MODEL")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="torch's seed; mixed with the start time for requests without their own seed",
    )
    parser.add_argument(
        "--cpu-threads",
        type=_threads,
        default=None,
        help="torch CPU threads; default 1 on cpu, torch's own on cuda; 0 = torch's own",
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="most sequences in one batch (and largest n)"
    )
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--lora-modules", nargs="+", type=_lora_module, default=[])
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"bearer token every request but /health and /metrics needs (default ${API_KEY_ENV}); "
        "required when --host is not a loopback address",
    )
    parser.add_argument(
        "--shared-weights",
        type=Path,
        default=None,
        help="share parameters with the trainer: a memory-mapped file in DIR (CPU), CUDA IPC (GPU)",
    )
    parser.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="replicas of the model, each with its own weights (CPU; colocate with N trainer "
        "ranks loads replica i from rank i)",
    )
    parser.add_argument(
        "--enable-sleep-mode",
        action="store_true",
        help="serve /sleep, /wake_up and /is_sleeping (colocate: the trainer shares the device)",
    )
    return parser


def _dtype(model: str, requested: str) -> str:
    if requested != "auto":
        return requested
    configured = str(getattr(AutoConfig.from_pretrained(model), "dtype", "float32"))
    name = configured.removeprefix("torch.")
    return name if name in DTYPES else "float32"


def start_seeds(seed: int) -> random.Random:
    """The seed stream of requests that bring no ``seed``, new at every start.

    ``--seed`` mixed with the start time (ns) and the pid: a server restarted on unchanged
    weights must not replay the groups it already sampled (the trainer would see the same
    groups again). Nothing is persisted; a request's own ``seed`` stays reproducible.
    """
    return random.Random(f"{seed}:{time.time_ns()}:{os.getpid()}")


def _replicas(model: torch.nn.Module, args: argparse.Namespace) -> list[torch.nn.Module]:
    """``model`` and ``--data-parallel-size`` - 1 copies of it (each its own weights)."""
    size = args.data_parallel_size
    if size < 1:
        raise ValueError(f"--data-parallel-size must be at least 1, got {size}")
    if size == 1:
        return [model]
    if args.shared_weights is not None or args.enable_lora:
        raise ValueError(
            "--data-parallel-size > 1 loads each replica's own weights from the trainer: "
            "not with --shared-weights or --enable-lora"
        )
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("--data-parallel-size > 1 runs on CPU here (vLLM serves GPUs)")
    return [model, *(copy.deepcopy(model) for _ in range(size - 1))]


def build_service(args: argparse.Namespace) -> InferenceService:
    """Load the model, attach shared weights and adapters; raise ValueError on bad input."""
    model = load_model(args.model, dtype=_dtype(args.model, args.dtype), device=args.device)
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    on_cpu = next(model.parameters()).device.type == "cpu"
    if args.shared_weights is not None and on_cpu and attach_server(model, args.shared_weights):
        print(f"mapped existing shared weights from {args.shared_weights}", flush=True)
    adapters = None
    if args.enable_lora:
        adapters = AdapterSet(model, base_path=args.model, max_rank=args.max_lora_rank)
        for name, path in args.lora_modules:
            adapters.load(name, path, inplace=False)
    elif args.lora_modules:
        raise ValueError("--lora-modules needs --enable-lora")
    max_model_len = args.max_model_len or int(model.config.max_position_embeddings)
    engines = [
        Engine(
            replica,
            tokenizer,
            max_model_len=max_model_len,
            adapters=adapters,
            seeds=start_seeds(args.seed),
            max_batch_rows=args.max_num_seqs,
        )
        for replica in _replicas(model, args)
    ]
    return InferenceService(
        engines[0],
        replicas=Replicas(engines),
        served_model_name=args.served_model_name or args.model,
        model_path=args.model,
        max_num_seqs=args.max_num_seqs,
        shared_weights=args.shared_weights,
        enable_sleep_mode=args.enable_sleep_mode,
    )


def parse_checked(argv: list[str] | None) -> argparse.Namespace:
    """The arguments, or exit 2 with the reason (bad flags, no key beyond loopback)."""
    args = build_parser().parse_args(argv)
    if args.api_key is None and not is_loopback(args.host):
        print(
            f"grpo_trainer.serve: error: --host {args.host} is not a loopback address: set "
            f"--api-key (or {API_KEY_ENV}) so that only holders of the key can reach the server",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(2)
    return args


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, load everything, then serve until SIGTERM / SIGINT.

    Under a supervisor's start gate the imports come first; a standby is handed the
    arguments of the incarnation it becomes there (``grpo_trainer.start_gate``).
    """
    args = parse_checked(argv)
    exit_zero_on_stop()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    handed = wait_for_command()
    if handed is not None:
        args = parse_checked(handed)
    torch.manual_seed(args.seed)
    threads = torch_threads(args.cpu_threads, args.device)
    if threads is not None:
        torch.set_num_threads(threads)
    print(f"torch CPU threads: {torch.get_num_threads()}", flush=True)
    try:
        service = build_service(args)
    except (OSError, ValueError, AdapterError, SharedWeightsError) as error:
        print(f"grpo_trainer.serve: error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    if len(service.replicas) > 1:
        print(f"serving {len(service.replicas)} replicas (data parallel)", flush=True)
    app = create_app(service, api_key=args.api_key)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    except SystemExit as stop:  # the stop handler, once uvicorn has shut down
        if stop.code not in (0, None):
            raise
    end_now()


def end_now() -> None:
    """Exit 0 without the interpreter's teardown, once the server has shut down.

    The teardown garbage-collects torch's and transformers' objects: 3-9 s of one core on a
    loaded 2-core machine (seen as "Garbage-collecting" in a stack dump), in which the port
    is closed but the process lives on, and a restart waits for its exit (issue 35: an
    inference restart by key serves fresh weights within 10 s on CPU). Nothing is left to
    save: the output is flushed, and the process ends.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
