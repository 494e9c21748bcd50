"""Sleep mode of the built-in server (vLLM's ``/sleep``, ``/wake_up``, ``/is_sleeping``).

A real server started as the role layer starts it in ``colocate`` (shared weights, sleep
mode on), real HTTP, concurrent requests: requests that arrive while it sleeps wait and are
all served after the wake-up; a request running when ``/sleep`` comes finishes first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serve_helpers import MAX_MODEL_LEN, completion, free_port

from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings

WAITERS = 6
TOKENS = 8


@pytest.fixture(scope="module")
def colocate_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[ServerProcess]:
    settings = InferenceSettings(port=free_port(), max_model_len=MAX_MODEL_LEN)
    run_dir = tmp_path_factory.mktemp("colocate")
    launch = inference_command(
        settings,
        mode="colocate",
        model=str(tiny_model_dir),
        shared_dir=str(run_dir / "shared_weights"),
    )
    assert "--enable-sleep-mode" in launch.argv
    process = ServerProcess(launch, settings.base_url, run_dir / "server.log")
    process.start()
    yield process
    process.stop()


def complete(url: str, prompt: str, max_tokens: int = TOKENS) -> dict:
    return completion(url, prompt, max_tokens, n=2)


def sleep_status(http: httpx.Client) -> dict:
    response = http.get("/is_sleeping")
    assert response.status_code == 200, response.text
    return response.json()


def wait_for(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_requests_during_sleep_wait_and_are_all_served_after_wake_up(
    colocate_server: ServerProcess,
) -> None:
    url = colocate_server.base_url
    with httpx.Client(base_url=url, timeout=60) as http, ThreadPoolExecutor(WAITERS) as pool:
        assert sleep_status(http)["is_sleeping"] is False
        slept = http.post("/sleep", params={"level": 1})
        assert slept.status_code == 200, slept.text
        assert slept.json()["status"] == "sleeping"
        assert sleep_status(http)["is_sleeping"] is True

        futures: list[Future[dict]] = [
            pool.submit(complete, url, f"prompt {i}") for i in range(WAITERS)
        ]
        wait_for(lambda: sleep_status(http)["waiting"] == WAITERS, "all requests held")
        assert http.get("/health").status_code == 200  # asleep is not unhealthy
        assert not any(f.done() for f in futures), "a request was served while asleep"

        # vLLM's partial wake-up: generation resumes only once every tag is awake.
        partial = http.post("/wake_up", params={"tags": "weights"})
        assert partial.status_code == 200, partial.text
        status = sleep_status(http)
        assert status["is_sleeping"] is True and status["asleep"] == ["kv_cache"]
        assert status["waiting"] == WAITERS
        assert not any(f.done() for f in futures)

        woke = http.post("/wake_up", params={"tags": "kv_cache"})
        assert woke.status_code == 200 and woke.json()["status"] == "awake"
        answers = [f.result(timeout=120) for f in futures]
    assert len(answers) == WAITERS
    for answer in answers:
        assert [len(c["token_ids"]) for c in answer["choices"]] == [TOKENS, TOKENS]
        assert {c["finish_reason"] for c in answer["choices"]} == {"length"}


def test_sleep_lets_a_running_request_finish_first(colocate_server: ServerProcess) -> None:
    url = colocate_server.base_url
    long_tokens = MAX_MODEL_LEN - 8
    with httpx.Client(base_url=url, timeout=60) as http, ThreadPoolExecutor(1) as pool:
        running = pool.submit(complete, url, "abc", long_tokens)
        # /metrics counts running requests the way vLLM does; wait until ours runs.
        wait_for(
            lambda: 'vllm:num_requests_running{model_name="policy"} 1' in http.get("/metrics").text,
            "the long request to start",
        )
        try:
            slept = http.post("/sleep", params={"level": 2})
            assert slept.status_code == 200, slept.text
            # /sleep returned, so the engine had finished the request (its answer may
            # still be on the wire), whole: not aborted, not cut short.
            assert 'vllm:num_requests_running{model_name="policy"} 0' in http.get("/metrics").text
            answer = running.result(timeout=60)
            assert [len(c["token_ids"]) for c in answer["choices"]] == [long_tokens] * 2
        finally:
            assert http.post("/wake_up").json()["status"] == "awake"
        assert sleep_status(http)["is_sleeping"] is False


def test_bad_sleep_requests_get_400_and_the_server_stays_healthy(
    colocate_server: ServerProcess, client: httpx.Client
) -> None:
    with httpx.Client(base_url=colocate_server.base_url, timeout=60) as http:
        level = http.post("/sleep", params={"level": 3})
        assert level.status_code == 400 and "level must be 1 or 2" in level.text
        tag = http.post("/wake_up", params={"tags": "gpu"})
        assert tag.status_code == 400 and "unknown tags ['gpu']" in tag.text
        assert sleep_status(http)["is_sleeping"] is False
        complete(colocate_server.base_url, "still serving")
    # The shared LoRA server was started without --enable-sleep-mode, as vLLM would be.
    off = client.post("/sleep")
    assert off.status_code == 400 and "--enable-sleep-mode" in off.text
    assert client.get("/health").status_code == 200
