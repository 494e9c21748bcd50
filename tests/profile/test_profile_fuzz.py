"""``grpo-tui check`` on generated malformed profiles (hypothesis), bounded for CI.

Each example is the quickstart profile with a few generated mutations (a value replaced by
junk of any TOML type, a key dropped, an unknown key added), written as real TOML. Through
the real command in-process (typer's runner, for speed): the exit is 0 (the mutation
happened to be valid) or 2, every problem line names the file and a key, and nothing
escapes as a traceback. A number replaced by text must be refused naming that key. A few
real ``grpo-tui check`` processes close the loop.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from grpo_tui.cli import app

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = tomllib.loads((REPO / "profiles" / "quickstart.toml").read_text())
runner = CliRunner()

KeyPath = tuple[str | int, ...]


def leaves(table: Any, path: KeyPath = ()) -> list[KeyPath]:
    if isinstance(table, dict):
        return [p for key, value in table.items() for p in leaves(value, (*path, key))]
    if isinstance(table, list) and table and all(isinstance(v, dict) for v in table):
        return [p for i, value in enumerate(table) for p in leaves(value, (*path, i))]
    return [path]


LEAVES = leaves(QUICKSTART)
TABLES: list[KeyPath] = [("run",), ("api",), ("inference",), ("trainer",), ("env", 0)]

junk = st.recursive(
    st.one_of(
        st.text(max_size=12),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(),
        st.booleans(),
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=2)
    ),
    max_leaves=4,
)
mutation = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(LEAVES), junk),
    st.tuples(st.just("drop"), st.sampled_from(LEAVES), st.none()),
    st.tuples(st.just("add"), st.sampled_from(TABLES), st.text(min_size=1, max_size=8), junk),
)


def get(table: Any, path: KeyPath) -> Any:
    for part in path:
        table = table[part]
    return table


def mutated(changes: list[tuple[Any, ...]]) -> dict[str, Any]:
    profile = tomllib.loads(tomli_w.dumps(QUICKSTART))  # a deep copy
    for change in changes:
        kind, path = change[0], change[1]
        try:
            parent = get(profile, path[:-1]) if kind != "add" else get(profile, path)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed or replaced the table
        if not isinstance(parent, dict):
            continue
        if kind == "set":
            parent[path[-1]] = change[2]
        elif kind == "drop":
            parent.pop(path[-1], None)
        else:
            parent[change[2]] = change[3]
    return profile


def check(path: Path) -> tuple[int, str]:
    result = runner.invoke(app, ["check", str(path)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"check raised {result.exception!r}:\n{result.output}")
    return result.exit_code, result.output


def assert_named(output: str, path: Path) -> list[str]:
    """Every problem line names the file and a key path; returns the lines."""
    errors = [line for line in output.splitlines() if line.startswith("error ")]
    assert errors, output
    for line in errors:
        where, _, rest = line.removeprefix("error ").partition(": ")
        assert where.split(":")[0] == str(path), line
        key, sep, message = rest.partition(": ")
        assert sep and key.strip() == key and key and message, line
    assert "Traceback" not in output
    return errors


@settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=st.lists(mutation, min_size=1, max_size=4))
def test_check_names_file_and_key_for_any_malformed_profile(
    tmp_path: Path, changes: list[tuple[Any, ...]]
) -> None:
    path = tmp_path / "profile.toml"
    path.write_text(tomli_w.dumps(mutated(changes)))
    code, output = check(path)
    assert code in (0, 2), output
    if code == 2:
        assert_named(output, path)


NUMERIC = [p for p in LEAVES if type(get(QUICKSTART, p)) in (int, float)]


def not_a_number(text: str) -> bool:
    """Text pydantic's lax mode cannot read as a number (``"5"`` it can, as TOML allows)."""
    try:
        float(text)
    except ValueError:
        return True
    return False


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(where=st.sampled_from(NUMERIC), text=st.text(min_size=1, max_size=8).filter(not_a_number))
def test_text_where_a_number_belongs_is_refused_by_key(
    tmp_path: Path, where: KeyPath, text: str
) -> None:
    path = tmp_path / "profile.toml"
    path.write_text(tomli_w.dumps(mutated([("set", where, text)])))
    code, output = check(path)
    assert code == 2, output
    errors = assert_named(output, path)
    key = ".".join(str(p) for p in where[:-1]) + f".{where[-1]}"
    key = key.replace("env.0.", "env[0].")
    assert any(f": {key}: " in line for line in errors), output


def test_real_check_processes_exit_2_with_file_and_key(tmp_path: Path) -> None:
    cases = [
        mutated([("set", ("trainer", "lr"), "fast")]),
        mutated([("set", ("env", 0, "group_size"), [1, 2]), ("drop", ("run", "model"), None)]),
        mutated([("add", ("inference",), "bogus_key", {"a": 1})]),
    ]
    for index, profile in enumerate(cases):
        path = tmp_path / f"profile-{index}.toml"
        path.write_text(tomli_w.dumps(profile))
        done = subprocess.run(
            [sys.executable, "-m", "grpo_tui", "check", str(path)],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert_named(done.stderr, path)
