"""A sweep on one kept inference server (``--keep-server``, issue 37): ``grpo-tui serve``
started once, the quickstart's cells one after another attached to it (each reset to the
base at its start), the server stopped in order at the end. And what one server cannot do
is refused before anything starts: cells at once, cells that vary the server."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from free_ports import free_port

from grpo_tui.sweep.store import SweepDir

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "profiles" / "quickstart.toml"


def profile(tmp_path: Path) -> Path:
    data = tomllib.loads(QUICKSTART.read_text())
    data["run"]["output_dir"] = str(tmp_path / "runs")
    data["trainer"].update(training_steps=2, checkpoint_interval=1000)
    data["api"]["port"], data["inference"]["port"] = free_port(), free_port()
    path = tmp_path / "quickstart.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def sweep(path: Path, sweep_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "grpo_tui", "sweep", str(path), "--headless"]
    return subprocess.run(
        [*command, "--dir", str(sweep_dir), *options],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_cells_run_one_after_another_on_one_kept_server(tmp_path: Path) -> None:
    path = profile(tmp_path)
    port = tomllib.loads(path.read_text())["inference"]["port"]
    url = f"http://127.0.0.1:{port}"
    sweep_dir = tmp_path / "sweep"
    done = sweep(path, sweep_dir, "--set", "trainer.beta=0,0.04", "--keep-server")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"kept server ready at {url}" in done.stdout
    assert "kept server stopped (exit 0)" in done.stdout
    serving = (sweep_dir / "server" / "console.log").read_text()
    assert serving.count("serving http://") == 1, serving
    statuses = list(SweepDir(sweep_dir).statuses().values())
    assert [s.state for s in statuses] == ["done", "done"]
    first, second = sorted(statuses, key=lambda s: s.started_at or 0)
    assert first.ended_at and second.started_at and first.ended_at <= second.started_at
    for status in statuses:
        log = (sweep_dir / status.cell.id / "logs" / "inference.log").read_text()
        assert f"grpo-attach: attached to {url} (lease taken; reset: " in log, log
        assert f"grpo-attach: detached from {url}, serving the base" in log, log


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (("--parallel", "2"), "one kept inference server takes one run at a time"),
        (("--set", "inference.dtype=float32,bfloat16"), "--set inference.dtype: one kept server"),
        (("--set", "run.tiny.hidden_size=64,128"), "--set run.tiny.hidden_size: one kept server"),
    ],
)
def test_what_one_server_cannot_run_is_refused_before_anything_starts(
    tmp_path: Path, options: tuple[str, ...], said: str
) -> None:
    path = profile(tmp_path)
    axis = () if "--set" in options else ("--set", "trainer.beta=0,0.04")
    done = sweep(path, tmp_path / "sweep", "--keep-server", *axis, *options)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stdout + done.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "sweep" / "server").exists()
