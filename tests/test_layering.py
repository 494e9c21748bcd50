"""The core stays importable without the UI: no textual in the supervisor or the trainer."""

import subprocess
import sys

import pytest

CORE_MODULES = [
    "grpo_tui.supervisor",
    "grpo_tui.supervisor.spec",
    "grpo_tui.supervisor.events",
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
