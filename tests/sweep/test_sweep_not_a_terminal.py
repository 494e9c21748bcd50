"""``grpo-tui sweep`` with stdout not a terminal runs headless by itself, as ``run`` does,
and exits when its cells are done (issue 27, case 6: it drew the dashboard into the pipe and
never exited)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sweep_cheap import REPO, SCALES, write_profile


def test_sweep_with_stdout_not_a_terminal_runs_headless_and_exits(tmp_path: Path) -> None:
    profile = write_profile(tmp_path)
    scales = ",".join(f'"{s}"' for s in SCALES)
    argv = ["sweep", str(profile), "--dir", str(tmp_path / "s")]
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tui", *argv, "--set", f"process.work.env.SCALE={scales}"],
        capture_output=True,  # stdout is a pipe, not a terminal
        text=True,
        timeout=120,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sweep finished (exit 0)" in done.stdout
    assert "\x1b[?1049h" not in done.stdout  # no dashboard (alternate screen) was drawn
