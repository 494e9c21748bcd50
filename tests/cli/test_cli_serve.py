"""``grpo-tui serve`` and ``--inference-url`` refuse what they cannot do, before anything
starts (exit 2, the key named): a profile that attaches itself, a mode no run can attach
in, a URL that is no server root. In process (typer's runner); the serving itself is
``tests/e2e/test_e2e_attach.py``'s."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from grpo_tui.cli import app
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.serving import attach_url, serve_plan

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "profiles" / "quickstart.toml"


def profile(tmp_path: Path, **inference: object) -> Path:
    data = tomllib.loads(QUICKSTART.read_text())
    data["run"]["output_dir"] = str(tmp_path / "runs")
    data["inference"].update(inference)
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def refused(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "nothing was started" in result.output
    return result.output


def test_serve_keeps_the_server_alone(tmp_path: Path) -> None:
    plan = serve_plan(load_profile(profile(tmp_path)))
    assert [spec.name for spec in plan.specs] == ["model", "inference"]
    assert plan.exit_with is None  # it lasts until stopped
    (inference,) = [spec for spec in plan.specs if spec.name == "inference"]
    assert inference.progress is None  # an attached run may put it to sleep for a step
    assert inference.shutdown.timeout == 30
    assert "--shared-weights" in inference.command and "--enable-lora" in inference.command
    assert attach_url(plan) == "http://127.0.0.1:9001"
    assert plan.run_dir.name.startswith("quickstart-serve-")


def test_serve_refuses_a_profile_that_attaches_and_a_restart_mode(tmp_path: Path) -> None:
    said = refused("serve", str(profile(tmp_path, url="http://h:1")))
    assert "inference.url: this profile attaches to a server at url" in said
    said = refused("serve", str(profile(tmp_path)), "--mode", "lora_restart")
    assert "run.mode: mode lora_restart restarts inference at every sync" in said
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:9001", "must be http://host:port"),
        ("http://127.0.0.1:9001/v1", "without a path (no /v1)"),
    ],
)
def test_an_inference_url_that_is_no_server_root_is_refused(
    tmp_path: Path, url: str, says: str
) -> None:
    said = refused("check", str(profile(tmp_path)), "--inference-url", url, "--profile-only")
    assert "inference.url" in said and says in said
