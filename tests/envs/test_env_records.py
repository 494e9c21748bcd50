"""An environment records the all-equal groups it drops (the trainer never sees them) and
its generation as timeline spans, under the supervisor's run directory."""

from __future__ import annotations

import numpy as np
from env_procs import Trainer, api_argv, env_argv, free_port, last_env_metrics

from grpo_trainer.envs.task import Prompt
from grpo_trainer.envs.toy import RepeatDigit
from grpo_trainer.models import load_tokenizer
from grpo_trainer.records.rollout_reader import RolloutIndex
from grpo_trainer.records.timeline_reader import Timeline

GROUP = 4


def test_dropped_groups_and_generation_spans_are_recorded(spawn, tmp_path, tiny_model, inference):
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    spawn("api", api_argv(port, tmp_path / "rollouts.db")).wait_http(f"{api}/health")
    trainer = Trainer(api, batch_size=2 * GROUP)
    trainer.register()
    run_dir = tmp_path / "run"
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs.toy", api, inference, tiny_model, "--group-size", str(GROUP),
                 "--max-groups", "2", "--max-concurrency", "2", "--seed", "5"),
        env={"GRPO_TUI_RUN_DIR": str(run_dir), "GRPO_TUI_PROCESS": "env"},
    )  # fmt: skip
    assert env.wait(timeout=180) == 0, env.text()[-3000:]
    dropped = last_env_metrics(env.text())["env/groups_dropped_equal_scores"]
    assert dropped > 0, "the random tiny model scores most groups all 0: some must drop"

    index = RolloutIndex(run_dir)
    index.poll()
    assert len(index) == dropped and index.writers == ["env"]
    assert set(index.envs) == {"toy"}
    tokenizer = load_tokenizer(tiny_model)
    task = RepeatDigit()
    for row in range(len(index)):
        record = index.open(row)
        assert record.kind == "dropped" and len(set(record.scores)) == 1
        assert record.prompt_text.startswith("repeat ") and record.prompt_text.endswith(":")
        assert record.version == 0 and record.lag == 0
        answer = record.prompt_text.removeprefix("repeat ").removesuffix(":")
        for completion in record.completions:
            completion_ids = completion.tokens[completion.start :].tolist()
            text = tokenizer.decode(completion_ids, skip_special_tokens=True)
            assert completion.score == task.score(Prompt(record.prompt_text, answer), text)
            logprobs = completion.values["inference_logprobs"]
            assert np.isnan(logprobs[: completion.start]).all()
            assert (logprobs[completion.start :] <= 0).all()
            assert "trainer_logprobs" not in completion.values
        assert np.isnan(index.rows["mismatch_kl"][row])

    timeline = Timeline(run_dir)
    timeline.poll()
    lane = timeline.lanes["env"]
    assert lane.role == "env"
    phase, start, end, _ = lane.arrays()
    assert len(phase) >= 1 and (end >= start).all()
    spans = timeline.breakdown(float(start.min()), float(end.max()))["env"]
    assert spans["generate"] > 0
    trainer.close()
