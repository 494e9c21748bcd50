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


def profile_with(tmp_path: Path, table: str, key: str, value: str) -> Path:
    """The quickstart with ``[table] key = value``, run into ``tmp_path``."""
    profile = tomllib.loads(QUICKSTART.read_text())
    profile["run"]["output_dir"] = str(tmp_path / "runs")
    profile[table][key] = value
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(profile))
    return path


@pytest.mark.parametrize(
    ("table", "key", "value", "says"),
    [
        ("run", "model", "/nonexistent/grpo-model", "no such directory"),
        ("run", "model", "./grpo-model-not-here", "no such directory"),
        ("run", "model", "models//qwen", "no such directory"),
        ("trainer", "batches_file", "/nonexistent/batches.jsonl", "no such file"),
    ],
)
def test_a_path_that_does_not_exist_is_refused_before_anything_starts(
    tmp_path: Path, table: str, key: str, value: str, says: str
) -> None:
    """Issue 35's new user: a model path that does not exist passed ``check``, and ``run``
    restarted inference and the trainer 5 times each, then failed after 65 s with Hugging
    Face's "Repo id must be in the form ..." and a traceback."""
    profile = str(profile_with(tmp_path, table, key, value))
    for command in ("check", "run"):
        line = refused(command, profile, key=f"{table}.{key}")
        assert "p.toml:" in line and repr(value) in line and says in line, line
    if key == "model":
        assert "hub id" in line, "says what else it could have been"
    assert not (tmp_path / "runs").exists(), "nothing was started"


def test_a_model_path_that_is_no_model_directory_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    line = refused(
        "check", str(profile_with(tmp_path, "run", "model", str(empty))), key="run.model"
    )
    assert "has no config.json" in line
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    line = refused(
        "check", str(profile_with(tmp_path, "run", "model", str(weights))), key="run.model"
    )
    assert "is a file" in line


def test_a_hub_id_is_not_a_missing_path(tmp_path: Path) -> None:
    """``Qwen/Qwen2.5-0.5B`` is a hub id (downloaded at start, or from the cache), as the
    profile says ``model`` may be: ``check`` passes it without the network."""
    profile = str(profile_with(tmp_path, "run", "model", "Qwen/Qwen2.5-0.5B"))
    result = CliRunner().invoke(app, ["check", profile])
    assert result.exit_code == 0, result.output
