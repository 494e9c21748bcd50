"""Preflight: what a checked plan will meet on this machine, found before anything starts.

A profile can be valid and still unable to run here: an environment's task that does not
import or is not a ``Task``, an executable not on ``PATH``, a port another process holds.
Each is a :class:`Problem` naming the profile key, so ``grpo-tui check`` and ``grpo-tui
run`` exit 2 with it instead of a run that retries for half a minute (or waits forever).

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
from grpo_tui.plan.profile import KeyPath, Problem
from grpo_tui.plan.roles import Plan
from grpo_tui.plan.settings import env_index
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


def preflight(plan: Plan) -> list[Problem]:
    """Every problem this machine would give the plan's processes at start."""
    local = [spec for spec in plan.specs if spec.slurm_step is None]
    problems = [*_task_problems(plan)]
    problems += [p for spec in local if (p := _executable_problem(plan, spec)) is not None]
    problems += [p for spec in local if (p := _port_problem(plan, spec)) is not None]
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
