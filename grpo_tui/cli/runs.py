"""The commands on a run directory: ``attach`` to a cluster run, ``view`` a finished run,
print its recorded groups (``samples``), ``edit`` a running run's hyperparameters."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from grpo_tui.cli.group import EXIT_BAD_INPUT, ThresholdOption, app, err_console, require_path
from grpo_tui.terminal import prefer_quick_escape

if TYPE_CHECKING:
    from grpo_trainer.records.query import GroupFilter
    from grpo_trainer.records.rollout_reader import RolloutIndex


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
        err_console().print(f"[bold red]error[/] {escape(str(run_dir))}: {why}")
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
            err_console().print(f"[bold red]error[/] {escape(str(error))}")
            raise typer.Exit(1) from None
        for name, state in states.items():
            print(f"{name:<12} {state}")
        return
    prefer_quick_escape()
    from grpo_tui.launch import run_attach

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

    require_path(run_dir)
    if SweepDir.is_sweep(run_dir):
        prefer_quick_escape()
        from grpo_tui.sweep_app import run_sweep_app

        raise typer.Exit(run_sweep_app(SweepDir(run_dir), runner=None, threshold=threshold))
    if not (run_dir / "events.jsonl").is_file() and not (run_dir / "profile.toml").is_file():
        err_console().print(f"[bold red]error[/] {escape(str(run_dir))}: not a run directory")
        raise typer.Exit(EXIT_BAD_INPUT)
    prefer_quick_escape()
    from grpo_tui.launch import run_view

    raise typer.Exit(run_view(run_dir) or 0)


@app.command()
def samples(
    run_dir: Annotated[Path, typer.Argument(help="A run directory, e.g. runs/quickstart-...")],
    step: Annotated[
        int | None,
        typer.Option(
            "--step", help="The groups of this step (default: the last one with trained groups)."
        ),
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

    require_path(run_dir)
    if color_by not in MEASURES:
        err_console().print(f"[bold red]error[/] --color-by: one of {', '.join(MEASURES)}")
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        flt = parse_filter(where)
    except ValueError as error:
        err_console().print(f"[bold red]error[/] --where {escape(str(error))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    index = RolloutIndex(run_dir)
    index.poll()
    if not len(index):
        err_console().print(
            f"[bold red]error[/] {escape(str(run_dir))}: no recorded groups (rollouts/)"
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    rows = select(index, flt.with_step(step if step is not None else default_step(index, flt)))
    if not len(rows):
        err_console().print(
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


def default_step(index: RolloutIndex, flt: GroupFilter) -> int:
    """The last step with a trained group among those ``flt`` passes, else the last step
    (a finished run's last step holds only the groups dropped after the trainer stopped)."""
    from grpo_trainer.records.query import select
    from grpo_trainer.records.rollouts import KINDS

    rows = select(index, flt)
    steps = index.rows["step"][rows]
    trained = index.rows["kind"][rows] == KINDS.index("trained")
    chosen = steps[trained] if trained.any() else steps
    return int(chosen.max(initial=-1))


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
    from grpo_tui.attach import control_socket

    require_path(run_dir)
    console = err_console()
    try:
        values = parse_assignments(assignments)
    except ValueError as error:
        console.print(f"[bold red]error[/] {escape(str(error))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    socket = control_socket(run_dir)
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
