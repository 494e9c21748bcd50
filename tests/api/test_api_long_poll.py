"""Long polls: ``GET /batch?wait=`` and ``GET /status-env?wait=`` answer when the queue changes.

Each request is sent before the change that it waits for; without the long poll it would
answer at once with the old state (no batch, a paused queue).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from api_helpers import group, markers, start_run


def test_batch_wait_answers_with_groups_posted_while_waiting(api: httpx.Client) -> None:
    start_run(api)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(api.get, "/batch", params={"lease": 60, "wait": 30})
        for marker in (1, 2):
            assert api.post("/scored_data", json=group(marker)).status_code == 200
        answer = waiting.result().json()
    assert markers(answer["batch"]) == [1, 2]
    assert "batch_id" in answer


def test_batch_wait_ends_empty_when_nothing_comes(api: httpx.Client) -> None:
    start_run(api)
    assert api.get("/batch", params={"wait": 0.2}).json() == {"batch": None}
    assert api.get("/batch", params={"wait": 61}).status_code == 422


def test_status_env_wait_answers_once_the_queue_has_room(start_api) -> None:
    server = start_api("--max-batches-offpolicy", "1")
    with server.client() as client, server.client() as env:
        env_id = start_run(client)["toy"]
        for marker in (1, 2):
            assert client.post("/scored_data", json=group(marker)).status_code == 200
        assert env.get("/status-env", params={"env_id": env_id}).json()["pause"] is True
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(env.get, "/status-env", params={"env_id": env_id, "wait": 30})
            assert markers(client.get("/batch").json()["batch"]) == [1, 2]
            status = waiting.result().json()
    assert status["pause"] is False
    assert status["queue_size"] == 0
