"""The layers stay apart: the import contracts (pyproject.toml's ``[tool.importlinter]``)
hold and catch a break; no role name in the supervisor."""

import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("grpo_tui", "grpo_trainer")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the packages under ``root``, with its pyproject's contracts."""
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache", "--no-logo"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contracts_hold() -> None:
    """pyproject.toml's ``[tool.importlinter]``: the layers, no textual in the core, no torch
    in grpo_tui, no cycles."""
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_the_contracts_catch_textual_in_the_trainer(tmp_path: Path) -> None:
    """What the contracts are for: ``import textual`` in the training loop breaks them."""
    for package in PACKAGES:
        shutil.copytree(
            REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    loop = tmp_path / "grpo_trainer" / "train" / "loop.py"
    loop.write_text(loop.read_text() + "\nimport textual\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "grpo_trainer.train.loop -> textual" in proc.stdout


SUPERVISOR = REPO / "grpo_tui" / "supervisor"
ROLE_NAMES = {"trainer", "inference", "env"}
"""The GRPO roles (``grpo_tui.plan``); what they are for is the stack's (``grpo_tui.stack``)."""


def role_names_in(path: Path) -> list[str]:
    """``line: token`` for each role name in a module's code, strings and comments.

    Identifiers count by their ``_``-separated parts (``trainer_spec``), except ``env``,
    which in identifiers is the environment-variable mapping of a spec (``spec.env``).
    Strings and comments count by their words (``grpo_trainer``, a package, is one word).
    """
    found = []
    with path.open("rb") as source:
        for token in tokenize.tokenize(source.readline):
            if token.type == tokenize.NAME:
                words = set(token.string.lower().split("_")) - {"env"}
            elif token.type in (tokenize.STRING, tokenize.COMMENT):
                words = set(re.findall(r"\w+", token.string.lower()))
            else:
                continue
            found += [f"{token.start[0]}: {word}" for word in sorted(words & ROLE_NAMES)]
    return found


def test_the_supervisor_names_no_role() -> None:
    modules = sorted(SUPERVISOR.rglob("*.py"))
    assert len(modules) > 10
    found = {path.name: hits for path in modules if (hits := role_names_in(path))}
    assert found == {}, (
        f"role names in grpo_tui/supervisor/ (they belong in grpo_tui/stack/): {found}"
    )


def test_the_role_name_check_finds_them(tmp_path: Path) -> None:
    module = tmp_path / "sample.py"
    module.write_text(
        "def f(spec, env):  # the environment variables\n"
        '    """Waits for grpo_trainer."""\n'
        "    trainer_spec = spec\n"
        '    return env.get("X") or spec.role == "inference"  # the env role\n'
    )
    assert role_names_in(module) == ["3: trainer", "4: inference", "4: env"]
