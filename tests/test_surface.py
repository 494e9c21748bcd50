"""The surface, frozen on purpose (as torchtitan's ``test_no_new_cli_options.py``): every
profile key and every ``grpo-tui`` option is listed below.

Adding, renaming or removing a key or an option fails this test until its list says so:
one line in ``PROFILE_KEYS`` or ``CLI_OPTIONS``, in the same diff as its doc, which the
test also checks is there (the key's or option's name in README.md or docs/):

- a profile key: docs/profiles.md for ``[run]``, ``[process.*]`` and the role tables'
  placement keys; a role's own settings on its page: ``[trainer]`` docs/trainer.md (as its
  ``--flag``), ``[api]`` docs/api.md, ``[inference]`` docs/inference.md, ``[[env]]``
  docs/environments.md, ``[cluster]`` docs/cluster.md;
- an option or a command: README.md's commands, or the command's page in docs/, and its
  ``--help`` text (every option has one).

The keys are what each table's model accepts (the role layer's own keys added, the keys
it sets itself and refuses taken out); ``<name>`` stands for a name the profile chooses.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import typer.main
from pydantic import BaseModel

from grpo_trainer.api.settings import ApiSettings
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.train.config import TrainerConfig
from grpo_tui.cli import app
from grpo_tui.plan.cluster import PLACEMENT_KEYS, ClusterSettings
from grpo_tui.plan.profile import RunSettings
from grpo_tui.plan.settings import ENV_WIRED, TRAINER_ROLE_KEYS, TRAINER_WIRED
from grpo_tui.supervisor.spec import ProcessSpec

REPO = Path(__file__).resolve().parents[1]

PROFILE_KEYS = [
    "api.cors_origins",
    "api.db",
    "api.gpus_per_node",
    "api.host",
    "api.max_batches_offpolicy",
    "api.max_body_bytes",
    "api.max_group_size",
    "api.max_lease_seconds",
    "api.node",
    "api.nodes",
    "api.port",
    "api.synchronous",
    "api.token",
    "cluster.control_port",
    "cluster.engine",
    "cluster.gpus_per_node",
    "cluster.nodes",
    "cluster.rdzv_port",
    "cluster.srun_args",
    "env.data_file",
    "env.eval_every",
    "env.eval_k",
    "env.eval_size",
    "env.gpus_per_node",
    "env.group_size",
    "env.groups_per_request",
    "env.ignore_eos",
    "env.max_concurrency",
    "env.max_consecutive_errors",
    "env.max_groups",
    "env.max_token_length",
    "env.max_tokens",
    "env.min_batch_allocation",
    "env.name",
    "env.node",
    "env.nodes",
    "env.record_dropped_every",
    "env.record_dropped_mb",
    "env.seed",
    "env.task",
    "env.temperature",
    "env.top_p",
    "env.weight",
    "inference.backend",
    "inference.cpu_threads",
    "inference.data_parallel_size",
    "inference.device",
    "inference.dtype",
    "inference.enable_lora",
    "inference.enable_sleep_mode",
    "inference.enforce_eager",
    "inference.extra_args",
    "inference.gpu_memory_gb",
    "inference.gpu_memory_utilization",
    "inference.gpus",
    "inference.gpus_per_node",
    "inference.host",
    "inference.kv_cache_memory_bytes",
    "inference.lease_ttl",
    "inference.max_lora_rank",
    "inference.max_model_len",
    "inference.node",
    "inference.nodes",
    "inference.none_reload",
    "inference.port",
    "inference.seed",
    "inference.served_model_name",
    "inference.sglang_executable",
    "inference.tensor_parallel_size",
    "inference.url",
    "inference.vllm_executable",
    "inference.vllm_preimport",
    "inference.weight_transfer",
    "process.<name>.command",
    "process.<name>.cwd",
    "process.<name>.depends_on",
    "process.<name>.depends_on.<name>.condition",
    "process.<name>.env",
    "process.<name>.external",
    "process.<name>.external.detach",
    "process.<name>.external.url",
    "process.<name>.liveness",
    "process.<name>.liveness.command",
    "process.<name>.liveness.failure_threshold",
    "process.<name>.liveness.host",
    "process.<name>.liveness.initial_delay",
    "process.<name>.liveness.kind",
    "process.<name>.liveness.pattern",
    "process.<name>.liveness.period",
    "process.<name>.liveness.port",
    "process.<name>.liveness.success_threshold",
    "process.<name>.liveness.timeout",
    "process.<name>.liveness.url",
    "process.<name>.metrics_url",
    "process.<name>.needs",
    "process.<name>.needs.[].any_of",
    "process.<name>.needs.[].at_least",
    "process.<name>.port",
    "process.<name>.prestart",
    "process.<name>.progress",
    "process.<name>.progress.bearer_env",
    "process.<name>.progress.body",
    "process.<name>.progress.counters",
    "process.<name>.progress.failure_threshold",
    "process.<name>.progress.idle_after",
    "process.<name>.progress.initial_delay",
    "process.<name>.progress.kind",
    "process.<name>.progress.metrics_url",
    "process.<name>.progress.period",
    "process.<name>.progress.success_threshold",
    "process.<name>.progress.timeout",
    "process.<name>.progress.url",
    "process.<name>.readiness",
    "process.<name>.readiness.command",
    "process.<name>.readiness.failure_threshold",
    "process.<name>.readiness.host",
    "process.<name>.readiness.initial_delay",
    "process.<name>.readiness.kind",
    "process.<name>.readiness.pattern",
    "process.<name>.readiness.period",
    "process.<name>.readiness.port",
    "process.<name>.readiness.success_threshold",
    "process.<name>.readiness.timeout",
    "process.<name>.readiness.url",
    "process.<name>.restart",
    "process.<name>.restart.backoff_base",
    "process.<name>.restart.backoff_cap",
    "process.<name>.restart.backoff_factor",
    "process.<name>.restart.max_restarts",
    "process.<name>.restart.policy",
    "process.<name>.restart.reset_after",
    "process.<name>.role",
    "process.<name>.shutdown",
    "process.<name>.shutdown.signal",
    "process.<name>.shutdown.timeout",
    "process.<name>.slurm_step",
    "process.<name>.standby",
    "run.exit_with",
    "run.mode",
    "run.model",
    "run.name",
    "run.notify",
    "run.on_needed_failure",
    "run.output_dir",
    "run.seed",
    "run.stall_after",
    "run.tiny",
    "run.tiny.dtype",
    "run.tiny.final_norm_weight",
    "run.tiny.hidden_size",
    "run.tiny.intermediate_size",
    "run.tiny.num_heads",
    "run.tiny.num_kv_heads",
    "run.tiny.num_layers",
    "trainer.api_timeout",
    "trainer.batch_size",
    "trainer.batches_file",
    "trainer.beta",
    "trainer.checkpoint_interval",
    "trainer.clip_eps",
    "trainer.clip_eps_high",
    "trainer.cpu_offload",
    "trainer.cpu_threads",
    "trainer.device",
    "trainer.dtype",
    "trainer.entropy_coef",
    "trainer.gpus",
    "trainer.gpus_per_node",
    "trainer.grad_clip",
    "trainer.gradient_accumulation_steps",
    "trainer.gradient_checkpointing",
    "trainer.group_size",
    "trainer.inference_timeout",
    "trainer.keep_checkpoints",
    "trainer.lease_seconds",
    "trainer.logprob_chunk_size",
    "trainer.lora_alpha",
    "trainer.lora_dropout",
    "trainer.lora_lr",
    "trainer.lora_r",
    "trainer.lora_target_modules",
    "trainer.loss_type",
    "trainer.lr",
    "trainer.lr_schedule",
    "trainer.max_sync_lag",
    "trainer.metrics_file",
    "trainer.min_lr_ratio",
    "trainer.node",
    "trainer.nodes",
    "trainer.optimizer",
    "trainer.optimizer_impl",
    "trainer.ranks",
    "trainer.record_rollouts_every",
    "trainer.record_rollouts_mb",
    "trainer.resume",
    "trainer.seed",
    "trainer.seq_len",
    "trainer.sync_every",
    "trainer.sync_retries",
    "trainer.tis_cap",
    "trainer.training_steps",
    "trainer.use_wandb",
    "trainer.wandb_group",
    "trainer.wandb_project",
    "trainer.warmup_steps",
    "trainer.weight_decay",
    "trainer.weight_transfer_delta",
]

CLI_OPTIONS = [
    "tui",
    "tui --mode",
    "tui --inference-url",
    "tui PROFILE",
    "check",
    "check --mode",
    "check --inference-url",
    "check --profile-only",
    "check PROFILE",
    "run",
    "run --json",
    "run --inference-url",
    "run --logs",
    "run --mode",
    "run --run-dir",
    "run PROFILE",
    "sbatch",
    "sbatch --mode",
    "sbatch PROFILE",
    "serve",
    "serve --json",
    "serve --mode",
    "serve --run-dir",
    "serve PROFILE",
    "attach",
    "attach --status",
    "attach --via-slurm",
    "attach RUN_DIR",
    "view",
    "view --threshold",
    "view RUN_DIR",
    "samples",
    "samples --color-by",
    "samples --json",
    "samples --step",
    "samples --where",
    "samples RUN_DIR",
    "edit",
    "edit ASSIGNMENTS",
    "edit RUN_DIR",
    "sweep",
    "sweep --dir",
    "sweep --gpus",
    "sweep --headless",
    "sweep --inference-url",
    "sweep --keep-server",
    "sweep --parallel",
    "sweep --set",
    "sweep --threshold",
    "sweep --zip",
    "sweep PROFILE",
    "report",
    "report --output",
    "report --threshold",
    "report -o",
    "report TARGET",
]


def nested_models(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """The models an annotation holds, each with the path part it adds (``<name>`` under a
    mapping's values, ``[]`` under a list's items)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return nested_models(get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    if origin in (Union, types.UnionType):
        return [found for arg in get_args(annotation) for found in nested_models(arg)]
    if origin is dict:
        return [
            (f"<name>.{p}" if p else "<name>", m) for p, m in nested_models(get_args(annotation)[1])
        ]
    if origin in (list, tuple):
        items = [arg for arg in get_args(annotation) if arg is not Ellipsis]
        return [(f"[].{p}" if p else "[]", m) for arg in items for p, m in nested_models(arg)]
    return []


def model_keys(model: type[BaseModel], prefix: str) -> set[str]:
    """Every key of ``model`` and of the models inside it, dotted, under ``prefix``."""
    found = set()
    for name, info in model.model_fields.items():
        found.add(f"{prefix}.{name}")
        for part, inner in nested_models(info.annotation):
            found |= model_keys(inner, f"{prefix}.{name}" + (f".{part}" if part else ""))
    return found


def profile_keys() -> set[str]:
    """Every key a profile may set, table by table."""
    placement = {
        f"{table}.{key}"
        for table in ("api", "inference", "trainer", "env")
        for key in PLACEMENT_KEYS
    }
    trainer = model_keys(TrainerConfig, "trainer") - {f"trainer.{k}" for k in TRAINER_WIRED}
    env = model_keys(EnvSettings, "env") - {f"env.{k}" for k in ENV_WIRED}
    return (
        model_keys(RunSettings, "run")
        | model_keys(ApiSettings, "api")
        | model_keys(InferenceSettings, "inference")
        | trainer
        | {f"trainer.{k}" for k in TRAINER_ROLE_KEYS}
        | env
        | model_keys(ClusterSettings, "cluster")
        | (model_keys(ProcessSpec, "process.<name>") - {"process.<name>.name"})
        | placement
    )


def cli_options() -> set[str]:
    """``command ARGUMENT`` and ``command --option`` for every command of ``grpo-tui``."""
    found = set()
    for name, command in typer.main.get_command(app).commands.items():
        found.add(name)
        for param in command.params:
            if param.param_type_name == "option":
                found |= {f"{name} {flag}" for flag in param.opts}
            else:
                found.add(f"{name} {param.name.upper()}")
    return found


def docs_text() -> str:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return "\n".join(page.read_text() for page in pages)


def test_every_profile_key_is_listed() -> None:
    actual = profile_keys()
    assert sorted(actual - set(PROFILE_KEYS)) == [], "new profile keys: list them (and doc them)"
    assert sorted(set(PROFILE_KEYS) - actual) == [], "profile keys gone: take them off the list"
    assert len(set(PROFILE_KEYS)) == len(PROFILE_KEYS), "a key listed twice"


def test_every_cli_option_is_listed() -> None:
    actual = cli_options()
    assert sorted(actual - set(CLI_OPTIONS)) == [], (
        "new commands or options: list them (and doc them)"
    )
    assert sorted(set(CLI_OPTIONS) - actual) == [], (
        "commands or options gone: take them off the list"
    )
    assert len(set(CLI_OPTIONS)) == len(CLI_OPTIONS), "an option listed twice"


def test_every_profile_key_is_documented() -> None:
    docs = docs_text()
    undocumented = []
    for key in PROFILE_KEYS:
        leaf = key.rsplit(".", 1)[-1]
        flag = "--" + leaf.replace("_", "-")
        if not re.search(rf"(?<![\w-]){leaf}(?![\w-])|{flag}(?![\w-])", docs):
            undocumented.append(key)
    assert undocumented == [], "name each in README.md or docs/ (the module docstring says where)"


def test_every_cli_option_is_documented_and_has_help() -> None:
    docs = docs_text()
    commands = typer.main.get_command(app).commands
    undocumented, helpless = [], []
    for entry in CLI_OPTIONS:
        command, _, option = entry.partition(" ")
        if not option:
            if f"grpo-tui {command}" not in docs and command != "tui":
                undocumented.append(entry)
            continue
        if option.startswith("-") and not re.search(rf"{option}(?![\w-])", docs):
            undocumented.append(entry)
        param = next(
            p for p in commands[command].params if option in p.opts or option == p.name.upper()
        )
        if option.startswith("-") and not getattr(param, "help", None):
            helpless.append(entry)
    assert undocumented == [], "name each in README.md or docs/"
    assert helpless == [], "give each option a help text (its --help)"
