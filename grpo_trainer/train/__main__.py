"""``python -m grpo_trainer.train --model-name ... --atropos-url ...``: run the GRPO trainer.

Exit status: 0 done or stopped gracefully (SIGTERM, or the supervisor refusing a restart
because it is shutting down: the current step finishes and a checkpoint is written);
2 bad configuration (one line per problem; a restart mode without a supervisor is caught
before the model loads, a weight sync that cannot start before the first step); 1 a failure
while running (API unreachable at start, bad data, weight sync lagging).
"""

from __future__ import annotations

import importlib.util
import os
import sys

from grpo_trainer.control import SOCKET_ENV
from grpo_trainer.serve.capabilities import restarts_inference
from grpo_trainer.start_gate import wait_for_start
from grpo_trainer.sync.restart import supervisor_missing
from grpo_trainer.train.config import EXIT_BAD_CONFIG, ConfigError, TrainerConfig


def preflight(config: TrainerConfig) -> list[str]:
    """Problems that need the environment or the model's architecture, not its weights."""
    problems = []
    if (
        config.sync_every
        and restarts_inference(config.weight_bridge_mode, config.none_reload)
        and not os.environ.get(SOCKET_ENV)
    ):
        problems.append(supervisor_missing(config.weight_bridge_mode))
    if config.optimizer == "adamw_8bit" and importlib.util.find_spec("bitsandbytes") is None:
        problems.append("--optimizer: adamw_8bit needs bitsandbytes (pip install bitsandbytes)")
    if config.use_wandb and importlib.util.find_spec("wandb") is None:
        problems.append("--use-wandb: wandb is not installed (pip install wandb)")
    if config.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            problems.append(f"--device: {config.device} requested but CUDA is not available")
    if config.is_lora:
        from grpo_trainer.train.policy import missing_lora_targets

        try:
            missing = missing_lora_targets(config.model_name, config.lora_target_modules)
        except OSError as exc:
            problems.append(f"--model-name: cannot read {config.model_name!r}: {exc}")
        else:
            if missing:
                problems.append(
                    f"--lora-target-modules: {', '.join(missing)} not found among the linear "
                    f"layers of {config.model_name}"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    """Parse, check, build and run; returns the exit status."""
    try:
        config = TrainerConfig.from_argv(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    from grpo_trainer.train.session import run_session  # seconds of imports: before the gate

    wait_for_start()
    problems = preflight(config)
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return run_session(config)


if __name__ == "__main__":
    sys.exit(main())
