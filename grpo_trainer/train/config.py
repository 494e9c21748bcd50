"""Trainer settings: what a profile's ``[trainer]`` table and the trainer's flags map onto.

Torch-free on purpose: ``grpo-tui check`` validates a profile through this module without
loading torch. Field names are the Atropos example trainer's flags in snake_case
(``--model-name`` is ``model_name``), so a key in the profile, a field here and a flag on
the command line carry one name.

Batch semantics follow Atropos: ``batch_size`` sequences per micro-batch, and
``batch_size * gradient_accumulation_steps`` sequences (whole groups) per optimizer step,
which is the batch size registered with the rollout API.
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

WeightBridgeMode = Literal["none", "shared_vllm", "lora_only", "lora_restart", "colocate"]
LORA_MODES: tuple[str, ...] = ("lora_only", "lora_restart")
LossType = Literal["grpo", "dapo", "dr_grpo"]
Optimizer = Literal["adamw", "adafactor", "adamw_8bit"]
OptimizerImpl = Literal["auto", "fused", "foreach"]
LrSchedule = Literal["constant", "cosine"]
Dtype = Literal["float32", "bfloat16", "float16"]
Backend = Literal["builtin", "vllm", "sglang"]

EXIT_BAD_CONFIG = 2
"""Exit status for bad configuration: nothing was loaded, nothing was lost."""


class TrainerConfig(BaseModel):
    """Everything the GRPO trainer needs to know; validated before any model loads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # model
    model_name: str = Field(min_length=1, description="hub id or local path of the base model")
    dtype: Dtype = "float32"
    device: str = "cpu"
    gradient_checkpointing: bool = False
    cpu_offload: bool = Field(
        False,
        description=(
            "multi-GPU trainer (torchrun): keep the FSDP2 shards, gradients and optimizer "
            "state in CPU memory (slower steps, much less GPU memory)"
        ),
    )
    seed: int = 0
    cpu_threads: int | None = Field(
        None,
        ge=0,
        description=(
            "torch CPU threads; default 1 on device cpu (the stack's processes share few "
            "cores), torch's own elsewhere; 0 = torch's own"
        ),
    )

    # optimisation
    lr: float = Field(1e-5, gt=0)
    training_steps: int = Field(10, ge=1)
    batch_size: int = Field(2, ge=1, description="sequences per micro-batch")
    gradient_accumulation_steps: int = Field(1, ge=1)
    seq_len: int = Field(2048, ge=2, description="max tokens per sequence (prompt+completion)")
    optimizer: Optimizer = "adamw"
    optimizer_impl: OptimizerImpl = Field(
        "auto",
        description="adamw's kernel: fused (one kernel for all parameters, torch fused=True), "
        "foreach, or auto = fused on CUDA and foreach elsewhere",
    )
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: LrSchedule = "constant"
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="cosine floor as a fraction of lr")
    grad_clip: float = Field(1.0, gt=0, description="max grad norm")

    # loss
    loss_type: LossType = "grpo"
    clip_eps: float = Field(0.2, gt=0, lt=1)
    clip_eps_high: float | None = Field(None, gt=0, description="upper clip; default clip_eps")
    beta: float = Field(0.0, ge=0, description="KL-to-reference coefficient")
    tis_cap: float | None = Field(None, description="truncated importance-sampling cap")
    entropy_coef: float = Field(0.0, ge=0)
    logprob_chunk_size: int = Field(
        256, ge=1, description="logits memory per vocabulary slice, in full-vocabulary rows"
    )
    group_size: int | None = Field(None, ge=1, description="if known, checked against batch")

    # checkpoints
    save_path: str = "trained_model_checkpoints"
    checkpoint_interval: int = Field(10, ge=0, description="steps between checkpoints; 0 = end")
    keep_checkpoints: int = Field(3, ge=1)
    resume: str | None = Field(
        None,
        description="'auto' or a checkpoint directory to start from (a restarted trainer "
        "continues from the run's own newer checkpoints)",
    )

    # LoRA
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    lora_target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"])
    lora_lr: float | None = Field(
        None,
        gt=0,
        description="lr in the LoRA modes (an adapter often needs a larger one); default lr",
    )

    # data
    atropos_url: str = "http://localhost:8000"
    api_token: str | None = Field(
        None, description="the API's bearer token; default $GRPO_API_TOKEN (kept out of ps)"
    )
    api_timeout: float = Field(60.0, gt=0, description="max wait for the API at start, seconds")
    inference_timeout: float = Field(
        900.0,
        gt=0,
        description="max wait for the inference server's /health before the first weight "
        "attach, seconds (it may start alongside the trainer)",
    )
    lease_seconds: float = Field(600.0, gt=0)
    batches_file: str | None = Field(None, description="offline JSONL of groups instead of API")

    # inference and weight sync
    inference_url: str = "http://127.0.0.1:9001"
    served_model_name: str = Field("policy", min_length=1)
    inference_backend: Backend = "builtin"
    weight_bridge_mode: WeightBridgeMode = "none"
    none_reload: Literal["in_place", "restart"] = Field(
        "in_place",
        description="mode none: the server loads each sync in place, or restarts on it",
    )
    sync_every: int = Field(1, ge=0, description="steps between syncs; 0 = never sync")
    max_sync_lag: int = Field(3, ge=0, description="max steps trained on stale weights")
    sync_retries: int = Field(3, ge=0)
    weight_transfer_delta: bool = Field(
        False,
        description="shared_vllm over NCCL: send only the bf16 elements that changed since "
        "the last sync (indices + values per bucket, checked by checksum on vLLM's side)",
    )

    # reporting
    record_rollouts_mb: float = Field(
        1024,
        ge=0,
        description=(
            "MB of recorded groups kept for the rollout inspector (rollouts/ in the run "
            "directory; oldest dropped first); 0 = record none"
        ),
    )
    record_rollouts_every: int = Field(
        1, ge=1, description="record the groups of every N-th step only (sampling)"
    )
    metrics_file: str | None = None
    use_wandb: bool = False
    wandb_project: str | None = None
    wandb_group: str | None = None

    @field_validator("device")
    @classmethod
    def _device_known(cls, value: str) -> str:
        head, _, index = value.partition(":")
        if head not in ("cpu", "cuda", "mps") or (index and not index.isdigit()):
            raise ValueError(f"device {value!r} is not cpu, cuda, cuda:N or mps")
        return value

    @field_validator("resume")
    @classmethod
    def _resume_known(cls, value: str | None) -> str | None:
        if value is not None and value != "auto" and not Path(value).is_dir():
            raise ValueError(f"resume {value!r} is neither 'auto' nor an existing directory")
        return value

    @field_validator("tis_cap")
    @classmethod
    def _tis_cap_at_least_one(cls, value: float | None) -> float | None:
        if value is not None and value < 1:
            raise ValueError(f"tis_cap {value} must be >= 1 (it caps a probability ratio)")
        return value

    @field_validator("lora_target_modules")
    @classmethod
    def _targets_given(cls, value: list[str]) -> list[str]:
        if not value or any(not name for name in value):
            raise ValueError("lora_target_modules must name at least one module")
        return value

    @field_validator("atropos_url", "inference_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> TrainerConfig:
        problems: list[str] = []
        if self.clip_eps_high is not None and self.clip_eps_high < self.clip_eps:
            problems.append(f"clip_eps_high {self.clip_eps_high} is below clip_eps {self.clip_eps}")
        if self.group_size is not None and self.step_batch_size % self.group_size:
            problems.append(
                f"batch_size * gradient_accumulation_steps = {self.step_batch_size} is not a "
                f"multiple of group_size {self.group_size} (groups are never split)"
            )
        if self.sync_every and self.max_sync_lag < self.sync_every - 1:
            problems.append(
                f"max_sync_lag {self.max_sync_lag} is below sync_every - 1 = "
                f"{self.sync_every - 1}: every step between syncs would count as stale"
            )
        if self.weight_bridge_mode == "colocate" and (self.sync_every, self.max_sync_lag) != (1, 0):
            problems.append(
                f"colocate syncs after every step and never trains on a stale engine: "
                f"sync_every must be 1 and max_sync_lag 0 (got {self.sync_every} and "
                f"{self.max_sync_lag})"
            )
        if self.optimizer_impl != "auto" and self.optimizer != "adamw":
            problems.append(
                f"optimizer_impl {self.optimizer_impl!r} applies to adamw only "
                f"(optimizer is {self.optimizer!r}): leave it at 'auto'"
            )
        if self.weight_transfer_delta and (self.weight_bridge_mode, self.inference_backend) != (
            "shared_vllm",
            "vllm",
        ):
            problems.append(
                "weight_transfer_delta applies to shared_vllm on vLLM (its NCCL weight transfer), "
                f"not to {self.weight_bridge_mode} on {self.inference_backend}"
            )
        if self.use_wandb and not self.wandb_project:
            problems.append("use_wandb needs wandb_project")
        if self.device == "cpu" and self.dtype == "float16":
            problems.append("dtype float16 is not supported on cpu: use float32 or bfloat16")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def step_batch_size(self) -> int:
        """Sequences per optimizer step: the batch size registered with the API."""
        return self.batch_size * self.gradient_accumulation_steps

    @property
    def torch_threads(self) -> int | None:
        """Threads for ``torch.set_num_threads``; None leaves torch's default.

        On CPU the trainer shares a few cores with the inference server, the API and the
        environments: torch's default (one thread per core each) made a tiny-model step
        about 10x slower than one thread. On GPU the CPU threads barely matter: unchanged.
        """
        if self.cpu_threads is not None:
            return self.cpu_threads or None
        return 1 if self.device == "cpu" else None

    @property
    def base_lr(self) -> float:
        """Peak lr of this mode: ``lora_lr`` in the LoRA modes when set, else ``lr``.

        A LoRA adapter trains a low-rank update from zero and usually wants a larger lr than
        full fine-tuning; one profile can then switch modes without retuning.
        """
        return self.lora_lr if self.is_lora and self.lora_lr is not None else self.lr

    @property
    def is_lora(self) -> bool:
        """True in the modes that train a LoRA adapter instead of all weights."""
        return self.weight_bridge_mode in LORA_MODES

    @property
    def clip_high(self) -> float:
        """Upper clip range (DAPO's clip-higher), ``clip_eps`` unless set."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def checkpoint_dir(self) -> Path:
        """Where ``step_N/`` and ``adapter_step_N/`` live."""
        return Path(self.save_path)

    def to_argv(self) -> list[str]:
        """The flags (Atropos names) that reproduce this config; defaults are left out."""
        args: list[str] = []
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if name != "model_name" and value == field.get_default(call_default_factory=True):
                continue
            flag = _flag(name)
            if isinstance(value, bool):
                args.append(flag if value else f"--no-{flag[2:]}")
            elif isinstance(value, list):
                args += [flag, *map(str, value)]
            elif value is not None:
                args += [flag, str(value)]
        return args

    def argv(self, python: str = sys.executable) -> list[str]:
        """The whole command line: ``python -m grpo_trainer.train --model-name ...``."""
        return [python, "-m", "grpo_trainer.train", *self.to_argv()]

    @classmethod
    def from_argv(cls, argv: list[str]) -> TrainerConfig:
        """Parse Atropos-style flags; raises ``ConfigError`` with one line per problem."""
        namespace = build_parser().parse_args(argv)
        given = {k: v for k, v in vars(namespace).items() if v is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            raise ConfigError(describe_errors(exc)) from None


class ConfigError(ValueError):
    """Bad trainer configuration; ``problems`` holds one readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def describe_errors(exc: ValidationError) -> list[str]:
    """One line per validation error, naming the flag (``--lr``) that holds the bad value."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"] if isinstance(part, str))
        message = error["msg"].removeprefix("Value error, ")
        if where and error["type"] == "missing":
            lines.append(f"{_flag(where)}: required")
        elif where:
            lines.append(f"{_flag(where)}: {message} (got {error.get('input')!r})")
        else:
            lines += [f"config: {part}" for part in message.split("; ")]
    return lines


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one flag per config field.

    Values stay strings here and are converted and checked by pydantic, so that every bad
    value is reported at once instead of argparse stopping at the first.
    """
    parser = argparse.ArgumentParser(
        prog="python -m grpo_trainer.train",
        description="GRPO trainer (Atropos-compatible flags).",
    )
    hints = typing.get_type_hints(TrainerConfig)
    for name, field in TrainerConfig.model_fields.items():
        annotation = hints[name]
        help_text = field.description or ""
        if annotation is bool:
            parser.add_argument(_flag(name), action=argparse.BooleanOptionalAction, help=help_text)
        elif typing.get_origin(annotation) is list:
            parser.add_argument(_flag(name), nargs="+", help=help_text)
        else:
            parser.add_argument(_flag(name), help=help_text)
    return parser
