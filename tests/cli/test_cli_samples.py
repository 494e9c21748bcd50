"""``grpo-tui samples``: a run's recorded groups for scripts, as text or JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recorded_rollouts import STEPS
from typer.testing import CliRunner

from grpo_tui.cli import app

runner = CliRunner()


@pytest.fixture
def run_dir(recorded_rollouts_dir: Path) -> Path:
    return recorded_rollouts_dir


def test_samples_prints_the_last_steps_groups_newest_first(run_dir: Path) -> None:
    result = runner.invoke(app, ["samples", str(run_dir)])
    assert result.exit_code == 0, result.output
    titles = [line for line in result.output.splitlines() if line.startswith("step ")]
    assert len(titles) == 5  # four trained groups and one dropped group of the last step
    assert all(title.startswith(f"step {STEPS} ·") for title in titles)
    assert sum("dropped" in title for title in titles) == 1
    assert "prompt: repeat" in result.output and "Δlogp trainer-inference" in result.output


def test_samples_json_has_every_tokens_numbers(run_dir: Path) -> None:
    result = runner.invoke(
        app, ["samples", str(run_dir), "--step", "7", "--json", "--where", "kind=trained env=gsm8k"]
    )
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in result.output.splitlines()]
    assert [g["group"] for g in groups] == [3, 1]  # newest first
    for group in groups:
        assert group["step"] == 7 and group["env"] == "gsm8k" and group["kind"] == "trained"
        assert group["lag"] == 6 - group["policy_version"]
        for completion in group["completions"]:
            n = len(completion["tokens"])
            assert n == len(completion["pieces"]) == len(completion["trainer_logprobs"]) == 6
            assert "".join(completion["pieces"]) == completion["text"]
            assert all(v is not None and v <= 0 for v in completion["inference_logprobs"])
            ratio = [
                round(2.718281828 ** (t - i), 4)
                for t, i in zip(
                    completion["trainer_logprobs"], completion["inference_logprobs"], strict=True
                )
            ]
            assert ratio == pytest.approx(completion["ratio"], rel=1e-3)


def test_samples_default_to_the_last_step_the_trainer_trained(tmp_path: Path) -> None:
    """A finished run's last step held only groups dropped after the trainer stopped, and
    ``samples`` showed those."""
    from recorded_rollouts import _group, write_recorded_rollouts

    from grpo_trainer.records.background import BackgroundWriter
    from grpo_trainer.records.rollout_writer import RolloutWriter

    write_recorded_rollouts(tmp_path, steps=3)
    background = BackgroundWriter("late")
    late = RolloutWriter(tmp_path, "env.late", max_mb=8, background=background)
    late.add(lambda: [_group(4, 0, "toy", dropped=True), _group(4, 1, "toy", dropped=True)])
    background.close()
    late.close()
    result = runner.invoke(app, ["samples", str(tmp_path)])
    assert result.exit_code == 0, result.output
    titles = [line for line in result.output.splitlines() if line.startswith("step ")]
    assert titles and all(title.startswith("step 3 ·") for title in titles), titles
    dropped = runner.invoke(app, ["samples", str(tmp_path), "--where", "kind=dropped"])
    titles = [line for line in dropped.output.splitlines() if line.startswith("step ")]
    assert titles and all(title.startswith("step 4 ·") for title in titles), titles


def test_samples_refuses_what_it_cannot_show(run_dir: Path, tmp_path: Path) -> None:
    cases = [
        (["samples", str(tmp_path / "no-such-run")], "no-such-run: not found"),
        (["samples", str(tmp_path)], "no recorded groups"),
        (["samples", str(run_dir), "--where", "lag>>1"], "--where"),
        (["samples", str(run_dir), "--step", "999"], "no group matches step=999"),
        (["samples", str(run_dir), "--color-by", "rainbow"], "--color-by"),
    ]
    for args, words in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and words in result.output, (args, result.output)
