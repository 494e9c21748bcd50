"""The toy environment against the real rollout API and the real built-in inference server:
groups arrive aligned (checked field by field, logprobs recomputed from the model), and
back-pressure pauses production until the trainer takes a batch."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from env_procs import (
    Proc,
    Trainer,
    api_argv,
    env_argv,
    free_port,
    last_env_metrics,
    wait_until,
)

from grpo_trainer.envs.base import Connection, EnvRunner
from grpo_trainer.envs.groups import build_group
from grpo_trainer.envs.inference import Sample
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.envs.task import Prompt
from grpo_trainer.envs.tokenizer import FastTokenizer
from grpo_trainer.envs.toy import RepeatDigit
from grpo_trainer.models import load_model, load_tokenizer

TEMPERATURE = 0.7
GROUP = 8


def start_api(spawn: Callable[[str, list[str]], Proc], tmp_path: Path, *extra: str) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spawn("api", api_argv(port, tmp_path / "rollouts.db", *extra)).wait_http(f"{url}/health")
    return url


@pytest.mark.parametrize("per_request", [1, 2])
def test_groups_arrive_aligned_field_by_field(
    spawn, tmp_path, tiny_model, inference, per_request
) -> None:
    """Also with two groups to a request (``groups_per_request``): each group's logprobs,
    recomputed from its own prompt, show that no completion went to another prompt."""
    api = start_api(spawn, tmp_path)
    trainer = Trainer(api, batch_size=2 * GROUP)
    trainer.register()
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs.toy", api, inference, tiny_model, "--group-size",
                 str(GROUP), "--max-groups", "4", "--temperature", str(TEMPERATURE),
                 "--max-concurrency", "2", "--seed", "3", "--groups-per-request", str(per_request)),
    )  # fmt: skip
    assert env.wait(timeout=120) == 0, env.text()[-3000:]
    assert "grpo-env registered" in env.text()
    groups = trainer.take() + trainer.take()
    assert len(groups) == 4
    assert trainer.take() == []
    assert last_env_metrics(env.text())["env/groups_sent"] == 4

    tokenizer = load_tokenizer(tiny_model)
    model = load_model(tiny_model).eval()
    task = RepeatDigit()
    for group in groups:
        assert group["generation_params"] == {"temperature": TEMPERATURE}
        assert group["policy_version"] == 0
        assert isinstance(group["env_id"], int)
        assert len(group["tokens"]) == len(group["masks"]) == GROUP
        assert len(group["scores"]) == len(group["inference_logprobs"]) == GROUP
        assert len(set(group["scores"])) > 1, "equal-score groups must not be sent"
        prompt_text = tokenizer.decode(group["tokens"][0][:9])
        assert prompt_text.startswith("repeat ") and prompt_text.endswith(":")
        prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
        plen = len(prompt_ids)
        for tokens, masks, logprobs, score in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], group["scores"],
            strict=True,
        ):  # fmt: skip
            assert tokens[:plen] == prompt_ids
            assert 1 <= len(tokens) - plen <= task.default_max_tokens
            assert len(masks) == len(logprobs) == len(tokens)
            assert masks[:plen] == [-100] * plen
            assert masks[plen:] == tokens[plen:]
            assert logprobs[:plen] == [1.0] * plen
            completion = tokens[plen:]
            with torch.no_grad():
                logits = model(torch.tensor([tokens])).logits[0, plen - 1 : -1] / TEMPERATURE
            expected = torch.log_softmax(logits.float(), -1)[range(len(completion)), completion]
            assert logprobs[plen:] == pytest.approx(expected.tolist(), abs=1e-4)
            text = tokenizer.decode(completion, skip_special_tokens=True)
            answer = prompt_text.removeprefix("repeat ").removesuffix(":")
            assert score == task.score(Prompt(text=prompt_text, answer=answer), text)
    trainer.close()


def test_back_pressure_pauses_production(spawn, tmp_path, tiny_model, inference) -> None:
    api = start_api(spawn, tmp_path, "--max-batches-offpolicy", "1")
    trainer = Trainer(api, batch_size=2 * GROUP)
    trainer.register()
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs.toy", api, inference, tiny_model, "--group-size",
                 str(GROUP), "--max-concurrency", "2"),
    )  # fmt: skip
    env.wait_line(r"queue full \(1\.\d+ batches queued\); pausing")
    bound = 2 * GROUP + 2 * GROUP  # one batch, plus the two groups that may be in flight
    window_end = time.monotonic() + 2.0
    while time.monotonic() < window_end:  # sample the queue over a window: it must not grow
        assert trainer.status()["queue_sequences"] <= bound
        time.sleep(0.1)
    paused_at = trainer.status()["queue_sequences"]
    resumed = env.text().count("producing")  # before the take: the env may resume at once
    taken = trainer.take()
    assert len(taken) == 2
    wait_until(lambda: env.text().count("producing") > resumed, 30, "production to resume")
    wait_until(lambda: trainer.status()["queue_sequences"] >= 2 * GROUP, 60, "the queue to refill")
    assert paused_at <= bound
    trainer.close()


def test_env_registers_again_after_an_api_reset(spawn, tmp_path, tiny_model, inference) -> None:
    """``GET /reset_data`` forgets every environment: ours notices (404 on /status-env),
    waits for the trainer to register again, and resumes under its new env_id."""
    api = start_api(spawn, tmp_path)
    trainer = Trainer(api, batch_size=GROUP)
    trainer.register()
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs.toy", api, inference, tiny_model, "--group-size",
                 str(GROUP), "--max-concurrency", "2", "--name", "toy"),
    )  # fmt: skip
    wait_until(lambda: trainer.status()["queue_size"] >= 1, 60, "a first group")
    assert trainer.client.get("/reset_data").status_code == 200
    env.wait_line("registering again: /status-env answered 404")
    trainer.register()
    ids = wait_until(
        lambda: [int(i) for i in re.findall(r"registered as env_id=(\d+)", env.text())][1:],
        60, "the second registration",
    )  # fmt: skip
    wait_until(lambda: trainer.status()["queue_size"] >= 1, 60, "a group after the reset")
    assert {g["env_id"] for g in trainer.take()} == {ids[0]}
    assert env.text().count("registering again") == 1, "every worker registered on its own"
    trainer.close()


class CountingTransport(httpx.AsyncHTTPTransport):
    """Real HTTP, counting requests per path (to see which requests the runner makes)."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await super().handle_async_request(request)


