"""``check`` and ``run`` refuse what this machine would refuse at start (issue 27, cases 1,
4 and 5): a task that does not load, an executable not found, a port in use. Exit 2, the
profile key and line named, nothing started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psutil
import pytest
import tomli_w
from test_headless_run import child, grpo_tui, write_profile

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "profiles" / "quickstart.toml"


def quickstart_with(tmp_path: Path, **env: str) -> Path:
    """The quickstart with ``env`` keys in its ``[[env]]`` table, run into ``tmp_path``."""
    profile = tomllib.loads(QUICKSTART.read_text())
    profile["run"]["output_dir"] = str(tmp_path / "runs")
    profile["env"][0].update(env)
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(profile))
    return path


def problem_line(output: str, key: str) -> str:
    lines = [line for line in output.splitlines() if f": {key}: " in line]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.parametrize(
    ("task", "says"),
    [
        ("no_such_mod:Foo", "cannot be loaded: ModuleNotFoundError: No module named 'no_such_mod'"),
        ("json:JSONDecoder", "is not a grpo_trainer.envs.task.Task subclass"),
        ("json:NoSuchClass", "cannot be loaded: AttributeError"),
    ],
)
def test_a_task_that_does_not_load_is_named_with_its_error(
    tmp_path: Path, task: str, says: str
) -> None:
    commands = ("check", "run") if task.startswith("no_such_mod") else ("check",)
    for command in commands:
        done = grpo_tui(command, str(quickstart_with(tmp_path, task=task)))
        assert done.returncode == 2, done.stdout + done.stderr
        line = problem_line(done.stderr, "env[0].task")
        assert "p.toml:" in line and repr(task) in line and says in line
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists(), "nothing was started"


@pytest.mark.parametrize("executable", ["grpo-tui-no-such-command-xyz", "/nonexistent/grpo-tui-x"])
def test_an_executable_not_found_is_named_by_its_key(tmp_path: Path, executable: str) -> None:
    """Was (tests/cli/test_headless_run.py) a failed state at run time, after retries."""
    profile = write_profile(
        tmp_path,
        f"""
        [process.worker]
        command = ["{executable}", "--flag"]
        """,
    )
    for command in ("check", "run"):
        done = grpo_tui(command, str(profile))
        assert done.returncode == 2, done.stdout + done.stderr
        line = problem_line(done.stderr, "process.worker.command")
        assert f"executable {executable!r} not found" in line
        assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "runs").exists()


def test_vllm_not_on_path_is_named_by_inference_vllm_executable(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "check", "profiles/quickstart-gpu.toml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PATH": str(tmp_path)},  # wherever vLLM is installed, not here
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "executable 'vllm' not found" in problem_line(done.stderr, "inference.vllm_executable")


def test_a_port_in_use_is_named_with_its_holder(tmp_path: Path) -> None:
    holder = psutil.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], stdout=-3, stderr=-3
    )
    try:
        port = None
        deadline = time.monotonic() + 20
        while port is None:
            assert time.monotonic() < deadline, "holder never listened"
            listening = [c for c in holder.net_connections() if c.status == psutil.CONN_LISTEN]
            port = listening[0].laddr.port if listening else None
            time.sleep(0.05)
        profile = write_profile(
            tmp_path,
            f"""
            [process.worker]
            command = {child("server", "--ready-after", "0.1")}
            port = {port}
            """,
        )
        for command in ("check", "run"):
            done = grpo_tui(command, str(profile))
            assert done.returncode == 2, done.stdout + done.stderr
            line = problem_line(done.stderr, "process.worker.port")
            assert f"port {port} is in use by pid {holder.pid}" in line and "http.server" in line
        assert not (tmp_path / "runs").exists()
    finally:
        holder.kill()
        holder.wait()


def test_profile_only_skips_what_this_machine_would_refuse(tmp_path: Path) -> None:
    done = grpo_tui("check", str(quickstart_with(tmp_path, task="no_such_mod:Foo")),
                    "--profile-only")  # fmt: skip
    assert done.returncode == 0, done.stderr
