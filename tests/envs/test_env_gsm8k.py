"""GSM8K: scoring on known right and wrong answers, data-file handling, and an offline run of
the environment process over a JSONL fixture against the real API and inference server."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from env_procs import Trainer, api_argv, env_argv, free_port

from grpo_trainer.envs.gsm8k import Gsm8k, read_jsonl, reference_answer, score_completion

PROBLEMS = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A pen costs 2 dollars. What do 6 pens cost?", "answer": "#### 12"},
    {"question": "What is 1,000 + 500?", "answer": "#### 1,500"},
    {"question": "Half of 144?", "answer": 72},
]


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("<think>3 + 4 = 7</think> \\boxed{7}", "7", 1.0),
        ("<think>so 7</think>The answer is \\boxed{7.0}.", "7", 1.0),
        ("<think>half</think> \\boxed{\\frac{144}{2}}", "72", 1.0),
        ("<think>money</think> \\boxed{1,500}", "1500", 1.0),
        ("<think>units</think> \\boxed{12 \\text{ dollars}}", "12", 1.0),
        ("no think block, just \\boxed{7}", "7", 1.0),
        ("<think>3 + 4 = 8</think> \\boxed{8}", "7", -1.0),
        ("<think>I guess \\boxed{7}</think> \\boxed{9}", "7", -1.0),
        ("<think>7</think> the answer is 7", "7", -1.0),
        ("", "7", -1.0),
        ("\\boxed{}", "7", -1.0),
    ],
)
def test_scoring_known_answers(completion: str, answer: str, expected: float) -> None:
    assert score_completion(completion, answer) == expected


def test_reference_answer_takes_the_number_after_hashes() -> None:
    assert reference_answer("Janet sells 16 - 3 - 4 = 9 eggs.\n#### 1,018") == "1018"
    assert reference_answer("42") == "42"


def write_fixture(path: Path) -> Path:
    lines = [json.dumps(p) for p in PROBLEMS[:2]]
    lines += ["{not json", json.dumps({"question": "no answer"}), "[1, 2]", ""]
    lines += [json.dumps(p) for p in PROBLEMS[2:]]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bad_data_lines_are_reported_with_line_numbers_and_skipped(tmp_path: Path) -> None:
    data = write_fixture(tmp_path / "gsm8k.jsonl")
    problems, bad = read_jsonl(data)
    assert [p.answer for p in problems] == ["7", "12", "1500", "72"]
    assert [line.split(": ", 1)[0] for line in bad] == [f"{data}:{n}" for n in (3, 4, 5)]
    assert "not JSON" in bad[0] and "'answer'" in bad[1] and "expected an object" in bad[2]
    task = Gsm8k(data_file=data)
    assert [p.answer for p in task.eval_prompts(10)] == ["72"]
    prompt = task.prompt(task.train[0])
    assert prompt.messages[0]["role"] == "system" and "\\boxed" in prompt.messages[0]["content"]
    assert prompt.messages[1] == {"role": "user", "content": PROBLEMS[0]["question"]}
    assert task.truncated_score == -1.0


def test_data_file_without_usable_lines_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text("{oops\n")
    with pytest.raises(ValueError, match="0 usable problem"):
        Gsm8k(data_file=data)


def test_offline_run_over_a_jsonl_fixture(spawn, tmp_path, tiny_model, inference) -> None:
    """The untrained tiny model never boxes the right answer: every group scores -1 and is
    dropped by the equal-score rule (counted), evaluation reports pass@2 = 0, bad lines are
    logged with their numbers, and SIGTERM ends the process cleanly."""
    data = write_fixture(tmp_path / "gsm8k.jsonl")
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    spawn("api", api_argv(port, tmp_path / "rollouts.db")).wait_http(f"{api}/health")
    trainer = Trainer(api, batch_size=4, max_token_len=512)
    trainer.register()
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs.gsm8k", api, inference, tiny_model, "--group-size", "2",
                 "--max-tokens", "8", "--data-file", str(data), "--eval-every", "1",
                 "--eval-k", "2", "--max-concurrency", "2"),
    )  # fmt: skip
    env.wait_line("grpo-env registered")
    for number in (3, 4, 5):
        assert f"bad data line skipped: {data}:{number}:" in env.text()
    env.wait_line(r"eval/mean@2=0 eval/pass@2=0")
    env.wait_line(r"env/groups_dropped_equal_scores=[1-9]")
    env.send_signal(signal.SIGTERM)
    assert env.wait(timeout=30) == 0
    assert trainer.status()["queue_size"] == 0
    trainer.close()
