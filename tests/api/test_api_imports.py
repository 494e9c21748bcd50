"""The API stays light: settings import no web or ML stack, nothing imports textual."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "textual")


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("grpo_trainer.api.settings", (*HEAVY, "fastapi", "uvicorn")),
        ("grpo_trainer.api.__main__", HEAVY),
    ],
)
def test_module_imports_stay_light(module: str, forbidden: tuple[str, ...]) -> None:
    code = (
        f"import importlib, sys; importlib.import_module({module!r}); "
        f"print(','.join(m for m in sys.modules if m.split('.')[0] in {forbidden!r}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"{module} imports {proc.stdout.strip()}"