async def test_status_returned_with_a_post_saves_the_next_status_request(
    spawn, tmp_path, tiny_model
) -> None:
    """Our API answers a post with the queue status; the runner uses it for the next group
    while it shows room, and asks ``/status-env`` again once it shows a full queue."""
    api = start_api(spawn, tmp_path, "--max-batches-offpolicy", "1")
    trainer = Trainer(api, batch_size=4)
    trainer.register()
    runner = EnvRunner(
        RepeatDigit(), EnvSettings(group_size=2), Connection(api, "http://127.0.0.1:9"),
        FastTokenizer.from_dir(tiny_model),
    )  # fmt: skip
    counting = CountingTransport()
    await runner.api.http.aclose()
    runner.api.http = httpx.AsyncClient(base_url=api, transport=counting, timeout=10.0)
    samples = [Sample([7, 8], [-0.5, -0.25], "stop"), Sample([9], [-1.5], "stop")]
    group = build_group([1, 2, 3], samples, [1, 0], temperature=1.0, policy_version=0)
    try:
        assert await runner.api.register() is not None
        model = runner.settings.model_name  # no served name reported: the env's own
        assert await runner.room.wait() == (0, model)
        assert await runner.room.post([group])  # half a batch queued: room left
        assert await runner.room.wait() == (0, model)
        assert counting.paths.count("/status-env") == 1
        assert await runner.room.post([group])  # one whole batch queued: the bound
        runner.room.poll = 0.05
        waiting = asyncio.create_task(runner.room.wait())

        async def asked_again() -> None:
            while counting.paths.count("/status-env") < 2:
                await asyncio.sleep(0.01)

        async with asyncio.timeout(30):
            await asked_again()
        assert not waiting.done()  # the full queue was asked about, not assumed
        assert len(trainer.take()) == 2
        async with asyncio.timeout(30):
            assert await waiting == (1, model)
    finally:
        runner.stop()
        await runner.aclose()
        trainer.close()


