"""The ``grpo-tui`` command: dashboard (default), run, check, view, samples, sweep, report.

``check`` and ``run`` never import textual (nor torch): the dashboard and the viewer are
imported only when asked for. Bad profiles exit 2 with one line per problem.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from grpo_tui.output import SafeStream
from grpo_tui.plan.cluster import Allocation, plan_lines
from grpo_tui.plan.profile import Profile, ProfileError, load_profile
from grpo_tui.plan.roles import Plan, build_plan
from grpo_tui.supervisor.spec import ExecProbe, HttpProbe, LogLineProbe, ProcessSpec, TcpProbe
from grpo_tui.terminal import prefer_quick_escape

DEFAULT_PROFILE = Path("profiles/quickstart.toml")
EXIT_BAD_INPUT = 2
DEFAULT_COMMAND = "tui"
SECRET_FLAGS = ("--token", "--api-token")


class DefaultToTui(TyperGroup):
    """``grpo-tui [PROFILE] [--mode M]`` means ``grpo-tui tui ...``: a default command.

    A first word that is neither a command nor a profile (a bare word naming no file) is a
    mistyped command: it goes to the group, which names it with the nearest command ("No
    such command 'chek'. Did you mean 'check'?", exit 2) instead of reaching the dashboard
    as a stray argument.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        group_flags = {"--help", "-h", "--install-completion", "--show-completion"}
        first = args[0] if args else None
        if first is None or (
            first not in self.commands
            and first not in group_flags
            and not _looks_like_command(first)
        ):
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


def _looks_like_command(word: str) -> bool:
    """A bare word that names no file: what a mistyped command looks like."""
    if word.startswith("-") or "/" in word or "." in word:
        return False
    return not Path(word).exists()


app = typer.Typer(
    cls=DefaultToTui,
    help="Supervise GRPO training: dashboard, headless runs, profile checks.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ModeOption = Annotated[
    str | None,
    typer.Option(
        "--mode",
        help=(
            "Weight-sync mode, overriding run.mode: none, shared_vllm, lora_only, "
            "lora_restart, colocate."
        ),
    ),
]


SetOption = Annotated[
    list[str],
    typer.Option(
        "--set",
        help="KEY=V1,V2,... a profile key and the values to sweep (repeat for more keys).",
    ),
]
ThresholdOption = Annotated[
    float,
    typer.Option("--threshold", help="Reward (5-step mean of reward/mean) to time each run to."),
]


def _err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(error: ProfileError) -> typer.Exit:
    console = _err()
    count = len(error.problems)
    for problem in sorted(error.problems, key=lambda p: (p.file, p.line or 0)):
        console.print(f"[bold red]error[/] {escape(str(problem))}", soft_wrap=True)
    console.print(f"{count} problem{'s' if count != 1 else ''}; nothing was started.")
    return typer.Exit(EXIT_BAD_INPUT)


def _load(
    profile: Path, mode: str | None, *, run_dir: Path | None = None, in_job: bool = False
) -> tuple[Profile, Plan]:
    """Load and plan a profile. ``in_job``: a cluster profile gets the current Slurm job's
    nodes, and the command fails (exit 2) outside a job or on a smaller one."""
    loaded = load_profile(profile, mode=mode)
    allocation = None
    if in_job and loaded.table("cluster") and loaded.data["cluster"].get("engine") == "slurm":
        allocation = _current_allocation(loaded)
    return loaded, build_plan(loaded, run_dir=run_dir, allocation=allocation)


def _preflight(plan: Plan) -> None:
    """What this machine would refuse at start (a task that does not load, an executable not
    found, a port in use): exit 2 naming each key, before anything starts."""
    from grpo_tui.plan.preflight import preflight

    problems = preflight(plan)
    if problems:
        raise _fail(ProfileError(problems))


def _current_allocation(profile: Profile) -> Allocation:
    where = ("cluster", "engine")
    try:
        allocation = Allocation.from_environment()
    except (OSError, RuntimeError) as error:
        problem = profile.problem(where, f"cannot read the Slurm job: {error}")
        raise ProfileError([problem]) from None
    if allocation is None:
        raise ProfileError(
            [
                profile.problem(
                    where,
                    '"slurm" runs inside a Slurm job: submit it with `grpo-tui sbatch`, '
                    "or run it under salloc",
                )
            ]
        )
    wanted = profile.data["cluster"].get("nodes", 1)
    if isinstance(wanted, int) and len(allocation) < wanted:
        raise ProfileError(
            [
                profile.problem(
                    ("cluster", "nodes"),
                    f"the profile needs {wanted} nodes but job {allocation.job_id} has "
                    f"{len(allocation)} ({', '.join(allocation.names)})",
                )
            ]
        )
    return allocation


def _default_profile(profile: Path | None) -> Path:
    if profile is not None:
        return profile
    if DEFAULT_PROFILE.is_file():
        return DEFAULT_PROFILE
    _err().print(f"[bold red]error[/] no profile given and {DEFAULT_PROFILE} is not here")
    raise typer.Exit(EXIT_BAD_INPUT)


@app.command(DEFAULT_COMMAND)
def tui(
    profile: Annotated[
        Path | None, typer.Argument(help=f"Profile TOML (default: {DEFAULT_PROFILE}).")
    ] = None,
    mode: ModeOption = None,
) -> None:
    """Open the dashboard on a profile (the default command); headless when stdout is not a
    terminal (a pipe, a file, a batch job), as ``grpo-tui run``."""
    path = _default_profile(profile)
    try:
        loaded, plan = _load(path, mode)
    except ProfileError as error:
        raise _fail(error) from None
    _preflight(plan)
    if not sys.stdout.isatty():
        _err().print("stdout is not a terminal: running headless (as `grpo-tui run`)")
        from grpo_tui.headless import run_headless

        raise typer.Exit(run_headless(plan))
    prefer_quick_escape()
    from grpo_tui.app import run_app

    raise typer.Exit(run_app(loaded, mode=mode) or 0)


@app.command()
def check(
    profile: Annotated[Path, typer.Argument(help="Profile TOML to validate.")],
    mode: ModeOption = None,
    profile_only: Annotated[
        bool,
        typer.Option(
            "--profile-only",
            help="Check the profile only, not what this machine would refuse at start "
            "(tasks, executables, ports): for a profile meant for another machine.",
        ),
    ] = False,
) -> None:
    """Validate a profile and print the resolved process plan (or every problem), with what
    this machine would refuse at start: a task that does not load, an executable not found,
    a port in use."""
    try:
        loaded, plan = _load(profile, mode)
    except ProfileError as error:
        raise _fail(error) from None
    if not profile_only:
        _preflight(plan)
    print_plan(Console(highlight=False, soft_wrap=True), loaded, plan)


@app.command()
def run(
    profile: Annotated[Path, typer.Argument(help="Profile TOML to run.")],
    mode: ModeOption = None,
    json_lines: Annotated[
        bool, typer.Option("--json", help="Print every event as a JSON line on stdout.")
    ] = False,
    logs: Annotated[
        bool, typer.Option("--logs", help="Echo the processes' output on the console.")
    ] = False,
    run_dir: Annotated[
        Path | None,
        typer.Option("--run-dir", help="Run directory to create (default: output_dir/name-time)."),
    ] = None,
) -> None:
    """Run a profile headless: supervise until the exit_with process ends, then shut down."""
    if run_dir is not None and run_dir.exists():
        _err().print(f"[bold red]error[/] --run-dir {escape(str(run_dir))}: already exists")
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        _, plan = _load(profile, mode, run_dir=run_dir and run_dir.resolve(), in_job=True)
    except ProfileError as error:
        raise _fail(error) from None
    _preflight(plan)
    from grpo_tui.headless import run_headless

    raise typer.Exit(run_headless(plan, json_lines=json_lines, echo_logs=logs))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sbatch(
    ctx: typer.Context,
    profile: Annotated[Path, typer.Argument(help="Profile TOML with [cluster] engine = slurm.")],
    mode: ModeOption = None,
) -> None:
    """Submit a cluster profile as a Slurm batch job; any further options go to sbatch."""
    try:
        loaded, plan = _load(profile, mode)
        if not plan.roles.cluster.slurm:
            raise ProfileError(
                [loaded.problem(("cluster", "engine"), 'sbatch needs engine = "slurm"')]
            )
    except ProfileError as error:
        raise _fail(error) from None
    from grpo_tui.plan.sbatch import batch_script, submit

    script = batch_script(plan, profile, mode=mode, cwd=Path.cwd())
    try:
        path, job = submit(plan, script, ctx.args)
    except (OSError, RuntimeError) as error:
        _err().print(f"[bold red]error[/] sbatch: {escape(str(error))}")
        raise typer.Exit(1) from None
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"submitted job {job}: {path}", markup=False)
    console.print(f"run dir   {plan.run_dir} (once the job starts)", markup=False)
    console.print(f"attach    grpo-tui attach {plan.run_dir}", markup=False)


