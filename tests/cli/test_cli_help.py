"""``--help`` wraps its text at word boundaries, where the width makes it, and shows it all.

The help kept each docstring's own line breaks (``Editable: ... tis_cap (trainer),`` then
``temperature ...`` on a line of its own at any width) and read ``[cluster]`` as markup
(``With  engine = "slurm"``).
"""

from __future__ import annotations

import re
from itertools import pairwise

import pytest
from typer.testing import CliRunner

from grpo_tui.cli import app

runner = CliRunner()
CALLBACKS = {c.name or c.callback.__name__: c.callback for c in app.registered_commands}
COMMANDS = sorted(CALLBACKS)


def description(output: str) -> list[list[str]]:
    """The paragraphs of the text between the usage (which may take several lines) and the
    first table."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line)
    start = next(i for i in range(start, len(lines)) if not lines[i].strip())
    end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:end]:
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


def words(text: str) -> str:
    return " ".join(re.sub(r"`+", "", text).split())


@pytest.mark.parametrize("width", [60, 100, 160])
@pytest.mark.parametrize("command", COMMANDS)
def test_help_breaks_lines_only_where_the_width_makes_it(command: str, width: int) -> None:
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": str(width)}, color=False)
    assert result.exit_code == 0, result.output
    doc = (CALLBACKS[command].__doc__ or "").strip()
    assert all(len(line) <= width for line in result.output.splitlines())
    shown = words(result.output)
    for paragraph in doc.split("\n\n"):
        assert words(paragraph) in shown, f"{command}: not shown whole: {paragraph!r}"
    for paragraph in description(result.output):
        for line, after in pairwise(paragraph):
            next_word = after.split()[0]
            assert len(line) + 1 + len(next_word) > width - 2, (
                f"{command} at {width}: {line!r} broken before {next_word!r}, which fits"
            )
