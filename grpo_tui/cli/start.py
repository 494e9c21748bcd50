"""The commands that start or check a profile: the dashboard (the default), ``check``,
``run`` (headless) and ``sbatch`` (a cluster run as a Slurm job)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from grpo_tui.cli.group import (
    DEFAULT_COMMAND,
    EXIT_BAD_INPUT,
    InferenceUrlOption,
    ModeOption,
    app,
    err_console,
    fail,
)
from grpo_tui.cli.loading import DEFAULT_PROFILE, default_profile, load_plan, preflight_or_exit
from grpo_tui.cli.plan_text import print_plan
from grpo_tui.plan.profile import ProfileError
from grpo_tui.terminal import prefer_quick_escape


@app.command(DEFAULT_COMMAND)
def tui(
    profile: Annotated[
        Path | None, typer.Argument(help=f"Profile TOML (default: {DEFAULT_PROFILE}).")
    ] = None,
    mode: ModeOption = None,
    inference_url: InferenceUrlOption = None,
) -> None:
    """Open the dashboard on a profile (the default command); headless when stdout is not a
    terminal (a pipe, a file, a batch job), as ``grpo-tui run``."""
    path = default_profile(profile)
    try:
        loaded, plan = load_plan(path, mode, inference_url=inference_url)
    except ProfileError as error:
        raise fail(error) from None
    preflight_or_exit(plan)
    if not sys.stdout.isatty():
        err_console().print("stdout is not a terminal: running headless (as `grpo-tui run`)")
        from grpo_tui.headless import run_headless

        raise typer.Exit(run_headless(plan))
    prefer_quick_escape()
    from grpo_tui.launch import run_app

    raise typer.Exit(run_app(loaded) or 0)


@app.command()
def check(
    profile: Annotated[Path, typer.Argument(help="Profile TOML to validate.")],
    mode: ModeOption = None,
    inference_url: InferenceUrlOption = None,
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
    a port in use, an inference url that does not answer or lacks what the run needs."""
    try:
        loaded, plan = load_plan(profile, mode, inference_url=inference_url)
    except ProfileError as error:
        raise fail(error) from None
    if not profile_only:
        preflight_or_exit(plan)
    print_plan(Console(highlight=False, soft_wrap=True), loaded, plan)


@app.command()
def run(
    profile: Annotated[Path, typer.Argument(help="Profile TOML to run.")],
    mode: ModeOption = None,
    inference_url: InferenceUrlOption = None,
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
        err_console().print(f"[bold red]error[/] --run-dir {escape(str(run_dir))}: already exists")
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        _, plan = load_plan(
            profile,
            mode,
            inference_url=inference_url,
            run_dir=run_dir and run_dir.resolve(),
            in_job=True,
        )
    except ProfileError as error:
        raise fail(error) from None
    preflight_or_exit(plan)
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
        loaded, plan = load_plan(profile, mode)
        if not plan.roles.cluster.slurm:
            raise ProfileError(
                [loaded.problem(("cluster", "engine"), 'sbatch needs engine = "slurm"')]
            )
    except ProfileError as error:
        raise fail(error) from None
    from grpo_tui.plan.sbatch import batch_script, submit

    script = batch_script(plan, profile, mode=mode, cwd=Path.cwd())
    try:
        path, job = submit(plan, script, ctx.args)
    except (OSError, RuntimeError) as error:
        err_console().print(f"[bold red]error[/] sbatch: {escape(str(error))}")
        raise typer.Exit(1) from None
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"submitted job {job}: {path}", markup=False)
    console.print(f"run dir   {plan.run_dir} (once the job starts)", markup=False)
    console.print(f"attach    grpo-tui attach {plan.run_dir}", markup=False)
