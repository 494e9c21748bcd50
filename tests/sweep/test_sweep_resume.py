"""A killed sweep leaves no process behind; started again, it runs only the unfinished cells."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path

import psutil
from sweep_cheap import REPO, journal, run_sweep, sweep_args, wait_for, write_profile

from grpo_tui.sweep.grid import expand, parse_set
from grpo_tui.sweep.store import SweepDir


def starts(sweep_dir: Path) -> Counter[str]:
    return Counter(e["cell"] for e in journal(sweep_dir) if e["event"] == "cell_start")


def ends(sweep_dir: Path) -> set[str]:
    return {e["cell"] for e in journal(sweep_dir) if e["event"] == "cell_end"}


def test_sigkill_of_the_sweep_ends_its_cells_and_a_restart_runs_only_the_rest(
    tmp_path: Path,
) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    profile = write_profile(tmp_path, {"GATE_DIR": str(gates)})
    sweep_dir = tmp_path / "sweep"
    sweep = subprocess.Popen(
        sweep_args(profile, sweep_dir, "--parallel", "2"),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        (gates / "0.3").touch()
        (gates / "0.9").touch()
        first, second, third = "0-SCALE0.3", "1-SCALE0.9", "2-SCALE0.6"
        wait_for(lambda: ends(sweep_dir) == {first, second}, 60, "the two gated cells to end")
        running = sweep_dir / third / "events.jsonl"
        wait_for(running.is_file, 30, "the third cell's supervisor to start")
        cells = psutil.Process(sweep.pid).children(recursive=True)
        assert cells, "the running cell's processes"
        sweep.send_signal(signal.SIGKILL)
        sweep.wait(timeout=10)
        _, alive = psutil.wait_procs(cells, timeout=30)
        assert not alive, f"left running after the sweep was killed: {alive}"
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    states = SweepDir(sweep_dir).statuses()
    assert {k: s.state for k, s in states.items()} == {
        first: "done",
        second: "done",
        third: "interrupted",
    }

    (gates / "0.6").touch()
    again = run_sweep(profile, sweep_dir, "--parallel", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 cells, 2 done before, 1 to run" in again.stdout
    assert starts(sweep_dir) == {first: 1, second: 1, third: 2}
    assert {s.state for s in SweepDir(sweep_dir).statuses().values()} == {"done"}
    assert (sweep_dir / "attempts" / f"{third}-1").is_dir()  # the killed attempt, kept aside
    assert (sweep_dir / third / "metrics.jsonl").is_file()
    done = run_sweep(profile, sweep_dir, "--parallel", "2")  # all done: nothing runs again
    assert done.returncode == 0 and "3 cells, 3 done before, 0 to run" in done.stdout
    assert starts(sweep_dir) == {first: 1, second: 1, third: 2}


def test_a_restart_with_other_cells_is_refused(tmp_path: Path) -> None:
    profile = write_profile(tmp_path)
    sweep_dir = tmp_path / "sweep"
    axes = [parse_set('process.work.env.SCALE="0.3","0.9","0.6"')]
    SweepDir(sweep_dir).create_or_match(profile, axes, expand(axes, zipped=False), zipped=False)
    other = subprocess.run(
        [*sweep_args(profile, sweep_dir)[:-2], "--set", "process.work.env.STEPS=\"3\"",
         "--dir", str(sweep_dir)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert other.returncode == 2
    assert "holds another sweep" in other.stderr
    assert not SweepDir(sweep_dir).journal()  # nothing ran
