"""The profile example in the README is a valid profile (docs that cannot drift)."""

import re
from pathlib import Path

from typer.testing import CliRunner

from grpo_tui.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_profile_example_passes_check(tmp_path: Path) -> None:
    block = re.search(r"```toml\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "README has no TOML profile example"
    profile = tmp_path / "example.toml"
    profile.write_text(block.group(1))
    result = CliRunner().invoke(app, ["check", str(profile)])
    assert result.exit_code == 0, result.output
    assert "reward_model" in result.output
    assert "start order: model -> api -> inference -> trainer" in result.output
