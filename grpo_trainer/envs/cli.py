"""Command line of every environment: ``python -m grpo_trainer.envs.<task> --api-url ...``.

The flags are :class:`EnvSettings`'s fields (``--group-size`` is ``group_size``) plus the
connection (``--api-url``, ``--inference-url``, ``--tokenizer``, ``--api-token``, or the
``GRPO_API_TOKEN`` variable). A bad value exits with status 2 and names the flag.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys

from pydantic import ValidationError

from grpo_trainer.api.settings import TOKEN_ENV
from grpo_trainer.control import SupervisorLink
from grpo_trainer.envs.base import Connection, EnvRunner
from grpo_trainer.envs.rollout_api import FatalEnvError
from grpo_trainer.envs.settings import BUILTIN_TASKS, EnvSettings
from grpo_trainer.envs.stats import Reporter
from grpo_trainer.envs.task import Task
from grpo_trainer.envs.task_errors import TaskFailing
from grpo_trainer.envs.tokenizer import load_prompt_tokenizer
from grpo_trainer.start_gate import wait_for_start

SETTINGS_FLAGS = (
    "name", "task", "model_name", "group_size", "max_concurrency", "groups_per_request",
    "seed", "max_tokens",
    "temperature", "top_p", "max_token_length", "eval_every", "eval_k", "eval_size",
    "data_file", "weight", "min_batch_allocation", "max_groups", "ignore_eos",
    "prompt_copies", "record_dropped_mb", "record_dropped_every", "max_consecutive_errors",
)  # fmt: skip


def load_task(spec: str) -> type[Task]:
    """The task class for ``"toy"``, ``"gsm8k"`` or ``"package.module:Class"``."""
    if spec in BUILTIN_TASKS:
        module_name, attr = {
            "toy": ("grpo_trainer.envs.toy", "RepeatDigit"),
            "gsm8k": ("grpo_trainer.envs.gsm8k", "Gsm8k"),
        }[spec]
    elif ":" in spec:
        module_name, attr = spec.split(":", 1)
    else:
        module_name, _, attr = spec.rpartition(".")
    task = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(task, type) and issubclass(task, Task)):
        raise TypeError(f"{spec!r} is not a grpo_trainer.envs.task.Task subclass")
    return task


def build_parser(prog: str, task_fixed: bool) -> argparse.ArgumentParser:
    """The argument parser; ``--task`` only for the generic ``python -m grpo_trainer.envs``."""
    parser = argparse.ArgumentParser(prog=prog, description="GRPO environment runner")
    parser.add_argument("--api-url", required=True)
    parser.add_argument("--inference-url", required=True)
    parser.add_argument("--tokenizer", required=True, help="tokenizer path or hub id")
    parser.add_argument("--api-token", default=os.environ.get(TOKEN_ENV))
    if not task_fixed:
        parser.add_argument("--task", required=True, help="package.module:TaskClass")
    for name in SETTINGS_FLAGS:
        if name == "task":
            continue
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None)
    return parser


def parse(argv: list[str], task: type[Task] | None) -> tuple[EnvSettings, Connection, str]:
    """Validate the command line; exits 2 naming the flag on bad input."""
    module = "grpo_trainer.envs"
    if task is not None:
        module += f".{task.name}" if task.name in BUILTIN_TASKS else f" --task {_dotted(task)}"
    prog = f"python -m {module}"
    parser = build_parser(prog, task_fixed=task is not None)
    args = parser.parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k in SETTINGS_FLAGS and v is not None}
    if task is not None:
        values["task"] = task.name if task.name in BUILTIN_TASKS else _dotted(task)
    try:
        settings = EnvSettings.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"--{str(e['loc'][0]).replace('_', '-') if e['loc'] else 'settings'}: {e['msg']}"
            for e in exc.errors()
        )
        parser.error(problems)
    connection = Connection(args.api_url, args.inference_url, args.api_token)
    return settings, connection, args.tokenizer


def _dotted(task: type[Task]) -> str:
    return f"{task.__module__}:{task.__qualname__}"


async def _run(runner: EnvRunner) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runner.stop)
    await runner.run()


def main(task: type[Task] | None = None, argv: list[str] | None = None) -> None:
    """Run an environment until SIGTERM (or ``--max-groups``); exit 0, 2 on bad input, 1
    when the task failed ``--max-consecutive-errors`` times in a row (its last line says
    how)."""
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings, connection, tokenizer_path = parse(sys.argv[1:] if argv is None else argv, task)
    try:
        task_cls = task or load_task(settings.task)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        print(f"error: --task {settings.task!r}: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    try:
        instance = task_cls(seed=settings.seed, data_file=settings.data_file)
    except (OSError, ValueError) as exc:
        print(f"error: {settings.task}: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    wait_for_start()  # the model (tokenizer), the API, inference and the trainer are up
    tokenizer = load_prompt_tokenizer(tokenizer_path)
    runner = EnvRunner(
        instance, settings, connection, tokenizer, reporter=Reporter(SupervisorLink.from_env())
    )
    try:
        asyncio.run(_run(runner))
    except FatalEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    except TaskFailing as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from exc
