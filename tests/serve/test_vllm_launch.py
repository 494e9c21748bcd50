"""``grpo_trainer.serve.vllm_launch``: vLLM's CLI imported before the start gate, then run
in-process with the arguments the gate hands it. vLLM cannot run here, so a stand-in
package named ``vllm`` plays its CLI: its modules take a moment to import and its ``main``
prints the argv and the environment it runs with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_trainer.serve.command_lines import VLLM_LAUNCH_MODULE
from grpo_trainer.start_gate import GATE_ENV

IMPORT_S = 0.3
MAIN = """
import json, os, sys
def main():
    print("vllm main " + json.dumps([sys.argv, os.environ.get("GRPO_START_GATE")]), flush=True)
"""


@pytest.fixture
def fake_vllm(tmp_path: Path) -> dict[str, str]:
    """The environment of a process that imports the stand-in ``vllm``."""
    root = tmp_path / "site"
    for module, body in {
        "vllm/entrypoints/cli/main.py": MAIN,
        "vllm/entrypoints/cli/serve.py": f"import time; time.sleep({IMPORT_S})",
        "vllm/entrypoints/openai/api_server.py": "import time; time.sleep(0.1)",
    }.items():
        path = root / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        for package in path.relative_to(root).parents:
            if str(package) != ".":
                (root / package / "__init__.py").touch()
    paths = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def launch(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", VLLM_LAUNCH_MODULE, *args],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def ran(stdout: str) -> list[object]:
    line = next(x for x in stdout.splitlines() if x.startswith("vllm main "))
    return json.loads(line.removeprefix("vllm main "))


def test_imports_then_waits_at_the_gate_then_serves_the_handed_command(
    fake_vllm: dict[str, str],
) -> None:
    proc = launch({**fake_vllm, GATE_ENV: "stdin"}, "serve", "old-model", "--port", "1")
    assert proc.stdout is not None and proc.stdin is not None
    try:
        imported = proc.stdout.readline()  # printed before the gate: the imports are done
        assert imported.startswith("vllm_launch: vLLM imported in "), imported
        assert float(imported.split()[-2]) >= IMPORT_S
        time.sleep(0.2)
        assert proc.poll() is None  # waits at the gate
        command = [sys.executable, "-m", VLLM_LAUNCH_MODULE, "serve", "new", "--port", "2"]
        out, err = proc.communicate(f"start {json.dumps(command)}\n", timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert ran(out) == [["vllm", "serve", "new", "--port", "2"], None]  # the gate not inherited


def test_a_plain_start_serves_its_own_arguments(fake_vllm: dict[str, str]) -> None:
    """The stand-in lacks some CLI modules a real vLLM has: each is named, none is fatal."""
    proc = launch({**fake_vllm, GATE_ENV: "stdin"}, "serve", "m")
    out, err = proc.communicate("start\n", timeout=30)
    assert proc.returncode == 0, err
    assert ran(out)[0] == ["vllm", "serve", "m"]
    assert "vllm.entrypoints.cli.launch not imported early" in err


def test_without_the_gate_it_runs_at_once_like_vllm(fake_vllm: dict[str, str]) -> None:
    env = {k: v for k, v in fake_vllm.items() if k != GATE_ENV}
    proc = launch(env, "serve", "m", "--enforce-eager")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert ran(out)[0] == ["vllm", "serve", "m", "--enforce-eager"]


def test_a_closed_gate_never_runs_vllm(fake_vllm: dict[str, str]) -> None:
    proc = launch({**fake_vllm, GATE_ENV: "stdin"}, "serve", "m")
    out, err = proc.communicate("", timeout=30)
    assert proc.returncode == 1 and "vllm main" not in out
    assert "start gate closed" in err
