"""``python -m grpo_trainer.serve.vllm_launch serve MODEL ...``: vLLM's CLI, imported early.

vLLM's CLI spends 20-30 s importing (torch, transformers, its OpenAI server) before it reads
its arguments. This module does those imports first, then waits at the start gate
(``grpo_trainer.start_gate``, when the supervisor spawned it ``prestart``), then runs
``vllm serve`` in this process with its arguments, or with the command the supervisor
hands it through the gate: a standby kept for the next restart becomes that incarnation.
So the imports overlap the run's other start-up, and a restart does not wait for them.

Nothing here touches CUDA: a standby holds no GPU memory while it waits, and vLLM forks its
engine core only from a process that has not initialised CUDA (it falls back to spawn,
with a warning, otherwise); a line on stderr says so if an import ever did.
Without the gate variable it runs at once, like ``vllm`` itself.
"""

from __future__ import annotations

import importlib
import sys
import time

from grpo_trainer.start_gate import wait_for_command

CLI = "vllm.entrypoints.cli.main"
PREIMPORTS = tuple(
    f"vllm.entrypoints.{name}"
    for name in (
        "openai.api_server",
        "cli.serve",
        "cli.openai",
        "cli.launch",
        "cli.benchmark.main",
        "cli.collect_env",
        "cli.run_batch",
    )
)
"""What vLLM's CLI (0.24, ``cli/main.py``) imports before it reads its arguments, which is
where the 20-30 s go; vLLM's CLI forks its engine core after these imports, so none of them
initialises CUDA. No more than that: the engine core's own modules (model runner, worker)
may query the GPU when imported, which a standby must not do. One that a later vLLM moved
is skipped with a note (the CLI imports what it needs itself)."""


def preimport() -> float:
    """Import vLLM's CLI and its OpenAI server; the seconds it took."""
    began = time.perf_counter()
    importlib.import_module(CLI)
    for name in PREIMPORTS:
        try:
            importlib.import_module(name)
        except ImportError as error:
            print(f"vllm_launch: {name} not imported early: {error}", file=sys.stderr)
    return time.perf_counter() - began


def cuda_touched() -> bool:
    """Whether the imports initialised CUDA (then vLLM spawns its engine core)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def main() -> None:
    seconds = preimport()
    if cuda_touched():
        print(
            "vllm_launch: CUDA was initialised during the imports: vLLM will spawn its engine "
            "core instead of forking it",
            file=sys.stderr,
            flush=True,
        )
    print(f"vllm_launch: vLLM imported in {seconds:.1f} s", flush=True)
    handed = wait_for_command()
    if handed is not None:
        sys.argv[1:] = handed
    sys.argv[0] = "vllm"
    importlib.import_module(CLI).main()


if __name__ == "__main__":
    main()
