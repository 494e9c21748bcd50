"""In-process pieces of the environment runner: alignment, answer validation, the torch-free
tokenizer, the settings <-> command line round trip, and the toy reward."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from grpo_trainer.envs.base import Connection, EnvRunner
from grpo_trainer.envs.cli import parse
from grpo_trainer.envs.evaluation import pass_and_mean_at_k
from grpo_trainer.envs.groups import build_group
from grpo_trainer.envs.inference import (
    BadCompletion,
    Sample,
    SamplingRequest,
    complete,
    parse_samples,
)
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.envs.task import Prompt
from grpo_trainer.envs.tokenizer import FastTokenizer
from grpo_trainer.envs.toy import RepeatDigit
from grpo_trainer.live_edits import record_edit


def test_group_alignment_position_by_position() -> None:
    samples = [Sample([7, 8], [-0.5, -0.25], "length"), Sample([9], [-1.5], "stop")]
    group = build_group([1, 2, 3], samples, [1, 0], temperature=0.9, policy_version=4)
    assert group.tokens == [[1, 2, 3, 7, 8], [1, 2, 3, 9]]
    assert group.masks == [[-100, -100, -100, 7, 8], [-100, -100, -100, 9]]
    assert group.inference_logprobs == [[1.0, 1.0, 1.0, -0.5, -0.25], [1.0, 1.0, 1.0, -1.5]]
    assert group.payload(3) == {
        "tokens": group.tokens,
        "masks": group.masks,
        "scores": [1.0, 0.0],
        "inference_logprobs": group.inference_logprobs,
        "generation_params": {"temperature": 0.9},
        "policy_version": 4,
        "env_id": 3,
    }
    assert not group.equal_scores and group.longest == 5


def _answer(choices: list[dict]) -> bytes:
    return json.dumps({"choices": choices}).encode()


def _choice(index: int, ids: list[int], logprobs: list) -> dict:
    return {"index": index, "token_ids": ids, "logprobs": {"token_logprobs": logprobs},
            "finish_reason": "length"}  # fmt: skip


def test_parse_samples_orders_by_index() -> None:
    samples = parse_samples(_answer([_choice(1, [5], [-1.0]), _choice(0, [4], [-2.0])]), [[3]] * 2)
    assert [s.token_ids for s in samples] == [[4], [5]]
    assert samples[0].truncated


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"<html>oops</html>", "malformed"),
        (_answer([_choice(0, [4], [-1.0])]), "asked for 2 completions, got 1"),
        (_answer([{"index": 0, "logprobs": {"token_logprobs": [-1.0]}}] * 2), "no token_ids"),
        (_answer([_choice(0, [4, 5], [-1.0])] * 2), "1 logprobs for 2 tokens"),
        (_answer([_choice(0, [4], [None])] * 2), "logprob None"),
        (_answer([_choice(0, [4], [0.5])] * 2), "logprob 0.5"),
        (_answer([_choice(0, [], [])] * 2), "empty completion"),
        (_answer([{"index": 0, "token_ids": [4]}] * 2), "no logprobs"),
        (_answer([_choice(0, [4], [-1.0]), _choice(2, [4], [-1.0])]), "index 2 is not below 2"),
        (
            _answer(
                [_choice(0, [4], [-1.0]), {**_choice(1, [4], [-1.0]), "prompt_token_ids": [3]}]
            ),
            "choice 1 answers another prompt",
        ),
    ],
)
def test_parse_samples_rejects_garbage_with_reason(content: bytes, reason: str) -> None:
    with pytest.raises(BadCompletion, match=reason):
        parse_samples(content, [[3], [9]])


def test_fast_tokenizer_matches_transformers(tiny_model: Path) -> None:
    from grpo_trainer.models import load_tokenizer

    fast = FastTokenizer.from_dir(tiny_model)
    reference = load_tokenizer(tiny_model)
    for text in ["repeat 7:", "abc 123\nxyz:", " two  spaces\n\n"]:
        assert fast.encode(text) == reference.encode(text, add_special_tokens=False)
    ids = [*reference.encode("ab 3", add_special_tokens=False), reference.eos_token_id]
    assert fast.decode(ids) == reference.decode(ids, skip_special_tokens=True) == "ab 3"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2"}]
    assert fast.render_chat(messages) == reference.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )


def test_settings_command_round_trips_through_the_cli(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    settings = EnvSettings(
        name="math",
        task="gsm8k", group_size=4, seed=9, max_tokens=300, temperature=0.8, eval_every=5,
        eval_k=4, data_file=data, weight=2.0, min_batch_allocation=0.25, max_concurrency=3,
        groups_per_request=3, ignore_eos=True, prompt_copies=True,
    )  # fmt: skip
    argv = settings.command(
        api_url="http://127.0.0.1:8000", inference_url="http://127.0.0.1:9001",
        tokenizer="/m", api_token="secret",
    )  # fmt: skip
    assert argv[:3] == [sys.executable, "-m", "grpo_trainer.envs.gsm8k"]
    from grpo_trainer.envs.gsm8k import Gsm8k

    parsed, connection, tokenizer = parse(argv[3:], Gsm8k)
    assert parsed == settings
    assert (connection.api_url, connection.api_token, tokenizer) == (
        "http://127.0.0.1:8000", "secret", "/m"
    )  # fmt: skip


def test_user_task_command_uses_the_generic_runner() -> None:
    settings = EnvSettings(task="my_tasks.reverse:Reverse")
    argv = settings.command(api_url="a", inference_url="b", tokenizer="t")
    assert argv[2:5] == ["grpo_trainer.envs", "--task", "my_tasks.reverse:Reverse"]
    assert settings.registered_name == "Reverse"


def test_bad_settings_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--api-url", "a", "--inference-url", "b", "--tokenizer", "t",
               "--group-size", "1"], RepeatDigit)  # fmt: skip
    assert exc.value.code == 2
    assert "--group-size" in capsys.readouterr().err
    with pytest.raises(ValueError, match="neither a built-in task"):
        EnvSettings(task="not a task")
    for bad in (8, 3):
        with pytest.raises(ValueError, match=f"{bad} does not divide max_concurrency 4"):
            EnvSettings(max_concurrency=4, groups_per_request=bad)
    assert EnvSettings(max_concurrency=8, groups_per_request=4).workers == 2


def test_toy_reward_gives_partial_credit() -> None:
    task = RepeatDigit()
    prompt = Prompt(text="repeat 7:", answer="7")
    assert task.score(prompt, "777777") == 1.0
    assert task.score(prompt, "77a7") == pytest.approx(3 / 6)
    assert task.score(prompt, "7777777777") == 1.0
    assert task.score(prompt, "") == 0.0
    assert math.isclose(task.score(prompt, "x7"), 1 / 6)
    assert [p.answer for p in task.eval_prompts(32)] == list("0123456789")


async def test_back_pressure_rule_for_our_api_and_for_atropos(tiny_model: Path) -> None:
    settings = EnvSettings(group_size=8)
    runner = EnvRunner(
        RepeatDigit(), settings, Connection("http://127.0.0.1:9", "http://127.0.0.1:9"),
        FastTokenizer.from_dir(tiny_model),
    )  # fmt: skip
    runner.api.batch_size = 64
    assert runner.room.queue_full({"pause": True, "queue_size": 0})
    assert not runner.room.queue_full({"pause": False, "queue_size": 1000})
    assert not runner.room.queue_full({"queue_size": 23})  # Atropos: 23 * 8 < 3 * 64
    assert runner.room.queue_full({"queue_size": 24})
    await runner.aclose()


@pytest.mark.parametrize(
    "module",
    ["grpo_trainer.envs.settings", "grpo_trainer.envs.cli", "grpo_trainer.envs.toy",
     "grpo_trainer.envs.gsm8k", "grpo_trainer.envs.base"],
)  # fmt: skip
def test_environment_modules_stay_light(module: str) -> None:
    """No torch, transformers or textual: settings load fast for ``grpo-tui check`` and an
    environment process starts in well under a second."""
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "heavy = {m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'textual'}; "
        "print(sorted(heavy)); sys.exit(1 if heavy else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, f"{module} imports {proc.stdout.strip()} {proc.stderr[-500:]}"


def test_pass_and_mean_at_k() -> None:
    rows = [[True, False, False, False], [False] * 4, [True] * 4]
    assert pass_and_mean_at_k(rows, 4) == {
        "eval/pass@4": pytest.approx(2 / 3),
        "eval/mean@4": pytest.approx((0.25 + 0 + 1) / 3),
    }
    with pytest.raises(ValueError, match="no evaluated prompts"):
        pass_and_mean_at_k([], 4)


async def test_a_temperature_edit_reaches_the_next_group(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sampling and the group's recorded temperature change together, at a group boundary."""
    monkeypatch.setenv("GRPO_TUI_RUN_DIR", str(tmp_path))  # as the supervisor sets it
    runner = EnvRunner(
        RepeatDigit(), EnvSettings(group_size=2, temperature=1.0),
        Connection("http://127.0.0.1:9", "http://127.0.0.1:9"), FastTokenizer.from_dir(tiny_model),
    )  # fmt: skip
    runner.sampling.take_edits()
    assert runner.sampling.request(2).temperature == 1.0
    record_edit(tmp_path, {"temperature": 0.7, "lr": 1e-4})  # lr: the trainer's, not ours
    runner.sampling.take_edits()
    assert runner.sampling.request(2).temperature == 0.7
    assert runner.settings.temperature == 0.7
    await runner.aclose()


