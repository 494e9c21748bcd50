"""``grpo-tui sbatch``: a batch script that runs ``grpo-tui run`` on the allocation's first node.

The script asks Slurm for what the profile's ``[cluster]`` table says (``--nodes``,
``--gpus-per-node``); options given on the command line go to ``sbatch`` itself and win
over the script's. The run directory is chosen here, before submission, so that the
person submitting knows where to ``grpo-tui attach`` (it appears once the job starts).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from grpo_tui.plan.roles import Plan


def script_path(plan: Plan) -> Path:
    """Where the batch script goes: next to the run directory it will create."""
    return plan.run_dir.with_name(plan.run_dir.name + ".sbatch")


def batch_script(plan: Plan, profile: Path, *, mode: str | None, cwd: Path) -> str:
    """The batch script: Slurm's resource lines, then ``grpo-tui run`` in the allocation."""
    cluster = plan.roles.cluster
    out = script_path(plan).with_suffix(".out")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=grpo-{plan.profile.run.name}",
        f"#SBATCH --nodes={cluster.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={out}",
    ]
    if cluster.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={cluster.gpus_per_node}")
    run = [sys.executable, "-m", "grpo_tui", "run", str(profile.resolve())]
    run += ["--run-dir", str(plan.run_dir)]
    if mode is not None:
        run += ["--mode", mode]
    lines += [
        f"# Written by grpo-tui sbatch for {plan.profile.path}; attach with:",
        f"#   grpo-tui attach {plan.run_dir}",
        f"cd {shlex.quote(str(cwd))}",
        f"exec {shlex.join(run)}",
        "",
    ]
    return "\n".join(lines)


def submit(plan: Plan, script: str, options: Sequence[str]) -> tuple[Path, str]:
    """Write the script and ``sbatch`` it; returns (script path, job id).

    Raises ``RuntimeError`` with sbatch's own message when Slurm refuses.
    """
    path = script_path(plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    done = subprocess.run(
        ["sbatch", "--parsable", *options, str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip() or f"sbatch exited with {done.returncode}")
    return path, done.stdout.strip().split(";")[0]
