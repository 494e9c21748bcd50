"""Live edits are validated like the profile by the role layer (in-process, no processes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import Plan, build_plan

REPO = Path(__file__).resolve().parents[2]


def plan(tmp_path: Path, mode: str | None = None, **trainer: object) -> Plan:
    text = (REPO / "profiles" / "quickstart.toml").read_text()
    for key, value in trainer.items():  # keys the quickstart sets: replace their line
        text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
    path = tmp_path / "profile.toml"
    path.write_text(text)
    return build_plan(load_profile(path, mode=mode), tmp_path / "run")


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"lr": -1}, "lr: Input should be greater than 0 (got -1)"),
        ({"lr": "fast"}, "lr: Input should be a valid number"),
        ({"lr": float("inf")}, "lr: expected a finite number, got inf"),
        ({"max_batches_offpolicy": True}, "max_batches_offpolicy: expected a finite number"),
        ({"clip_eps_high": 0.05}, "clip_eps_high 0.05 is below clip_eps 0.2"),
        ({"tis_cap": 0.5}, "tis_cap 0.5 must be >= 1"),
        ({"temperature": 0}, "temperature: Input should be greater than 0"),
        ({"clip_low": 0.1}, "not editable: clip_low; editable: lr, lora_lr, beta"),
        ({}, "nothing to edit"),
    ],
)
def test_bad_edits_are_refused_with_the_reason_and_change_nothing(
    tmp_path: Path, values: dict, reason: str
) -> None:
    run = plan(tmp_path)
    (tmp_path / "run").mkdir()
    before = run.roles.spec("trainer").command
    with pytest.raises(ValueError, match="") as refused:
        run.edit(values)
    assert reason in str(refused.value)
    assert run.roles.spec("trainer").command == before
    assert not (tmp_path / "run" / "live_edits.json").exists()


def test_edits_the_mode_cannot_use_are_refused(tmp_path: Path) -> None:
    lora = plan(tmp_path, mode="lora_only")
    with pytest.raises(ValueError, match="mode lora_only trains with lora_lr"):
        lora.edit({"lr": 1e-4})
    no_kl = plan(tmp_path, beta=0)
    with pytest.raises(ValueError, match=r"beta: cannot go from 0 to 0\.1"):
        no_kl.edit({"beta": 0.1})


def test_an_accepted_edit_is_kept_in_specs_and_recorded(tmp_path: Path) -> None:
    run = plan(tmp_path)
    (tmp_path / "run").mkdir()
    values, specs = run.edit({"lr": "2e-4", "temperature": 0.5, "tis_cap": 2})
    assert values == {"lr": 2e-4, "temperature": 0.5, "tis_cap": 2.0}
    assert sorted(specs) == ["env", "trainer"]
    command = specs["trainer"].command
    assert command[command.index("--lr") + 1] == "0.0002"
    assert "--temperature" in specs["env"].command
    assert run.roles.spec("trainer").command == command  # kept for the next restart
    record = json.loads((tmp_path / "run" / "live_edits.json").read_text())
    assert record["version"] == 1 and record["values"] == values
