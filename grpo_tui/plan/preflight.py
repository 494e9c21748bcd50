"""Preflight: what a checked plan will meet on this machine, found before anything starts.

A profile can be valid and still unable to run here: an environment's task that does not
import or is not a ``Task``, a model path or a data file that does not exist, an
executable not on ``PATH``, a port another process holds. Each is a :class:`Problem`
naming the profile key, so ``grpo-tui check`` and ``grpo-tui run`` exit 2 with it instead
of a run that retries for half a minute (or waits forever). (An environment's
``data_file`` and the trainer's ``resume`` are checked where their settings validate.)

``run.model`` is a local directory or a hub id, told apart as Hugging Face does: what
exists on disk is a path (a model directory, with its ``config.json``); what does not is
a hub id if it has a hub id's form (``name`` or ``namespace/name``, not starting with
``/``, ``.`` or ``~``), which ``check`` cannot look up offline; else a missing path.

A task is imported in a subprocess with a timeout: a task module may import torch (seconds)
or hang on the network, and ``check`` must stay torch-free and bounded. Built-in tasks are
ours and are not imported. Processes that run as Slurm steps run on other nodes: their
executables and ports cannot be known from here and are not checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grpo_trainer.envs.settings import BUILTIN_TASKS
from grpo_tui.plan.external import probe_problems
from grpo_tui.plan.profile import Problem
from grpo_tui.plan.roles import Plan
from grpo_tui.plan.settings import RoleSettings, env_index
from grpo_tui.plan.toml_keys import KeyPath
from grpo_tui.supervisor.ports import find_port_holder
from grpo_tui.supervisor.spec import ProcessSpec

TASK_IMPORT_TIMEOUT = 60.0
"""Seconds a task's import may take in the preflight (torch and transformers: ~10 s)."""

IMPORT_TASK = """\
import sys
from grpo_trainer.envs.cli import load_task
try:
    load_task(sys.argv[1])
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
"""

EXECUTABLE_KEYS = {"vllm": "vllm_executable", "sglang": "sglang_executable"}
"""The inference key naming the executable of each backend that runs one of its own."""

MODEL_USERS = ("inference", "trainer", "env")
"""Roles that load ``run.model`` (an environment its tokenizer)."""
HUB_EXAMPLE = "'Qwen/Qwen2.5-0.5B'"


def preflight(plan: Plan) -> list[Problem]:
    """Every problem this machine would give the plan's processes at start."""
    local = [spec for spec in plan.specs if spec.slurm_step is None]
    problems = [*_task_problems(plan), *_path_problems(plan)]
    problems += [p for spec in local if (p := _executable_problem(plan, spec)) is not None]
    problems += [p for spec in local if (p := _port_problem(plan, spec)) is not None]
    problems += probe_problems(plan.roles.settings, plan.roles.mode)  # an inference url's
    return problems


def _task_problems(plan: Plan) -> list[Problem]:
    """Each environment's task, imported in parallel subprocesses as its process would."""
    specs = {spec.name: spec for spec in plan.specs}
    checks = [
        (name, settings.task, specs[name])
        for name in plan.roles.roles
        if name.startswith("env")
        and (settings := plan.roles.settings.envs[env_index(name)]) is not None
        and settings.task not in BUILTIN_TASKS
    ]
    if not checks:
        return []
    with ThreadPoolExecutor(max_workers=len(checks)) as pool:
        answers = list(pool.map(lambda check: _import_task(check[1], check[2]), checks))
    return [
        plan.profile.problem(("env", env_index(name), "task"), f"{task!r} {answer}")
        for (name, task, _), answer in zip(checks, answers, strict=True)
        if answer
    ]


def _import_task(task: str, spec: ProcessSpec) -> str:
    """Why ``task`` cannot be loaded where ``spec`` runs ('' when it can)."""
    env = {**os.environ, **spec.env}
    try:
        done = subprocess.run(
            [sys.executable, "-c", IMPORT_TASK, task],
            capture_output=True,
            text=True,
            cwd=spec.cwd,
            env=env,
            timeout=TASK_IMPORT_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return f"did not import within {TASK_IMPORT_TIMEOUT:g} s"
    if done.returncode == 0:
        return ""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return f"cannot be loaded: {lines[-1] if lines else f'exit {done.returncode}'}"


def _path_problems(plan: Plan) -> list[Problem]:
    """``run.model`` and the trainer's ``batches_file``, where a local process reads them."""
    local = {spec.role for spec in plan.specs if spec.slurm_step is None}
    settings = plan.roles.settings
    problems = []
    model = _model_problem(plan.profile.run.model, settings)
    if model and local & set(MODEL_USERS):
        problems.append(plan.profile.problem(("run", "model"), model))
    batches = settings.tables.get("trainer", {}).get("batches_file")
    if isinstance(batches, str) and "trainer" in local and not Path(batches).is_file():
        what = "is not a file" if Path(batches).exists() else "no such file"
        message = f"{batches!r}: {what} (expected the JSONL of groups the trainer reads)"
        problems.append(plan.profile.problem(("trainer", "batches_file"), message))
    return problems


def _model_problem(model: str, settings: RoleSettings) -> str:
    """Why ``run.model`` cannot be loaded from here ('' when it can, as far as we know)."""
    if settings.profile.run.tiny_model:
        return ""
    path = Path(model).expanduser()
    expected = f"expected a model directory (Hugging Face format) or a hub id like {HUB_EXAMPLE}"
    if path.is_dir():
        found = (path / "config.json").is_file()
        return "" if found else f"{model!r} has no config.json: {expected}"
    if path.exists():
        return f"{model!r} is a file: {expected}"
    if _hub_id(model):
        return ""
    return f"{model!r}: no such directory, and not a hub id like {HUB_EXAMPLE} (namespace/name)"


def _hub_id(name: str) -> bool:
    """Whether ``name`` has a hub id's form (Hugging Face's own check)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.startswith(("/", ".", "~")):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _executable_problem(plan: Plan, spec: ProcessSpec) -> Problem | None:
    executable = spec.command[0]
    if "/" in executable:
        path = Path(spec.cwd or ".") / executable
        found = path.is_file() and os.access(path, os.X_OK)
    else:
        search = spec.env.get("PATH", os.environ.get("PATH", os.defpath))
        found = shutil.which(executable, path=search) is not None
    if found:
        return None
    return plan.profile.problem(
        _executable_key(plan, spec), f"executable {executable!r} not found (PATH or cwd)"
    )


def _executable_key(plan: Plan, spec: ProcessSpec) -> KeyPath:
    """The key that names a process's executable: a process table's ``command``, or the
    inference backend's own executable key."""
    if spec.name not in plan.roles.roles:
        return ("process", spec.name, "command")
    inference = plan.roles.inference
    if spec.name == "inference" and inference is not None:
        key = EXECUTABLE_KEYS.get(inference.backend)
        return ("inference", key) if key else ("inference",)
    return (spec.name,)


def _port_problem(plan: Plan, spec: ProcessSpec) -> Problem | None:
    if spec.port is None or (holder := find_port_holder(spec.port)) is None:
        return None
    adjusted = "port" in plan.roles.adjustments.get(spec.name, {})
    role = spec.name in plan.roles.roles and not adjusted
    key: KeyPath = (spec.name, "port") if role else ("process", spec.name, "port")
    return plan.profile.problem(key, holder.describe())
