"""The layers stay apart: no textual in the supervisor, the stack or the trainer; no role
name in the supervisor."""

import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

CORE_MODULES = [
    "grpo_tui.supervisor",
    "grpo_tui.supervisor.spec",
    "grpo_tui.supervisor.events",
    "grpo_tui.stack.stack",
    "grpo_trainer",
    "grpo_trainer.models",
    "grpo_trainer.sync.base",
]


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_does_not_import_textual(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "bad = [m for m in sys.modules if m == 'textual' or m.startswith('textual.')]; "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, f"{module} imports textual: {proc.stdout} {proc.stderr}"


SWEEP_MODULES = ["grpo_tui.sweep.runner", "grpo_tui.sweep.report", "grpo_tui.sweep.results"]


@pytest.mark.parametrize("module", SWEEP_MODULES)
def test_sweep_module_imports_neither_textual_nor_torch(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'torch')]; "
        "print(','.join(sorted(bad)[:5])); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, f"{module} imports: {proc.stdout} {proc.stderr}"


SUPERVISOR = Path(__file__).resolve().parents[1] / "grpo_tui" / "supervisor"
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
