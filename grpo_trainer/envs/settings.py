"""Settings of one environment process, and the command line that starts it.

The profile's ``[[env]]`` tables map onto :class:`EnvSettings` (unknown keys are errors).
The connection details (API and inference URLs, tokenizer, API token) belong to other
roles, so :meth:`EnvSettings.command` takes them as arguments. Torch-free on purpose:
``grpo-tui check`` imports this module and must stay fast.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

BUILTIN_TASKS = ("toy", "gsm8k")
DOTTED_PATH = re.compile(r"^[A-Za-z_][\w.]*[:.][A-Za-z_]\w*$")


class EnvSettings(BaseModel):
    """One environment: which task it runs and how it samples, scores and evaluates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("", description="name registered with the API (default: the task name)")
    task: str = Field("toy", description='"toy", "gsm8k", or "package.module:TaskClass"')
    model_name: str = Field("policy", description="served model name asked of inference")
    group_size: int = Field(8, ge=2, description="completions per prompt (one group)")
    max_concurrency: int = Field(4, ge=1, description="groups generated at the same time")
    groups_per_request: int = Field(
        1,
        ge=1,
        description="groups asked of inference in one request (its prompts side by side): "
        "fewer, larger batches; a divisor of max_concurrency",
    )
    seed: int = 0
    max_tokens: int | None = Field(None, ge=1, description="completion cap; None = task's default")
    ignore_eos: bool = Field(
        False, description="sample max_tokens tokens past EOS: fixed-length work (benchmarks)"
    )
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_token_length: int = Field(2048, ge=8, description="registered max_token_length")
    eval_every: int = Field(0, ge=0, description="evaluate every N trainer steps; 0 = never")
    eval_k: int = Field(8, ge=1, description="samples per held-out prompt for pass@k / mean@k")
    eval_size: int = Field(32, ge=1, description="held-out prompts per evaluation")
    data_file: Path | None = Field(None, description="JSONL data for dataset tasks (offline)")
    weight: float = Field(1.0, gt=0, description="share of each batch relative to other envs")
    min_batch_allocation: float | None = Field(None, ge=0, le=1)
    max_groups: int = Field(0, ge=0, description="stop after sending N groups; 0 = run on")
    record_dropped_mb: float = Field(
        128,
        ge=0,
        description="MB of dropped (all-equal) groups kept for the rollout inspector; 0 = none",
    )
    record_dropped_every: int = Field(
        1, ge=1, description="record every N-th dropped group only (sampling)"
    )
    max_consecutive_errors: int = Field(
        20,
        ge=0,
        description="exit (status 1, so the restart policy applies) once the task's code "
        "failed this many groups in a row; 0 = never",
    )
    prompt_copies: bool = Field(
        False,
        description="ask for a group as group_size copies of the prompt, n=1 each, instead "
        "of n=group_size (set for SGLang, whose adapter unload waits forever once an n > 1 "
        "request used the adapter)",
    )

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        if value in BUILTIN_TASKS or DOTTED_PATH.match(value):
            return value
        raise ValueError(
            f"task {value!r} is neither a built-in task {BUILTIN_TASKS} "
            "nor a dotted path like 'my_package.tasks:MyTask'"
        )

    @field_validator("data_file")
    @classmethod
    def _data_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{str(value)!r} does not exist")
        return value

    @field_validator("groups_per_request")
    @classmethod
    def _groups_divide_concurrency(cls, value: int, info: ValidationInfo) -> int:
        concurrency = info.data.get("max_concurrency")
        if concurrency is not None and concurrency % value:
            raise ValueError(
                f"{value} does not divide max_concurrency {concurrency} (the groups generated "
                f"at the same time, groups_per_request to a request): use a divisor of it"
            )
        return value

    @property
    def workers(self) -> int:
        """Requests in flight at once: ``max_concurrency`` groups, ``groups_per_request``
        to a request (a divisor: checked above)."""
        return self.max_concurrency // self.groups_per_request

    @property
    def module(self) -> str:
        """The module ``python -m`` runs: the task's own, or the generic runner."""
        if self.task in BUILTIN_TASKS:
            return f"grpo_trainer.envs.{self.task}"
        return "grpo_trainer.envs"

    @property
    def registered_name(self) -> str:
        """The ``desired_name`` sent to ``/register-env``."""
        return self.name or (self.task if self.task in BUILTIN_TASKS else self.task.split(":")[-1])

    def command(
        self,
        *,
        api_url: str,
        inference_url: str,
        tokenizer: str,
        api_token: str | None = None,
    ) -> list[str]:
        """The argv that starts this environment against the given API and inference server."""
        argv = [sys.executable, "-m", self.module]
        if self.module == "grpo_trainer.envs":
            argv += ["--task", self.task]
        argv += [
            "--api-url", api_url,
            "--inference-url", inference_url,
            "--model-name", self.model_name,
            "--tokenizer", tokenizer,
            "--group-size", str(self.group_size),
            "--name", self.registered_name,
            "--seed", str(self.seed),
            "--max-concurrency", str(self.max_concurrency),
            "--groups-per-request", str(self.groups_per_request),
            "--temperature", repr(self.temperature),
            "--top-p", repr(self.top_p),
            "--max-token-length", str(self.max_token_length),
            "--eval-every", str(self.eval_every),
            "--eval-k", str(self.eval_k),
            "--eval-size", str(self.eval_size),
            "--weight", repr(self.weight),
            "--max-groups", str(self.max_groups),
            "--record-dropped-mb", repr(self.record_dropped_mb),
            "--record-dropped-every", str(self.record_dropped_every),
            "--max-consecutive-errors", str(self.max_consecutive_errors),
        ]  # fmt: skip
        if self.min_batch_allocation is not None:
            argv += ["--min-batch-allocation", repr(self.min_batch_allocation)]
        if self.max_tokens is not None:
            argv += ["--max-tokens", str(self.max_tokens)]
        if self.ignore_eos:
            argv += ["--ignore-eos", "true"]
        if self.prompt_copies:
            argv += ["--prompt-copies", "true"]
        if self.data_file is not None:
            argv += ["--data-file", str(self.data_file)]
        if api_token:
            argv += ["--api-token", api_token]
        return argv
