"""``grpo-tui serve``: keep a profile's inference server running for runs to attach to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from grpo_tui.cli.group import EXIT_BAD_INPUT, ModeOption, app, err_console, fail
from grpo_tui.cli.loading import preflight_or_exit
from grpo_tui.plan.profile import ProfileError, load_profile
from grpo_tui.terminal import prefer_quick_escape


@app.command()
def serve(
    profile: Annotated[Path, typer.Argument(help="Profile TOML whose inference server to keep.")],
    mode: ModeOption = None,
    json_lines: Annotated[
        bool, typer.Option("--json", help="Headless: every event as a JSON line on stdout.")
    ] = False,
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run-dir", help="Run directory to create (default: output_dir/name-serve-time)."
        ),
    ] = None,
) -> None:
    """Keep the profile's inference server running alone, for runs to attach to with
    `grpo-tui run PROFILE --inference-url URL` (one at a time): the dashboard, or headless
    when stdout is not a terminal. Prints the URL; Ctrl-C stops it in order (exit 0)."""
    from grpo_tui.plan.serving import attach_url, serve_plan

    if run_dir is not None and run_dir.exists():
        err_console().print(f"[bold red]error[/] --run-dir {escape(str(run_dir))}: already exists")
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        plan = serve_plan(load_profile(profile, mode=mode), run_dir and run_dir.resolve())
    except ProfileError as error:
        raise fail(error) from None
    preflight_or_exit(plan)
    url = attach_url(plan)
    told = (
        f"serving {url}: attach runs with `grpo-tui run {profile} --inference-url {url}` "
        "(one at a time); Ctrl-C stops it"
    )
    if json_lines or not sys.stdout.isatty():
        from grpo_tui.headless import run_headless

        code = run_headless(
            plan, json_lines=json_lines, until_stopped=True, when_ready=("inference", told)
        )
        raise typer.Exit(code)
    err_console().print(told, markup=False)
    prefer_quick_escape()
    from grpo_tui.launch import run_plan_app

    raise typer.Exit(run_plan_app(plan, notice=told))