class RecordingTransport(httpx.AsyncHTTPTransport):
    """Real HTTP, recording each request's path and how many groups or prompts it held."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        if request.url.path == "/v1/completions":
            held = len(body["prompt"]) if isinstance(body["prompt"][0], list) else 1
        else:
            held = len(body) if isinstance(body, list) else 1
        self.sent.append((request.url.path, held))
        return await super().handle_async_request(request)


async def test_a_request_carries_groups_per_request_groups_and_they_post_together(
    spawn, tmp_path, tiny_model, inference
) -> None:
    """``groups_per_request = 4``: each completions request asks for 4 prompts' groups, and
    the groups of one request that survive the drop rules go in one ``/scored_data_list``
    post (one queue commit): a quarter of the requests of one group at a time."""
    api = start_api(spawn, tmp_path)
    trainer = Trainer(api, batch_size=8 * GROUP)
    trainer.register()
    settings = EnvSettings(group_size=GROUP, max_concurrency=4, groups_per_request=4)
    runner = EnvRunner(
        RepeatDigit(), settings, Connection(api, inference), FastTokenizer.from_dir(tiny_model)
    )
    to_api, to_inference = RecordingTransport(), RecordingTransport()
    await runner.aclose()
    runner.api.http = httpx.AsyncClient(base_url=api, transport=to_api, timeout=30.0)
    runner.sampling.inference = httpx.AsyncClient(
        base_url=inference, transport=to_inference, timeout=60.0
    )
    running = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(120):
            while (await asyncio.to_thread(trainer.status))["queue_size"] < 8:
                await asyncio.sleep(0.05)
    finally:
        runner.stop()
        stats = await running
        trainer.close()
    requests = [held for path, held in to_inference.sent if path == "/v1/completions"]
    assert requests and set(requests) == {4}
    counts = stats.counts
    scored = sum(counts[k] for k in ("groups_sent", "groups_dropped_equal_scores",
                                     "groups_dropped_too_long"))  # fmt: skip
    assert scored == 4 * len(requests)
    posts = [(path, held) for path, held in to_api.sent if path.startswith("/scored_data")]
    assert sum(held for _, held in posts) == counts["groups_sent"] >= 8
    assert len(posts) <= len(requests)
    assert all(path == ("/scored_data_list" if held > 1 else "/scored_data")
               for path, held in posts)  # fmt: skip


def test_groups_are_tagged_with_the_served_version_not_the_step(
    spawn, tmp_path, tiny_model, inference
) -> None:
    """Between syncs (``sync_every`` > 1) the step runs ahead of the weights inference
    serves: a group is tagged with the version the trainer last reported as served."""
    api = start_api(spawn, tmp_path)
    trainer = Trainer(api, batch_size=2 * GROUP)
    body = {"batch_size": 2 * GROUP, "max_token_len": 64, "num_steps": 1000, "starting_step": 7}
    assert trainer.client.post("/register", json=body).status_code == 200
    assert trainer.client.get("/batch").status_code == 200  # marks the trainer started
    assert trainer.client.post("/served-version", json={"version": 4}).status_code == 200
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs.toy", api, inference, tiny_model, "--group-size",
                 str(GROUP), "--max-groups", "2", "--max-concurrency", "1"),
    )  # fmt: skip
    assert env.wait(timeout=120) == 0, env.text()[-3000:]
    groups = trainer.take()
    assert [g["policy_version"] for g in groups] == [4, 4]
    trainer.close()
