"""A sweep of the quickstart on CPU (2 cells of 2 steps, at once): the real stack. The grid's
expansion (products, zips) is tested without processes in ``test_sweep_grid.py``."""

from __future__ import annotations

import itertools
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from free_ports import free_port

from grpo_tui.sweep.results import SweepResults
from grpo_tui.sweep.store import SweepDir

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "profiles" / "quickstart.toml"


@pytest.mark.e2e
def test_quickstart_sweep_runs_every_cell_with_its_overrides_and_reports(
    tmp_path: Path,
) -> None:
    data = tomllib.loads(QUICKSTART.read_text())
    data["run"]["output_dir"] = str(tmp_path / "runs")
    data["trainer"].update(training_steps=2, checkpoint_interval=1000)
    # free base ports, not the quickstart's 8000/9001: tests beside this one (xdist) check
    # profiles on those; the sweep moves each cell at once to ports free from these up
    data["api"]["port"], data["inference"]["port"] = free_port(), free_port()
    profile = tmp_path / "quickstart.toml"
    profile.write_text(tomli_w.dumps(data))
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "grpo_tui", "sweep", str(profile), "--headless"),
            *("--set", "trainer.lr=1e-3", "--set", "trainer.beta=0,0.04"),
            *("--parallel", "2", "--dir", str(sweep_dir)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sweep = SweepDir(sweep_dir)
    statuses = sweep.statuses()
    assert len(statuses) == 2 and {s.state for s in statuses.values()} == {"done"}
    for status in statuses.values():  # each run directory ran its own overrides
        resolved = tomllib.loads((sweep_dir / status.cell.id / "profile.toml").read_text())
        assert resolved["trainer"]["lr"] == status.cell.overrides["trainer.lr"]
        assert resolved["trainer"]["beta"] == status.cell.overrides["trainer.beta"]
    for a, b in itertools.combinations(statuses.values(), 2):  # cells at once: no shared port
        assert a.started_at and a.ended_at and b.started_at and b.ended_at
        if a.started_at < b.ended_at and b.started_at < a.ended_at:
            assert not set(a.ports.values()) & set(b.ports.values()), (a.ports, b.ports)
    results = SweepResults(sweep)
    results.poll(0.8)
    rows = results.summaries(0.0)
    assert [r.step for r in rows] == [2] * 2
    assert all(r.reward is not None for r in rows)
    assert [r.kl is not None for r in rows] == [False, True]  # KL only with beta > 0
    report = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "report", str(sweep_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert report.returncode == 0, report.stderr
    html = (sweep_dir / "report.html").read_text()
    assert all(f">{row.id}</td>" in html for row in rows)
    assert html.count("<svg") >= 3  # reward, KL, loss at least
