"""A sweep on a real three-node Slurm cluster (``slurm_cluster``): one batch job per cell.

The cells are the sweep tests' small real process (``tests/sweep/sweep_child.py``, gated by
files) under ``grpo-tui run`` in each cell's own job. One scenario, in order:

- the sweep submits one job per cell and journals each job id; SIGKILL of the sweep
  leaves its jobs to Slurm (they do not depend on it) and the cells read ``detached``;
- a job that ends while no sweep watches is journaled done by the next sweep, not rerun;
  a job still running is watched again, not resubmitted;
- stopping that sweep (SIGTERM) cancels its own job id only: another job of the same name
  stays; the cancelled cell is ``interrupted``;
- the next sweep resubmits only that cell, finishes, and its table and report are drawn
  from the run directories on the shared file system.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_stack import REPO, free_port, wait_until
from slurm_cluster import SlurmCluster, start_cluster, stop_cluster

from grpo_tui.sweep.results import SweepResults
from grpo_tui.sweep.store import SweepDir

CHILD = REPO / "tests" / "sweep" / "sweep_child.py"
A, B, C = "0-SCALE0.3", "1-SCALE0.9", "2-SCALE0.6"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"), nodes=3)
    yield cluster
    stop_cluster(cluster)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory whose cells' control-socket paths fit the Unix limit (108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="grpo-sw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def cluster_profile(root: Path, gates: Path) -> Path:
    path = root / "cheap.toml"
    path.write_text(
        f'[run]\nname = "cheap"\noutput_dir = "{root / "runs"}"\nexit_with = "work"\n\n'
        f"[process.work]\ncommand = {json.dumps([sys.executable, str(CHILD)])}\n\n"
        f'[process.work.env]\nGATE_DIR = "{gates}"\n\n'
        f'[cluster]\nengine = "slurm"\nnodes = 1\ncontrol_port = {free_port()}\n'
    )
    return path


def sweep_command(profile: Path, sweep_dir: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "grpo_tui", "sweep", str(profile), "--headless"),
        *("--set", 'process.work.env.SCALE="0.3","0.9","0.6"', "--parallel", "2"),
        *("--dir", str(sweep_dir), "--", "--time=10"),
    ]


def events(sweep_dir: Path, kind: str) -> list[dict[str, str]]:
    return [e for e in SweepDir(sweep_dir).journal() if e["event"] == kind]


def jobs_of(sweep_dir: Path) -> dict[str, str]:
    """The last job id journaled for each cell."""
    return {e["cell"]: e["job"] for e in events(sweep_dir, "cell_submit")}


def states(sweep_dir: Path) -> dict[str, str]:
    return {cell: s.state for cell, s in SweepDir(sweep_dir).statuses().items()}


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_slurm_sweep_one_job_per_cell_resumes_cancels_its_own_and_reports(
    slurm: SlurmCluster, short_dir: Path
) -> None:
    gates = short_dir / "gates"
    gates.mkdir()
    profile = cluster_profile(short_dir, gates)
    sweep_dir = short_dir / "sweep"
    command = sweep_command(profile, sweep_dir)
    # someone else's job with the very name our cell B's job gets: never cancelled by name
    name = f"grpo-sweep.{sweep_dir.name}.{B}"
    other = slurm.run(
        "sbatch", "--parsable", f"--job-name={name}", "--output=/dev/null", "--wrap", "sleep 300"
    )
    assert other.returncode == 0, other.stderr
    foreign = other.stdout.strip()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        (gates / "0.3").touch()
        first = subprocess.Popen(command, env=slurm.env, cwd=REPO, stdout=subprocess.DEVNULL)
        procs.append(first)

        def b_and_c_running() -> bool:
            assert first.poll() is None
            journaled = SweepDir.is_sweep(sweep_dir) and len(events(sweep_dir, "cell_submit")) == 3
            return journaled and states(sweep_dir) == {A: "done", B: "running", C: "running"}

        wait_until(b_and_c_running, 90, "cell A done, B and C running as jobs")
        jobs = jobs_of(sweep_dir)
        assert len(set(jobs.values())) == 3 and foreign not in jobs.values()
        script = (sweep_dir / f"{A}.sbatch").read_text()  # grpo-tui sbatch's own script
        assert "#SBATCH --nodes=1" in script and f"--run-dir {sweep_dir / A}" in script

        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert slurm.job_alive(jobs[B]) and slurm.job_alive(jobs[C]), "jobs outlive the sweep"
        assert states(sweep_dir) == {A: "done", B: "detached", C: "detached"}
        (gates / "0.6").touch()  # C ends while no sweep watches it
        wait_until(lambda: not slurm.job_alive(jobs[C]), 60, "job C to end")

        log = short_dir / "second.log"
        with log.open("wb") as out:
            second = subprocess.Popen(command, env=slurm.env, cwd=REPO, stdout=out)
        procs.append(second)
        expected = "3 cells, 2 done before, 0 to run, 1 still in Slurm's queue"
        wait_until(lambda: expected in log.read_text(), 60, "the second sweep to watch B")
        assert states(sweep_dir)[C] == "done"
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 130
        assert f"scancel {jobs[B]}" in log.read_text()
        assert not slurm.job_alive(jobs[B])
        assert slurm.job_alive(foreign), "a job of the same name is not the sweep's"
        assert states(sweep_dir) == {A: "done", B: "interrupted", C: "done"}

        (gates / "0.9").touch()
        third = subprocess.run(
            command, env=slurm.env, cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert third.returncode == 0, third.stdout + third.stderr
        assert "3 cells, 2 done before, 1 to run" in third.stdout
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        slurm.run("scancel", foreign)
    submits = Counter(e["cell"] for e in events(sweep_dir, "cell_submit"))
    assert submits == {A: 1, B: 2, C: 1}, "only the cancelled cell was submitted again"
    assert set(states(sweep_dir).values()) == {"done"}
    assert (sweep_dir / "attempts" / f"{B}-1").is_dir()

    results = SweepResults(SweepDir(sweep_dir))
    results.poll(0.8)
    rows = {row.id: row for row in results.summaries(time.time())}
    assert {cell: row.step for cell, row in rows.items()} == {A: 6, B: 6, C: 6}
    assert rows[B].reward is not None and rows[B].reward > rows[A].reward  # type: ignore[operator]
    assert rows[B].job == jobs_of(sweep_dir)[B]
    report = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "report", str(sweep_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert report.returncode == 0, report.stderr
    html = (sweep_dir / "report.html").read_text()
    assert all(f">{cell}</td>" in html for cell in (A, B, C))
