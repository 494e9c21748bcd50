"""Every shipped profile passes ``grpo-tui check``, in every mode, without torch or textual."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_trainer.serve.command_lines import SGLANG_REFUSED
from grpo_tui.cli import app

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted((REPO / "profiles").glob("*.toml"))
MODES = ("none", "shared_vllm", "lora_only", "lora_restart")


def test_profiles_exist() -> None:
    names = {p.name for p in PROFILES}
    assert {
        "quickstart.toml",
        "gsm8k-qwen2.5-3b-shared.toml",
        "gsm8k-qwen2.5-3b-lora.toml",
        "qwen2.5-7b-4gpu.toml",
        "quickstart-sglang.toml",
    } <= names


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_check_passes_and_prints_the_plan(profile: Path) -> None:
    result = CliRunner().invoke(app, ["check", str(profile), "--profile-only"])
    assert result.exit_code == 0, result.output
    assert "start order: " in result.output
    assert "api -> inference -> trainer -> env" in result.output
    host = "node1" if "[cluster]" in profile.read_text() else "127.0.0.1"
    assert f"readiness:  http GET http://{host}:9001/health" in result.output
    if profile.name == "quickstart.toml":  # inference, trainer and env prestart
        assert result.output.count("waits at its start gate") == 3


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_every_profile_checks_in_every_mode(profile: Path, mode: str) -> None:
    """Every mode but those the profile's engine cannot run, which are refused with why."""
    result = CliRunner().invoke(app, ["check", str(profile), "--mode", mode, "--profile-only"])
    if 'backend = "sglang"' in profile.read_text() and mode in SGLANG_REFUSED:
        assert result.exit_code == 2, result.output
        assert f"backend sglang cannot run mode {mode!r}" in result.output
        return
    assert result.exit_code == 0, result.output
    assert f"mode={mode}" in result.output
    if mode == "none":  # the trainer's default mode: its command leaves the flag out
        assert "--weight-bridge-mode" not in result.output
    else:
        assert f"--weight-bridge-mode {mode}" in result.output


def test_check_imports_neither_torch_nor_textual() -> None:
    code = (
        "import sys\n"
        "from grpo_tui.cli import app\n"
        "try:\n"
        "    app(['check', 'profiles/quickstart.toml'])\n"
        "except SystemExit as done:\n"
        "    assert done.code in (0, None), done.code\n"
        "roots = {m.split('.')[0] for m in sys.modules}\n"
        "heavy = sorted(roots & {'torch', 'transformers', 'textual'})\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout, proc.stdout


def test_default_command_without_profile_outside_the_repo_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "--mode", "none"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "profiles/quickstart.toml" in proc.stderr


@pytest.mark.parametrize("name", ["quickstart.toml", "quickstart-gpu.toml"])
def test_a_profile_comment_lists_the_modes_it_can_run(name: str) -> None:
    """The quickstart's comment listed four modes where the README lists five."""
    from typing import get_args

    from grpo_trainer.serve.settings import Mode

    text = (REPO / "profiles" / name).read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("mode = ")]
    listed = [word.strip() for word in line.split("#", 1)[1].split("|")]
    assert listed == list(get_args(Mode))
    assert " | ".join(get_args(Mode)[2:]) in " ".join(text.split())  # the --mode hint
