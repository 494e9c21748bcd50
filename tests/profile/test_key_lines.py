"""Finding the line of a key path in TOML text (tomllib reports no value positions)."""

from __future__ import annotations

from grpo_tui.plan.toml_keys import KeyLines, format_key

TEXT = '''\
[run]
name = "x"   # a comment with key = value in it

[process."a.b"]
command = [
    "python",
    "-c", "port = 1",
]
port = 7001
env = { X = "1" }

[[env]]
group_size = 4

[[env]]
group_size = 8
desc = """
fake = 3
"""
seed = 1

[process.c.restart]
policy = "no"
'''


def test_lines_of_tables_keys_and_array_elements() -> None:
    lines = KeyLines(TEXT)
    assert lines.line(("run", "name")) == 2
    assert lines.line(("process", "a.b")) == 4
    assert lines.line(("process", "a.b", "command", 2)) == 5
    assert lines.line(("process", "a.b", "port")) == 9
    assert lines.line(("process", "a.b", "env", "X")) == 10
    assert lines.line(("env", 0, "group_size")) == 13
    assert lines.line(("env", 1, "group_size")) == 16
    assert lines.line(("env", 1, "seed")) == 20
    assert lines.line(("process", "c", "restart", "policy")) == 23


def test_keys_inside_strings_and_arrays_are_not_keys() -> None:
    lines = KeyLines(TEXT)
    assert lines.line(("process", "a.b", "port")) != 7
    assert lines.line(("env", 1, "fake")) == lines.line(("env", 1))
    assert lines.line(("nothing",)) is None


def test_format_key() -> None:
    assert format_key(("env", 0, "group_size")) == "env[0].group_size"
    assert format_key(("process", "reward", "depends_on", "x")) == "process.reward.depends_on.x"


def test_format_key_keeps_an_odd_key_on_one_readable_line() -> None:
    assert format_key(("run", " ")) == 'run." "'
    assert format_key(("run", 'x"y')) == r'run."x\"y"'
    # Line breaks to str.splitlines (NEL, LINE SEPARATOR) and other unprintables are escaped.
    for key, shown in (("\x85", r'run."\u0085"'), ("a\u2028b", r'run."a\u2028b"')):
        assert format_key(("run", key)) == shown
        assert len(format_key(("run", key)).splitlines()) == 1
    assert format_key(("run", "é x")) == 'run."é x"'
