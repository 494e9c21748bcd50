"""The real API takes a live ``max_batches_offpolicy`` edit at the next ``/status-env``
(or ``/scored_data?env_status=true``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_helpers import group, start_run

from grpo_trainer.live_edits import record_edit


def test_max_batches_offpolicy_edit_pauses_environments_sooner(
    start_api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("GRPO_TUI_RUN_DIR", str(run_dir))  # as the supervisor sets it
    server = start_api("--max-batches-offpolicy", "3")
    with server.client() as client:
        ids = start_run(client, batch_size=8)
        client.post("/scored_data_list", json=[group(i, env_id=ids["toy"]) for i in range(2)])
        status = client.get("/status-env", params={"env_id": ids["toy"]}).json()
        assert (status["queued_batches"], status["max_batches_offpolicy"]) == (1.0, 3)
        assert status["pause"] is False

        record_edit(run_dir, {"max_batches_offpolicy": 1})
        status = client.get("/status-env", params={"env_id": ids["toy"]}).json()
        assert status["max_batches_offpolicy"] == 1 and status["pause"] is True

        # a post asking for its environment's status takes the next edit just the same
        record_edit(run_dir, {"max_batches_offpolicy": 2})
        answer = client.post(
            "/scored_data", json=group(3, env_id=ids["toy"]), params={"env_status": "true"}
        ).json()
        posted = answer["env_status"]
        assert (posted["queued_batches"], posted["max_batches_offpolicy"]) == (1.5, 2)
        assert posted["pause"] is False
        assert posted == client.get("/status-env", params={"env_id": ids["toy"]}).json()


def test_zero_bound_is_synchronous_environments_wait_for_the_ack(start_api) -> None:
    server = start_api("--max-batches-offpolicy", "0")
    with server.client() as client:
        ids = start_run(client, batch_size=8)

        def pause() -> bool:
            return client.get("/status-env", params={"env_id": ids["toy"]}).json()["pause"]

        client.post("/scored_data_list", json=[group(1, env_id=ids["toy"])])
        assert pause() is False  # half a batch: keep producing
        client.post("/scored_data_list", json=[group(2, env_id=ids["toy"])])
        assert pause() is True  # one whole batch queued
        leased = client.get("/batch", params={"lease": 60}).json()
        assert leased["batch_id"] and client.get("/status").json()["queue_size"] == 0
        assert pause() is True  # queue empty, but the trainer still trains on the batch
        client.post("/batch/ack", json={"batch_id": leased["batch_id"]})
        assert pause() is False  # acknowledged: the next batch is generated on new weights
