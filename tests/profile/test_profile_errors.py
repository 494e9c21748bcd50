"""Bad profiles through the real CLI: exit 2, one message per problem with key path and line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_tui.cli import app

runner = CliRunner()

CHILD = '["python", "-c", "print(1)"]'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.toml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def check(path: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["check", str(path), *extra])
    return result.exit_code, result.output


def assert_problem(output: str, path: Path, line: int | None, key: str, words: str) -> None:
    where = f"{path}:{line}" if line is not None else str(path)
    matching = [row for row in output.splitlines() if f"{where}: {key}:" in row]
    assert matching, f"no problem at {where} {key!r} in:\n{output}"
    assert words in matching[0], matching[0]


CASES = {
    "unknown key": (
        """
        [run]
        name = "x"

        [trainer]
        lrr = 0.1
        """,
        5,
        "trainer.lrr",
        "did you mean 'lr'",
    ),
    "wrong type": (
        """
        [trainer]
        lr = "fast"
        """,
        2,
        "trainer.lr",
        "valid number",
    ),
    "depends_on names no process": (
        f"""
        [run]
        exit_with = "reward"

        [process.reward]
        command = {CHILD}
        depends_on = {{ x = "process_healthy" }}
        """,
        6,
        "process.reward.depends_on.x",
        "names no process",
    ),
    "needs names no process": (
        f"""
        [run]
        exit_with = "reward"

        [process.reward]
        command = {CHILD}
        needs = [{{ any_of = ["judge"] }}]
        """,
        6,
        "process.reward.needs[0].any_of",
        "'judge' names no process",
    ),
    "stall_after must be positive": (
        """
        [run]
        stall_after = 0
        """,
        2,
        "run.stall_after",
        "greater than 0",
    ),
    "notify is a command line, not a string": (
        """
        [run]
        notify = "curl https://chat.example/hook"
        """,
        2,
        "run.notify",
        "valid list",
    ),
    "notify has no empty word": (
        """
        [run]
        notify = ["python", ""]
        """,
        2,
        "run.notify[1]",
        "at least 1 character",
    ),
    "dependency cycle": (
        f"""
        [run]
        exit_with = "a"

        [process.a]
        command = {CHILD}
        depends_on = ["b"]

        [process.b]
        command = {CHILD}

        [process.b.depends_on.a]
        condition = "process_started"
        """,
        6,
        "process.a.depends_on.b",
        "dependency cycle: a -> b -> a",
    ),
    "two processes on one port": (
        f"""
        [run]
        exit_with = "a"

        [process.a]
        command = {CHILD}
        port = 7001

        [process.b]
        command = {CHILD}
        port = 7001
        """,
        10,
        "process.b.port",
        "port 7001 is also used by a",
    ),
    "role and process on one port": (
        f"""
        [api]
        port = 8123

        [process.metrics]
        command = {CHILD}
        port = 8123
        """,
        6,
        "process.metrics.port",
        "also used by api",
    ),
    "probe without kind": (
        f"""
        [run]
        exit_with = "a"

        [process.a]
        command = {CHILD}
        readiness = {{ url = "http://127.0.0.1:1/" }}
        """,
        6,
        "process.a.readiness",
        "kind = one of http, tcp, exec, log_line",
    ),
    "bad restart policy in a sub-table": (
        f"""
        [run]
        exit_with = "a"

        [process.a]
        command = {CHILD}

        [process.a.restart]
        policy = "sometimes"
        """,
        8,
        "process.a.restart.policy",
        "'on_failure'",
    ),
    "second env table": (
        """
        [[env]]
        group_size = 4

        [[env]]
        group_size = "eight"
        """,
        5,
        "env[1].group_size",
        "valid integer",
    ),
    "groups_per_request that does not divide max_concurrency": (
        """
        [[env]]
        max_concurrency = 8
        groups_per_request = 3
        """,
        3,
        "env[0].groups_per_request",
        "3 does not divide max_concurrency 8",
    ),
    "key the role layer sets": (
        """
        [trainer]
        weight_bridge_mode = "lora_only"
        """,
        2,
        "trainer.weight_bridge_mode",
        "run.mode",
    ),
    "unknown table": (
        """
        [trainr]
        lr = 1
        """,
        1,
        "trainr",
        "did you mean 'trainer'",
    ),
    "exit_with names no process": (
        f"""
        [run]
        exit_with = "nobody"

        [process.a]
        command = {CHILD}
        """,
        2,
        "run.exit_with",
        "names no process",
    ),
    "process table changing a role's command": (
        f"""
        [trainer]

        [process.trainer]
        command = {CHILD}
        """,
        4,
        "process.trainer.command",
        "set by the role",
    ),
    "bad adjustment of a role process": (
        """
        [trainer]

        [process.trainer]
        shutdown = { timeout = -1 }
        """,
        4,
        "process.trainer.shutdown.timeout",
        "greater than 0",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_profile_exits_2_naming_key_and_line(tmp_path: Path, case: str) -> None:
    text, line, key, words = CASES[case]
    path = write(tmp_path, text)
    code, output = check(path)
    assert code == 2, output
    assert_problem(output, path, line, key, words)
    assert "nothing was started" in output


def test_toml_syntax_error_gives_tomllib_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[run]\nname = "x"\nmode = \n')
    code, output = check(path)
    assert code == 2
    assert f"{path}:3: TOML: Invalid value" in output


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    code, output = check(missing)
    assert code == 2
    assert f"{missing}: file not found" in output


def test_bad_mode_override_names_run_mode(tmp_path: Path) -> None:
    path = write(tmp_path, '[run]\nname = "x"\nmode = "none"\n')
    code, output = check(path, "--mode", "turbo")
    assert code == 2
    assert_problem(output, path, 3, "run.mode", "[from --mode]")


def test_every_problem_reported_in_one_pass(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        [run]
        exit_with = "a"

        [trainer]
        lr = "fast"
        lrr = 1

        [process.a]
        command = {CHILD}
        port = 7001
        depends_on = ["ghost"]

        [process.b]
        command = {CHILD}
        port = 7001
        """,
    )
    code, output = check(path)
    assert code == 2
    assert_problem(output, path, 5, "trainer.lr", "valid number")
    assert_problem(output, path, 6, "trainer.lrr", "unknown key")
    assert_problem(output, path, 11, "process.a.depends_on.ghost", "names no process")
    assert_problem(output, path, 15, "process.b.port", "also used by a")
    assert "4 problems; nothing was started." in output


def test_invalid_process_does_not_make_its_dependents_look_wrong(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        [run]
        exit_with = "b"

        [process.a]
        command = "not a list"

        [process.b]
        command = {CHILD}
        depends_on = ["a"]
        """,
    )
    code, output = check(path)
    assert code == 2
    assert_problem(output, path, 5, "process.a.command", "valid list")
    assert "process.b.depends_on" not in output


def test_run_with_bad_profile_starts_nothing(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    path = write(
        tmp_path,
        f"""
        [run]
        output_dir = "{out}"
        exit_with = "a"

        [process.a]
        command = {CHILD}
        depends_on = ["ghost"]
        """,
    )
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert "process.a.depends_on.ghost" in result.output
    assert not out.exists()
