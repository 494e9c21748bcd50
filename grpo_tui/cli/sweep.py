"""``grpo-tui sweep``: a grid of profile variants, N cells at a time (or one Slurm job each),
resumable; and ``report``, a sweep's or a run's self-contained HTML report."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from grpo_tui.cli.group import (
    EXIT_BAD_INPUT,
    InferenceUrlOption,
    ThresholdOption,
    app,
    err_console,
    fail,
    require_path,
)
from grpo_tui.output import SafeStream
from grpo_tui.plan.profile import Profile, ProfileError, load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.terminal import prefer_quick_escape

SetOption = Annotated[
    list[str],
    typer.Option(
        "--set",
        help="KEY=V1,V2,... a profile key and the values to sweep (repeat for more keys).",
    ),
]


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
    keep_server: Annotated[
        bool,
        typer.Option(
            "--keep-server",
            help="Start the profile's inference server once (`grpo-tui serve`) and run the "
            "cells one after another attached to it, instead of one server per cell.",
        ),
    ] = False,
    inference_url: InferenceUrlOption = None,
) -> None:
    """Run a grid of profile variants, N at a time; started again, it runs only unfinished cells.

    With [cluster] engine = "slurm" each cell is one batch job; options after `--` go to
    sbatch (`-- --time=30 --partition=gpu`). With --keep-server (or --inference-url) the
    cells share one inference server, one cell at a time.
    """
    import os

    from grpo_tui.sweep.grid import check_cells, expand, parse_set
    from grpo_tui.sweep.kept import KeptServer
    from grpo_tui.sweep.resources import gpu_pool, gpus_needed, parallel_limit
    from grpo_tui.sweep.runner import SweepRunner, run_sweep
    from grpo_tui.sweep.slurm_jobs import SlurmJobs
    from grpo_tui.sweep.store import SweepDir, SweepDirError

    try:
        loaded = load_profile(profile)
        axes = [parse_set(option) for option in sets]
        cells = expand(axes, zipped=zipped)
        url = one_server(loaded, [axis.key for axis in axes], keep_server, inference_url)
        check_cells(with_url(loaded, url), cells)
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
        raise fail(error) from None
    except ValueError as error:
        err_console().print(f"[bold red]error[/] {escape(str(error))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    pool = [] if on_slurm else gpu_pool(gpus, os.environ)  # Slurm gives each job its GPUs
    per_cell = 0 if on_slurm else gpus_needed(loaded.data)
    if url is not None and (parallel > 1 or on_slurm):
        err_console().print(
            "[bold red]error[/] one kept inference server takes one run at a time: no "
            "--parallel above 1, no Slurm jobs"
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    if per_cell and not pool and parallel > 1:
        err_console().print(
            f"[bold red]error[/] the profile uses {per_cell} GPU(s) per cell: give --gpus "
            "(or CUDA_VISIBLE_DEVICES) to share GPUs among parallel cells"
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    limit = parallel_limit(parallel, per_cell if pool else 0, pool)
    if limit < 1:
        err_console().print(
            f"[bold red]error[/] one cell needs {per_cell} GPUs; --gpus gives {len(pool)}"
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    where = directory or Path(loaded.run.output_dir) / f"{loaded.run.name}-sweep"
    store = SweepDir(where)
    try:
        record = store.create_or_match(profile, axes, cells, zipped=zipped)
    except SweepDirError as error:
        err_console().print(f"[bold red]error[/] {escape(str(error))}")
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
        inference_url=url,
        server=KeptServer(profile, url, store.path / "server", log)
        if keep_server and url
        else None,
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


ONE_SERVER_KEYS = ("inference", "run.model", "run.tiny")
"""Keys a sweep cannot vary on one server: its flags and the model it serves."""


def one_server(profile: Profile, keys: list[str], keep: bool, url: str | None) -> str | None:
    """The URL every cell attaches to (``--keep-server``: the profile's own server, which
    the sweep starts; ``--inference-url``: one kept already), or None; raises
    ``ProfileError`` for a sweep one server cannot run."""
    from grpo_tui.plan.serving import attach_url, serve_plan

    if not keep and url is None:
        return None
    if keep and url is not None:
        raise ValueError("--keep-server starts a server; --inference-url names one: not both")
    varied = [k for k in keys if any(k == p or k.startswith(f"{p}.") for p in ONE_SERVER_KEYS)]
    if varied:
        raise ValueError(
            f"--set {varied[0]}: one kept server serves one model with one set of flags; "
            "sweep it with a server per cell (no --keep-server / --inference-url)"
        )
    return attach_url(serve_plan(profile)) if keep else url


def with_url(profile: Profile, url: str | None) -> Profile:
    """``profile`` attached to ``url`` (as each cell runs), for the cells' checks."""
    if url is None:
        return profile
    inference = profile.data.get("inference")
    data = {
        **profile.data,
        "inference": {**(inference if isinstance(inference, dict) else {}), "url": url},
    }
    return replace(profile, data=data)


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

    require_path(target)
    try:
        path = write_report(target, output or target / "report.html", threshold=threshold)
    except ValueError as error:
        err_console().print(f"[bold red]error[/] {escape(str(error))}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    Console(highlight=False).print(f"report: {path}", markup=False)
