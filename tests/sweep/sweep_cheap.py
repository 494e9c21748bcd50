"""A cheap sweep for the tests: real ``grpo-tui run`` cells of one small real process each."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("sweep_child.py")
SCALES = ("0.3", "0.9", "0.6")


def write_profile(tmp_path: Path, env: dict[str, str] | None = None) -> Path:
    path = tmp_path / "cheap.toml"
    extra = "".join(f'{key} = "{value}"\n' for key, value in (env or {}).items())
    path.write_text(
        f'[run]\nname = "cheap"\noutput_dir = "{tmp_path / "runs"}"\nexit_with = "work"\n\n'
        f"[process.work]\ncommand = {json.dumps([sys.executable, str(CHILD)])}\n"
        + (f"\n[process.work.env]\n{extra}" if extra else "")
    )
    return path


def sweep_args(profile: Path, sweep_dir: Path, *extra: str) -> list[str]:
    scales = ",".join(f'"{s}"' for s in SCALES)
    return [
        sys.executable, "-m", "grpo_tui", "sweep", str(profile), "--headless",
        "--set", f"process.work.env.SCALE={scales}", "--dir", str(sweep_dir), *extra,
    ]  # fmt: skip


def run_sweep(profile: Path, sweep_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sweep_args(profile, sweep_dir, *extra),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def journal(sweep_dir: Path) -> list[dict[str, Any]]:
    path = sweep_dir / "journal.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(what: Callable[[], bool], timeout: float, message: str) -> None:
    """Poll a condition (files another process writes) until it holds."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {message}")
        time.sleep(0.05)
