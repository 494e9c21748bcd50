"""The command surface: the default command, ``view`` and run-directory naming."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from typer.testing import CliRunner

from grpo_tui.cli import app
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import run_dir_for

runner = CliRunner()


def test_default_command_checks_the_profile_before_opening_anything(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[trainer]\nlr = -1\n")
    result = runner.invoke(app, [str(path), "--mode", "lora_only"])
    assert result.exit_code == 2
    assert f"{path}:2: trainer.lr:" in result.output


def test_view_refuses_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    result = runner.invoke(app, ["view", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a run directory" in result.output


def test_a_run_directory_that_does_not_exist_is_not_found(tmp_path: Path) -> None:
    """It was "not a run directory" (view), "no recorded groups (rollouts/)" (samples)."""
    missing = tmp_path / "runs" / "quickstart-20260101-000000"
    for command in (["view"], ["samples"], ["report"], ["edit"]):
        args = [*command, str(missing), *(["lr=1e-5"] if command == ["edit"] else [])]
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (command, result.output)
        assert f"{missing}: not found" in result.output.replace("\n", ""), (command, result.output)


def test_run_dirs_started_in_the_same_second_do_not_collide(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f'[run]\nname = "x"\noutput_dir = "{tmp_path / "runs"}"\n')
    profile = load_profile(path)
    now = datetime(2026, 1, 2, 3, 4, 5)
    first = run_dir_for(profile, now)
    assert first == tmp_path / "runs" / "x-20260102-030405"
    first.mkdir(parents=True)
    second = run_dir_for(profile, now)
    assert second.name == "x-20260102-030405-2"
