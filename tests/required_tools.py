"""System tools some tests need: Slurm (a real local cluster), tmux (a real terminal) and
Chromium (a real browser, headless, for the report's screenshot).

A missing tool fails the tests that need it, naming the tool and how to install it, so a
run without it cannot pass as green. ``GRPO_TUI_ALLOW_MISSING_TOOLS`` opts out, by the
names of ``TOOLS`` (``slurm,tmux,chromium``): those tests then skip, and pytest's summary counts and
lists them (``-rs``). ``python tests/required_tools.py`` checks the same before a long run
(``.ci/run``).
"""

from __future__ import annotations

import os
import shutil
import sys

ALLOW_MISSING_ENV = "GRPO_TUI_ALLOW_MISSING_TOOLS"
TOOLS = {
    "slurm": (("slurmctld", "slurmd"), "Debian: apt-get install -y slurm-wlm"),
    "tmux": (("tmux",), "Debian: apt-get install -y tmux"),
    "chromium": (("chromium",), "Debian: apt-get install -y chromium"),
}
"""Each tool's name in ``GRPO_TUI_ALLOW_MISSING_TOOLS``: the commands it needs, how to get them."""


def allowed_missing() -> set[str]:
    """The tools ``GRPO_TUI_ALLOW_MISSING_TOOLS`` names (an unknown name is an error)."""
    value = os.environ.get(ALLOW_MISSING_ENV, "")
    names = {name.strip() for name in value.split(",") if name.strip()}
    unknown = sorted(names - TOOLS.keys())
    if unknown:
        raise ValueError(f"{ALLOW_MISSING_ENV} names {unknown}; known tools: {', '.join(TOOLS)}")
    return names


def missing(tool: str) -> str | None:
    """Why ``tool`` cannot be used here (None: it can)."""
    commands, install = TOOLS[tool]
    absent = [command for command in commands if shutil.which(command) is None]
    if not absent:
        return None
    return f"{tool} is not installed ({', '.join(absent)} not on PATH; {install})"


def require(tool: str) -> None:
    """In a test or fixture: fail when ``tool`` is missing; skip when the opt-out names it."""
    import pytest

    reason = missing(tool)
    if reason is None:
        return
    if tool in allowed_missing():
        pytest.skip(f"{reason}; {ALLOW_MISSING_ENV} allows it")
    pytest.fail(
        f"{reason}. Install it, or set {ALLOW_MISSING_ENV}={tool} to skip these tests",
        pytrace=False,
    )


def main() -> int:
    """Exit 1, saying why, when a tool is missing and the opt-out does not name it."""
    allowed = allowed_missing()
    unmet = [reason for tool in TOOLS if (reason := missing(tool)) and tool not in allowed]
    for reason in unmet:
        print(f"{reason}: the tests that need it would fail", file=sys.stderr)
    if unmet:
        print(f"install it, or set {ALLOW_MISSING_ENV}=<tools> to skip them", file=sys.stderr)
    return 1 if unmet else 0


if __name__ == "__main__":
    sys.exit(main())