@app.command()
def attach(
    run_dir: Annotated[Path, typer.Argument(help="The run directory `grpo-tui sbatch` printed.")],
    status: Annotated[
        bool, typer.Option("--status", help="Print each process's state (asks the supervisor).")
    ] = False,
    via_slurm: Annotated[
        bool, typer.Option("--via-slurm", help="Go through srun even on the supervisor's host.")
    ] = False,
) -> None:
    """Follow and steer a cluster run: its live dashboard (read-only once it ended), or states."""
    import os

    from grpo_tui.attach import on_supervisor_host, read_allocation, srun_hop, supervisor_status

    run_dir = run_dir.resolve()
    record = read_allocation(run_dir)
    if record is None:
        script = run_dir.with_name(run_dir.name + ".sbatch")
        why = "not started yet (its job is pending: squeue)" if script.exists() else "no such run"
        _err().print(f"[bold red]error[/] {escape(str(run_dir))}: {why}")
        raise typer.Exit(EXIT_BAD_INPUT)
    if via_slurm or not on_supervisor_host(record):
        args = ["--status"] if status else []
        hop = srun_hop(record, run_dir, args, pty=not status)
        os.execvp(hop[0], hop)
    if status:
        from grpo_trainer.control import ControlError

        try:
            states = supervisor_status(run_dir)
        except (ControlError, OSError) as error:
            _err().print(f"[bold red]error[/] {escape(str(error))}")
            raise typer.Exit(1) from None
        for name, state in states.items():
            print(f"{name:<12} {state}")
        return
    prefer_quick_escape()
    from grpo_tui.app import run_attach

    raise typer.Exit(run_attach(run_dir) or 0)


