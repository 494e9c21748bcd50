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
PREIMPORTS = (CLI, "vllm.entrypoints.cli.serve", "vllm.entrypoints.openai.api_server")
"""What ``vllm serve`` imports before it reads its arguments (the 20-30 s), and no more: the
engine core's own modules (model runner, worker) may query the GPU when imported, which a
standby must not do."""


def preimport() -> float:
    """Import vLLM's CLI and its OpenAI server; the seconds it took."""
    began = time.perf_counter()
    for name in PREIMPORTS:
        importlib.import_module(name)
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
