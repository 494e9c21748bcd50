"""The command line under faults a new user meets (issue 27, cases 1, 2, 6 and 7).

- every environment failed for good: the run ends within 5 s, naming its error;
- stdout closed under a running run (``| head -3``; a ``tee`` killed by the same Ctrl-C):
  the run goes on to its end, no traceback, ``events.jsonl`` whole, the exit code follows
  the outcome (0 finished, 128 + signal after a signal);
- ``grpo-tui sweep`` with stdout not a terminal runs headless and exits (tests/sweep/);
- a mistyped command is named, with the nearest one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w
from free_ports import free_port
from test_headless_run import REPO, child, events, only_run_dir, write_profile


def start_run(profile: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_tui", "run", str(profile)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )


def read_until(proc: subprocess.Popen[str], needle: str, limit: int = 200) -> list[str]:
    """Console lines up to the first holding ``needle`` (bounded: at most ``limit`` lines)."""
    assert proc.stdout is not None
    lines = []
    for _ in range(limit):
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"never printed {needle!r}: {lines[-5:]}")


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.stderr is not None
    return code, proc.stderr.read()


def assert_whole_journal(run_dir: Path, ending: str) -> None:
    records = events(run_dir)  # every line parses: none was cut short
    closed = [r for r in records if "stdout closed" in r.get("message", "")]
    assert closed, "the closed output is recorded"
    assert records[-1]["type"] == "Notice"
    assert records[-1]["message"] == f"run ended: {ending}"


def test_a_pipe_that_closes_early_does_not_abort_the_run(tmp_path: Path) -> None:
    """``grpo-tui run p.toml | head -3``: head reads three lines and exits."""
    profile = write_profile(
        tmp_path,
        f"""
        [process.worker]
        command = {child("worker", "--life", "1.5", "--metrics", "3")}
        readiness = {{ kind = "log_line", pattern = "worker ready", period = 0.1 }}
        """,
    )
    proc = start_run(profile)
    assert proc.stdout is not None
    head = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()
    code, stderr = finish(proc)
    assert len(head) == 3 and head[0].startswith("grpo-tui run")
    assert code == 0, stderr
    assert "Traceback" not in stderr
    assert_whole_journal(only_run_dir(tmp_path), "worker completed successfully")


def test_ctrl_c_with_the_pipe_gone_shuts_down_in_order_and_exits_130(tmp_path: Path) -> None:
    """``grpo-tui run p.toml | tee log`` and Ctrl-C: tee dies first, then the run stops."""
    pids = tmp_path / "pids"
    pids.mkdir()
    profile = write_profile(
        tmp_path,
        f"""
        [process.worker]
        command = {child("worker", "--pid-dir", str(pids))}
        readiness = {{ kind = "log_line", pattern = "worker ready", period = 0.1 }}
        """,
    )
    proc = start_run(profile)
    read_until(proc, "-> ready")
    assert proc.stdout is not None
    proc.stdout.close()
    proc.send_signal(signal.SIGINT)
    code, stderr = finish(proc)
    assert code == 128 + signal.SIGINT, stderr
    assert "Traceback" not in stderr
    run_dir = only_run_dir(tmp_path)
    assert_whole_journal(run_dir, "shutdown: received SIGINT")
    changes = [(r["process"], r["new"]) for r in events(run_dir) if r["type"] == "StateChanged"]
    assert changes[-1] == ("worker", "stopped")


@pytest.mark.parametrize(("typed", "meant"), [("chek", "check"), ("swep", "sweep")])
def test_a_mistyped_command_is_named_with_the_nearest_one(typed: str, meant: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tui", typed, "profiles/quickstart.toml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert f"No such command '{typed}'" in done.stderr
    assert f"Did you mean '{meant}'?" in done.stderr


def test_a_profile_path_still_opens_the_default_command() -> None:
    """A word naming a file (or ending in .toml) is a profile, not a command."""
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "no-such-profile.toml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert "no-such-profile.toml: file not found" in done.stderr


BROKEN_TASK = '''
from pathlib import Path

from grpo_trainer.envs.toy import RepeatDigit


class Broken(RepeatDigit):
    """Imports and is a Task (the preflight passes it), fails when it starts."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        Path("/nonexistent/grpo-tui-prompts.jsonl").read_text()
'''


@pytest.mark.timeout(240)
def test_every_environment_failing_for_good_ends_the_run_with_its_error(tmp_path: Path) -> None:
    """Issue 27 case 1. The only environment fails at start, past the preflight: once it
    gave up, the run stops in order within 5 s with exit 1, and the console and
    events.jsonl name it with its real error (on main it waited forever)."""
    (tmp_path / "broken_task.py").write_text(BROKEN_TASK)
    profile = tomllib.loads((REPO / "profiles" / "quickstart.toml").read_text())
    profile["run"]["output_dir"] = str(tmp_path / "runs")
    profile["api"]["port"], profile["inference"]["port"] = free_port(), free_port()
    profile["env"][0]["task"] = "broken_task:Broken"
    quick = {"policy": "on_failure", "backoff_base": 0.2, "max_restarts": 1}
    profile["process"] = {"env": {"restart": quick}}
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(profile))
    python_path = os.pathsep.join([str(REPO), str(tmp_path)])
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": python_path},
    )
    exited = time.time()
    assert done.returncode == 1, done.stdout + done.stderr
    error = "No such file or directory: '/nonexistent/grpo-tui-prompts.jsonl'"
    assert "run failed: trainer cannot go on without env: env failed" in done.stdout
    assert "trainer cannot go on without env" in done.stdout and error in done.stdout
    assert "Traceback" not in done.stderr
    run_dir = only_run_dir(tmp_path)
    records = events(run_dir)
    (gave_up,) = [r for r in records if r["type"] == "StateChanged" and r["new"] == "failed"]
    assert gave_up["process"] == "env"
    assert gave_up["reason"] == "exited with code 2; gave up after 1 restarts"
    (lost,) = [r for r in records if r["type"] == "NeedLost"]
    assert lost["process"] == "trainer" and lost["action"] == "stop"
    assert error in lost["last_lines"]["env"][-1]
    assert exited - gave_up["t"] < 5.0, f"ended {exited - gave_up['t']:.1f} s after the failure"
    changes = [(r["process"], r["new"]) for r in records if r["type"] == "StateChanged"]
    assert ("trainer", "stopped") in changes  # stopped in order, not killed with the rest
