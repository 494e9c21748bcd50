"""``check`` and ``run`` refuse what this machine would refuse at start (issue 27, cases 1,
4 and 5): a task that does not load, an executable not found, a port in use. Exit 2, the
profile key and line named, nothing started. In process (typer's runner): the task's
import is the one subprocess."""

from __future__ import annotations

import sys
import time
import tomllib
from pathlib import Path

import psutil
import pytest
import tomli_w
from test_headless_run import child, write_profile
from typer.testing import CliRunner

from grpo_tui.cli import app

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


def refused(*args: str, key: str, env: dict[str, str] | None = None) -> str:
    """The one problem line naming ``key`` of a command that must exit 2."""
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if f": {key}: " in line]
    assert len(lines) == 1, result.output
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
        line = refused(command, str(quickstart_with(tmp_path, task=task)), key="env[0].task")
        assert "p.toml:" in line and repr(task) in line and says in line
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
        line = refused(command, str(profile), key="process.worker.command")
        assert f"executable {executable!r} not found" in line
    assert not (tmp_path / "runs").exists()


def test_vllm_not_on_path_is_named_by_inference_vllm_executable(tmp_path: Path) -> None:
    profile = str(REPO / "profiles" / "quickstart-gpu.toml")
    here = {"PATH": str(tmp_path)}  # wherever vLLM is installed, not here
    line = refused("check", profile, key="inference.vllm_executable", env=here)
    assert "executable 'vllm' not found" in line


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
            line = refused(command, str(profile), key="process.worker.port")
            assert f"port {port} is in use by pid {holder.pid}" in line and "http.server" in line
        assert not (tmp_path / "runs").exists()
    finally:
        holder.kill()
        holder.wait()


def test_profile_only_skips_what_this_machine_would_refuse(tmp_path: Path) -> None:
    profile = str(quickstart_with(tmp_path, task="no_such_mod:Foo"))
    result = CliRunner().invoke(app, ["check", profile, "--profile-only"])
    assert result.exit_code == 0, result.output
