"""The rollout API holds environments while inference serves no weights the trainer pushed.

The supervisor's stack writes ``inference.json`` (incarnation, up) in the run directory;
the trainer reports each sync's version with the served name and the incarnation it pushed
to. From "down" until the trainer reports the incarnation that is up, ``/status-env`` says
``pause`` (``inference_held``): nothing is sampled from a restarted server's stale weights.
A long-polling environment is answered the moment the hold ends. A trainer that reports no
incarnation (an Atropos trainer) is never waited for.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from api_helpers import ApiServer, start_run

from grpo_trainer.control import RUN_DIR_ENV
from grpo_trainer.run_notices import INFERENCE_FILE, InferenceLife, write_notice


def test_environments_wait_from_inference_down_until_the_trainer_pushed_to_its_restart(
    start_api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    life = tmp_path / INFERENCE_FILE
    write_notice(life, InferenceLife(incarnation=1, up=True))
    server: ApiServer = start_api()
    with server.client() as api:
        env = start_run(api)["toy"]

        def status() -> dict:
            return api.get("/status-env", params={"env_id": env}).json()

        assert status()["pause"] is False  # nothing reported yet: nobody to wait for
        body = {"version": 4, "model": "policy-step4-ab120", "incarnation": 1}
        assert api.post("/served-version", json=body).status_code == 200
        assert (status()["served_model"], status()["pause"]) == ("policy-step4-ab120", False)

        write_notice(life, InferenceLife(incarnation=1, up=False))
        assert (status()["inference_held"], status()["pause"]) == (True, True)
        write_notice(life, InferenceLife(incarnation=2, up=True))
        assert status()["inference_held"] is True, "up again, but not on the trainer's weights"
        told = api.get("/status").json()  # what the supervisor's stall watchdog reads
        assert (told["inference_held"], told["served_incarnation"]) == (True, 1)
        with server.client() as waiter, ThreadPoolExecutor(1) as pool:
            asked = time.monotonic()
            waiting = pool.submit(
                lambda: waiter.get("/status-env", params={"env_id": env, "wait": 20}).json()
            )
            api.post("/served-version", json={**body, "incarnation": 2})
            answer = waiting.result(timeout=30)
        assert answer["pause"] is False and answer["inference_held"] is False
        assert time.monotonic() - asked < 20, "the long poll ended with the hold, not its wait"

        write_notice(life, InferenceLife(incarnation=2, up=False))
        api.post("/served-version", json={"version": 5})  # no incarnation: an older trainer
        assert status()["inference_held"] is True, "the last reported incarnation still counts"
