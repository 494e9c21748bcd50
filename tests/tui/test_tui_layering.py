"""The UI's plain state is UI-free: the viewer's loader and the alerts import no textual."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["grpo_tui.run_state", "grpo_tui.alerts", "grpo_tui.run_files"])
def test_state_modules_do_not_import_textual(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "sys.exit(any(m == 'textual' or m.startswith('textual.') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
