"""The resolved process plan as text (``grpo-tui check``): start order, commands with their
secrets masked, probes, ports, dependencies, GPUs and Slurm placement."""

from __future__ import annotations

import shlex

from rich.console import Console

from grpo_tui.plan.cluster import plan_lines
from grpo_tui.plan.profile import Profile
from grpo_tui.plan.roles import Plan
from grpo_tui.supervisor.spec import ExecProbe, HttpProbe, LogLineProbe, ProcessSpec, TcpProbe

SECRET_FLAGS = ("--token", "--api-token")


def describe_probe(probe: HttpProbe | TcpProbe | ExecProbe | LogLineProbe | None) -> str:
    """A probe in one line: what it checks and how often."""
    if probe is None:
        return "-"
    match probe:
        case HttpProbe():
            what = f"http GET {probe.url}"
        case TcpProbe():
            what = f"tcp {probe.host}:{probe.port}"
        case ExecProbe():
            what = f"exec {shlex.join(probe.command)}"
        case LogLineProbe():
            what = f"log_line /{probe.pattern}/"
    return f"{what} every {probe.period:g}s"


def _masked(command: list[str]) -> list[str]:
    """The command with secret flag values replaced, for printing."""
    return [
        "***" if i > 0 and command[i - 1] in SECRET_FLAGS else part
        for i, part in enumerate(command)
    ]


def _secret(variable: str) -> bool:
    return any(word in variable for word in ("TOKEN", "SECRET", "KEY"))


def _describe_spec(index: int, spec: ProcessSpec) -> list[str]:
    deps = ", ".join(f"{name} ({dep.condition.value})" for name, dep in spec.depends_on.items())
    restart = spec.restart
    policy = restart.policy
    if policy != "no":
        policy += f" (max {restart.max_restarts}, backoff {restart.backoff_base:g}s x"
        policy += f"{restart.backoff_factor:g} cap {restart.backoff_cap:g}s)"
    lines = [f"{index}. {spec.name} [{spec.role}]"]
    if (external := spec.external) is not None:
        lines.append(f"   external:   {external.url} (attached: never started, stopped, signalled)")
    lines += [
        f"   command:    {shlex.join(_masked(spec.command))}",
        f"   depends_on: {deps or '-'}"
        + (" (spawned at once, waits at its start gate)" if spec.prestart and deps else ""),
        f"   readiness:  {describe_probe(spec.readiness)}",
    ]
    if spec.external is not None and spec.external.detach:
        lines.append(f"   detach:     {shlex.join(spec.external.detach)} (at the run's end)")
    if spec.liveness is not None:
        lines.append(f"   liveness:   {describe_probe(spec.liveness)}")
    if (progress := spec.progress) is not None:
        lines.append(
            f"   progress:   POST {progress.url} once idle {progress.idle_after:g}s "
            f"(checked every {progress.period:g}s)"
        )
    if spec.needs:
        lines.append(f"   needs:      {'; '.join(need.describe() for need in spec.needs)}")
    if spec.port is not None:
        lines.append(f"   port:       {spec.port}")
    if spec.env:
        shown = {k: "***" if _secret(k) else v for k, v in spec.env.items()}
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
        lines.append(f"   env:        {env}")
    if spec.cwd:
        lines.append(f"   cwd:        {spec.cwd}")
    lines.append(f"   restart:    {policy}")
    lines.append(f"   shutdown:   {spec.shutdown.signal}, timeout {spec.shutdown.timeout:g}s")
    return lines


def describe_gpus(plan: Plan) -> str:
    """Which role holds which GPUs, in one line (empty when no role is pinned to a GPU)."""
    parts = []
    for role, placement in plan.roles.gpu_plan.placements.items():
        if not placement.gpus:
            continue
        what = f"{role} {list(placement.gpus)}"
        if placement.ranks > 1:
            what += f" ({placement.ranks} ranks, torchrun)"
        inference = plan.roles.inference
        if role == "inference" and inference is not None and inference.backend == "vllm":
            tp, dp = inference.tensor_parallel_size, inference.data_parallel_size
            what += f" (vLLM tensor_parallel_size {tp} x data_parallel_size {dp})"
        parts.append(what)
    return "; ".join(parts)


def print_plan(console: Console, profile: Profile, plan: Plan) -> None:
    """The resolved plan: start order, commands, probes, ports, dependencies."""
    run = profile.run
    console.print(f"profile   {profile.path}: ok", markup=False)
    console.print(f"run       {run.name}  mode={plan.roles.mode}  model={run.model}", markup=False)
    console.print(f"run dir   {plan.run_dir} (created by `grpo-tui run`)", markup=False)
    console.print(f"exit_with {plan.exit_with or '- (runs until stopped)'}", markup=False)
    gpus = describe_gpus(plan)
    if gpus:
        console.print(f"gpus      {gpus}", markup=False)
    roles = plan.roles
    if roles.cluster.slurm:
        local = [s.name for s in plan.specs if s.slurm_step is None]
        order = [s.name for s in plan.specs]
        placed = sorted(roles.placements.values(), key=lambda p: order.index(p.process))
        for line in plan_lines(roles.cluster, placed, roles.allocation, local):
            console.print(line, markup=False)
    console.print(f"start order: {' -> '.join(s.name for s in plan.specs)}", markup=False)
    for index, spec in enumerate(plan.specs, start=1):
        console.print("\n".join(_describe_spec(index, spec)), markup=False, soft_wrap=True)