@pytest.mark.parametrize("copies", [False, True])
async def test_a_group_is_sampled_as_n_or_as_n_prompt_copies(inference: str, copies: bool) -> None:
    """``prompt_copies`` (SGLang's adapter unload hangs after n > 1 requests) asks a real
    server for the group as n copies of the prompt, one sample each: the same n samples."""
    sent: list[dict] = []

    async def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    request = SamplingRequest(model="policy", n=4, max_tokens=5, temperature=1.0, copies=copies)
    async with httpx.AsyncClient(base_url=inference, event_hooks={"request": [record]}) as client:
        (samples,) = await complete(client, [[5, 6, 7]], request)
    assert len(samples) == 4 and all(s.token_ids and len(s.logprobs) == len(s.token_ids)
                                     for s in samples)  # fmt: skip
    expected = ([[5, 6, 7]] * 4, 1) if copies else ([5, 6, 7], 4)
    assert [(body["prompt"], body["n"]) for body in sent] == [expected]


@pytest.mark.parametrize("copies", [False, True])
async def test_several_groups_go_in_one_request(inference: str, copies: bool) -> None:
    """``groups_per_request``: one request holds every prompt (a list of token-id lists, as
    vLLM takes it) and its answer comes back split per prompt, each group's n samples
    from its own prompt (the server names each choice's prompt; a mix-up is refused)."""
    sent: list[dict] = []

    async def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    request = SamplingRequest(model="policy", n=3, max_tokens=5, temperature=1.0, copies=copies)
    async with httpx.AsyncClient(base_url=inference, event_hooks={"request": [record]}) as client:
        groups = await complete(client, prompts, request)
    assert [len(samples) for samples in groups] == [3, 3, 3]
    assert all(s.token_ids and len(s.logprobs) == len(s.token_ids) for g in groups for s in g)
    expected = ([p for p in prompts for _ in range(3)], 1) if copies else (prompts, 3)
    assert [(body["prompt"], body["n"]) for body in sent] == [expected]
