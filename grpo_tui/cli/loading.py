"""A profile made into a checked plan for a command: loaded, planned, given the Slurm job's
nodes when it runs inside one, and checked against what this machine would refuse."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_tui.cli.group import EXIT_BAD_INPUT, err_console, fail
from grpo_tui.plan.cluster import Allocation
from grpo_tui.plan.profile import Profile, ProfileError, load_profile
from grpo_tui.plan.roles import Plan, build_plan

DEFAULT_PROFILE = Path("profiles/quickstart.toml")


def load_plan(
    profile: Path,
    mode: str | None,
    *,
    inference_url: str | None = None,
    run_dir: Path | None = None,
    in_job: bool = False,
) -> tuple[Profile, Plan]:
    """Load and plan a profile (``inference_url``: attach to that server). ``in_job``: a
    cluster profile gets the current Slurm job's nodes, and the command fails (exit 2)
    outside a job or on a smaller one."""
    loaded = load_profile(profile, mode=mode, inference_url=inference_url)
    allocation = None
    if in_job and loaded.table("cluster") and loaded.data["cluster"].get("engine") == "slurm":
        allocation = current_allocation(loaded)
    return loaded, build_plan(loaded, run_dir=run_dir, allocation=allocation)


def preflight_or_exit(plan: Plan) -> None:
    """What this machine would refuse at start (a task that does not load, an executable not
    found, a port in use): exit 2 naming each key, before anything starts."""
    from grpo_tui.plan.preflight import preflight

    problems = preflight(plan)
    if problems:
        raise fail(ProfileError(problems))


def current_allocation(profile: Profile) -> Allocation:
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


def default_profile(profile: Path | None) -> Path:
    if profile is not None:
        return profile
    if DEFAULT_PROFILE.is_file():
        return DEFAULT_PROFILE
    err_console().print(f"[bold red]error[/] no profile given and {DEFAULT_PROFILE} is not here")
    raise typer.Exit(EXIT_BAD_INPUT)