@app.command()
def view(
    run_dir: Annotated[
        Path, typer.Argument(help="A run or sweep directory, e.g. runs/quickstart-...")
    ],
    threshold: ThresholdOption = 0.8,
) -> None:
    """Open a finished run's metrics, events and logs, or a sweep's comparison (read-only)."""
    from grpo_tui.sweep.store import SweepDir

    if SweepDir.is_sweep(run_dir):
        prefer_quick_escape()
        from grpo_tui.sweep_app import run_sweep_app

        raise typer.Exit(run_sweep_app(SweepDir(run_dir), runner=None, threshold=threshold))
    if not (run_dir / "events.jsonl").is_file() and not (run_dir / "profile.toml").is_file():
        _err().print(f"[bold red]error[/] {escape(str(run_dir))}: not a run directory")
        raise typer.Exit(EXIT_BAD_INPUT)
    prefer_quick_escape()
    from grpo_tui.app import run_view

    raise typer.Exit(run_view(run_dir) or 0)


@app.command()
def samples(
    run_dir: Annotated[Path, typer.Argument(help="A run directory, e.g. runs/quickstart-...")],
    step: Annotated[
        int | None, typer.Option("--step", help="The groups of this step (default: the last).")
    ] = None,
    where: Annotated[
        str,
        typer.Option(
            "--where", help='Filter as in the inspector, e.g. "kind=dropped env=toy lag>=1".'
        ),
    ] = "",
    json_lines: Annotated[
        bool, typer.Option("--json", help="One JSON object per group, every token's numbers.")
    ] = False,
    color_by: Annotated[
        str, typer.Option("--color-by", help="delta, entropy, ratio or logp.")
    ] = "delta",
) -> None:
    """Print a run's recorded groups (what the rollout inspector shows), newest first."""
    import json

    from grpo_trainer.records.query import parse_filter, select
    from grpo_trainer.records.rollout_reader import RolloutIndex
    from grpo_tui.rollout_view import MEASURES, group_json, group_renderable

    if color_by not in MEASURES:
        _err().print(f"[bold red]error[/] --color-by: one of {', '.join(MEASURES)}")
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        flt = parse_filter(where)
    except ValueError as error:
        _err().print(f"[bold red]error[/] --where {escape(str(error))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    index = RolloutIndex(run_dir)
    index.poll()
    if not len(index):
        _err().print(f"[bold red]error[/] {escape(str(run_dir))}: no recorded groups (rollouts/)")
        raise typer.Exit(EXIT_BAD_INPUT)
    last = int(index.rows["step"][select(index, flt)].max(initial=-1))
    rows = select(index, flt.with_step(step if step is not None else last))
    if not len(rows):
        _err().print(
            f"[bold red]error[/] no group matches {escape(flt.with_step(step).describe())}"
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    console = Console(highlight=False, soft_wrap=not json_lines)
    for row in rows.tolist():
        record = index.open(row)
        if json_lines:
            print(json.dumps(group_json(record)))
        else:
            console.print(group_renderable(record, color_by))
            console.rule(style="dim")


@app.command()
def edit(
    run_dir: Annotated[Path, typer.Argument(help="The running run's directory.")],
    assignments: Annotated[
        list[str], typer.Argument(help="key=value, e.g. lr=3e-5 temperature=0.8 tis_cap=none")
    ],
) -> None:
    """Change hyperparameters of a running run from each process's next step.

    Editable: lr, lora_lr, beta, clip_eps, clip_eps_high, entropy_coef, tis_cap (trainer),
    temperature (environments), max_batches_offpolicy (API). Validated like the profile.
    """
    from grpo_trainer.control import ControlError, SupervisorLink
    from grpo_trainer.live_edits import parse_assignments

    console = _err()
    try:
        values = parse_assignments(assignments)
    except ValueError as error:
        console.print(f"[bold red]error[/] {escape(str(error))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    socket = run_dir / "control.sock"
    if not socket.exists():
        console.print(
            f"[bold red]error[/] {escape(str(run_dir))}: no control socket (not running?)"
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    link = SupervisorLink(str(socket), process="grpo-tui edit")
    try:
        result = link.request("edit", args=values, timeout=30)
    except ControlError as error:
        console.print(f"[bold red]error[/] {escape(str(error))}")
        refused = str(error).startswith("supervisor refused")
        raise typer.Exit(EXIT_BAD_INPUT if refused else 1) from None
    finally:
        link.close()
    applied = " ".join(f"{k}={v}" for k, v in result["values"].items())
    print(f"edited {applied} -> {', '.join(result['processes'])} (from their next step)")


@app.command(context_settings={"allow_extra_args": True})
def sweep(
    ctx: typer.Context,
    profile: Annotated[Path, typer.Argument(help="Profile TOML every cell starts from.")],
    sets: SetOption,
    zipped: Annotated[
        bool, typer.Option("--zip", help="Pair the i-th values of each key instead of a grid.")
    ] = False,
    parallel: Annotated[int, typer.Option("--parallel", min=1, help="Cells at once.")] = 1,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Sweep directory (default <output_dir>/<name>-sweep)."),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help="GPUs to share among cells (default CUDA_VISIBLE_DEVICES)."),
    ] = None,
    headless: Annotated[
        bool,
        typer.Option(
            "--headless",
            help="No dashboard: print progress lines (the default when stdout is not a terminal).",
        ),
    ] = False,
    threshold: ThresholdOption = 0.8,
) -> None:
    """Run a grid of profile variants, N at a time; started again, it runs only unfinished cells.

    With [cluster] engine = "slurm" each cell is one batch job; options after `--` go to
    sbatch (`-- --time=30 --partition=gpu`).
    """
    import os

    from grpo_tui.sweep.grid import check_cells, expand, parse_set
    from grpo_tui.sweep.resources import gpu_pool, gpus_needed, parallel_limit
    from grpo_tui.sweep.runner import SweepRunner, run_sweep
    from grpo_tui.sweep.slurm_jobs import SlurmJobs
    from grpo_tui.sweep.store import SweepDir, SweepDirError

    try:
        loaded = load_profile(profile)
        axes = [parse_set(option) for option in sets]
        cells = expand(axes, zipped=zipped)
        check_cells(loaded, cells)
        on_slurm = build_plan(loaded).roles.cluster.slurm
        if ctx.args and not on_slurm:
            raise ProfileError(
                [
                    loaded.problem(
                        ("cluster", "engine"),
                        f'sbatch options ({shlex.join(ctx.args)}) need engine = "slurm"',
                    )
                ]
            )
    except ProfileError as error:
        raise _fail(error) from None
    except ValueError as error:
        _err().print(f"[bold red]error[/] {escape(str(error))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    pool = [] if on_slurm else gpu_pool(gpus, os.environ)  # Slurm gives each job its GPUs
    per_cell = 0 if on_slurm else gpus_needed(loaded.data)
    if per_cell and not pool and parallel > 1:
        _err().print(
            f"[bold red]error[/] the profile uses {per_cell} GPU(s) per cell: give --gpus "
            "(or CUDA_VISIBLE_DEVICES) to share GPUs among parallel cells"
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    limit = parallel_limit(parallel, per_cell if pool else 0, pool)
    if limit < 1:
        _err().print(f"[bold red]error[/] one cell needs {per_cell} GPUs; --gpus gives {len(pool)}")
        raise typer.Exit(EXIT_BAD_INPUT)
    where = directory or Path(loaded.run.output_dir) / f"{loaded.run.name}-sweep"
    store = SweepDir(where)
    try:
        record = store.create_or_match(profile, axes, cells, zipped=zipped)
    except SweepDirError as error:
        _err().print(f"[bold red]error[/] {escape(str(error))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    headless = headless or not sys.stdout.isatty()
    console = Console(file=SafeStream(sys.stdout), highlight=False, soft_wrap=True)

    def log(line: str) -> None:
        console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {escape(line)}")

    runner = SweepRunner(
        store,
        record,
        loaded,
        parallel=limit,
        gpus=pool if per_cell else [],
        log=log,
        slurm=SlurmJobs(ctx.args) if on_slurm else None,
    )
    how = "Slurm jobs" if on_slurm else "cells"
    log(f"sweep {store.path}: {len(cells)} cells, up to {limit} {how} at once")
    if headless:
        code = run_sweep(runner)
        log(f"sweep {'finished' if code == 0 else 'ended'} (exit {code}); grpo-tui view {where}")
        raise typer.Exit(code)
    prefer_quick_escape()
    from grpo_tui.sweep_app import run_sweep_app

    raise typer.Exit(run_sweep_app(store, runner=runner, threshold=threshold))


@app.command()
def report(
    target: Annotated[Path, typer.Argument(help="A sweep directory or a run directory.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="HTML file (default TARGET/report.html).")
    ] = None,
    threshold: ThresholdOption = 0.8,
) -> None:
    """Write a self-contained HTML report (curves as inline SVG, the comparison table)."""
    from grpo_tui.sweep.report import write_report

    try:
        path = write_report(target, output or target / "report.html", threshold=threshold)
    except ValueError as error:
        _err().print(f"[bold red]error[/] {escape(str(error))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    Console(highlight=False).print(f"report: {path}", markup=False)


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
    lines = [
        f"{index}. {spec.name} [{spec.role}]",
        f"   command:    {shlex.join(_masked(spec.command))}",
        f"   depends_on: {deps or '-'}"
        + (" (spawned at once, waits at its start gate)" if spec.prestart and deps else ""),
        f"   readiness:  {describe_probe(spec.readiness)}",
    ]
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


def main() -> None:
    """Entry point of the ``grpo-tui`` script."""
    app()
