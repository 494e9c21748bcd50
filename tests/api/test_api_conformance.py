"""Every Atropos endpoint and field, over real HTTP against the real server process."""

from __future__ import annotations

import gzip
import json
import time

import httpx
from api_helpers import TRAINER, ApiServer, env_registration, group, markers, start_run


def test_root_and_health(api: httpx.Client) -> None:
    assert api.get("/").json() == {"message": "AtroposLib API"}
    assert api.get("/health").json() == {"status": "ok"}


def test_info_and_wandb_info_before_and_after_register(api: httpx.Client) -> None:
    assert api.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert api.get("/wandb_info").json()["group"] is None
    uuid_a = api.post("/register", json=TRAINER).json()["uuid"]
    uuid_b = api.post("/register", json=TRAINER).json()["uuid"]
    assert isinstance(uuid_a, int) and uuid_a != uuid_b
    assert api.get("/info").json() == {"batch_size": 8, "max_token_len": 32}
    wandb = api.get("/wandb_info").json()
    assert (wandb["group"], wandb["project"]) == ("grp", "proj")


def test_register_env_waits_for_the_trainers_first_batch_request(api: httpx.Client) -> None:
    assert api.post("/register-env", json=env_registration()).json() == {
        "status": "wait for trainer to start"
    }
    api.post("/register", json=TRAINER)
    assert api.post("/register-env", json=env_registration()).json()["status"] == (
        "wait for trainer to start"
    )
    assert api.get("/batch").json() == {"batch": None}
    first = api.post("/register-env", json=env_registration("toy")).json()
    second = api.post("/register-env", json=env_registration("toy")).json()
    other = api.post("/register-env", json={**env_registration("math"), "weight": -1}).json()
    assert first == {
        "status": "success",
        "env_id": 0,
        "wandb_name": "toy_0",
        "checkpoint_dir": "/tmp/ckpt",
        "starting_step": 0,
        "checkpoint_interval": 5,
        "num_steps": 100,
    }
    assert (second["env_id"], second["wandb_name"]) == (1, "toy_1")
    assert (other["env_id"], other["wandb_name"]) == (2, "math_0")


def test_register_env_rejects_group_size_that_cannot_fill_a_batch(api: httpx.Client) -> None:
    start_run(api)
    answer = api.post("/register-env", json=env_registration("odd", group_size=3))
    assert answer.status_code == 422
    assert "batch_size 8" in answer.json()["detail"] and "group_size 3" in answer.json()["detail"]
    assert api.get("/status").json()["queue_size"] == 0


def test_scored_data_and_list_are_received_and_served_in_fifo_order(api: httpx.Client) -> None:
    start_run(api)
    assert api.post("/scored_data", json=group(10)).json() == {"status": "received"}
    listed = api.post("/scored_data_list", json=[group(11), group(12), group(13)])
    assert listed.json() == {"status": "received", "groups_processed": 3}
    assert api.get("/status").json()["queue_size"] == 4
    first = api.get("/batch").json()["batch"]
    second = api.get("/batch").json()["batch"]
    assert markers(first) == [10, 11] and markers(second) == [12, 13]
    assert sum(len(g["tokens"]) for g in first) == 8
    assert api.get("/batch").json() == {"batch": None}


def test_served_group_keeps_every_field_and_unknown_extras(api: httpx.Client) -> None:
    start_run(api)
    full = group(
        20,
        advantages=[[0.0, 0.5, 0.5, 0.5]] * 4,
        ref_logprobs=[[0.0, -0.2, -0.2, -0.2]] * 4,
        messages=[[{"role": "user", "content": "hi"}]] * 4,
        generation_params={"temperature": 0.7},
        overrides=[{"set_advantage_to_zero": True}, {}, {}, {"temperature": 1.0}],
        group_overrides={"note": "x"},
        images=None,
        policy_version=3,
        custom_field={"kept": True},
    )
    api.post("/scored_data", json=full)
    api.post("/scored_data", json=group(21))
    served = api.get("/batch").json()["batch"]
    assert served[0] == full
    minimal = served[1]
    for absent in ("advantages", "ref_logprobs", "messages", "overrides", "policy_version"):
        assert minimal[absent] is None


def test_gzip_request_bodies_are_accepted(api: httpx.Client) -> None:
    start_run(api)
    body = gzip.compress(json.dumps(group(30)).encode())
    answer = api.post(
        "/scored_data",
        content=body,
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert answer.json() == {"status": "received"}
    latest = api.get("/latest_example").json()
    assert latest["tokens"][0][0] == 30


def test_plain_batch_advances_step_on_delivery_only(api: httpx.Client) -> None:
    start_run(api)
    api.post("/scored_data", json=group(1))
    assert api.get("/batch").json() == {"batch": None}
    assert api.get("/status").json()["current_step"] == 0
    api.post("/scored_data", json=group(2))
    assert len(api.get("/batch").json()["batch"]) == 2
    status = api.get("/status").json()
    assert status == {
        "current_step": 1,
        "queue_size": 0,
        "queue_sequences": 0,
        "leased_batches": 0,
        "inference_held": False,
        "served_incarnation": None,
        "max_batches_offpolicy": 3,
        "backpressure": False,
    }


def test_leased_batch_advances_step_on_ack(api: httpx.Client) -> None:
    start_run(api)
    api.post("/scored_data_list", json=[group(1), group(2)])
    leased = api.get("/batch", params={"lease": 30}).json()
    assert markers(leased["batch"]) == [1, 2] and leased["batch_id"]
    assert api.get("/status").json()["current_step"] == 0
    assert api.get("/status").json()["leased_batches"] == 1
    assert api.post("/batch/ack", json={"batch_id": leased["batch_id"]}).json() == {
        "status": "success",
        "current_step": 1,
    }
    again = api.post("/batch/ack", json={"batch_id": leased["batch_id"]})
    assert again.status_code == 404


def test_reregister_resumes_from_starting_step(api: httpx.Client) -> None:
    start_run(api)
    api.post("/scored_data", json=group(1))
    api.post("/register", json={**TRAINER, "starting_step": 40})
    assert api.get("/status").json() == {
        "current_step": 40,
        "queue_size": 1,
        "queue_sequences": 4,
        "leased_batches": 0,
        "inference_held": False,
        "served_incarnation": None,
        "max_batches_offpolicy": 3,
        "backpressure": False,
    }
    answer = api.post("/register-env", json=env_registration("late")).json()
    assert answer["starting_step"] == 40


def test_status_env_fields_and_offpolicy_pause(api: httpx.Client) -> None:
    ids = start_run(api, toy=4, math=4)
    api.post("/scored_data_list", json=[group(i, env_id=ids["toy"]) for i in range(5)])
    api.post("/scored_data", json=group(9, env_id=ids["math"]))
    by_body = api.request("GET", "/status-env", json={"env_id": ids["toy"]}).json()
    by_query = api.get("/status-env", params={"env_id": ids["toy"]}).json()
    assert by_body == by_query
    assert by_body == {
        "current_step": 0,
        "served_version": None,
        "served_model": None,
        "inference_held": False,
        "queue_size": 6,
        "unallocated_fraction": 1.0,
        "self_queue_size": 5,
        "max_group_size": 4,
        "env_weight": 0.5,
        "queued_batches": 3.0,
        "max_batches_offpolicy": 3,
        "leased_batches": 0,
        "pause": True,
    }
    api.get("/batch")
    assert api.get("/status-env", params={"env_id": ids["toy"]}).json()["pause"] is False


def test_served_version_reaches_status_env_until_the_next_registration(
    api: httpx.Client,
) -> None:
    """The trainer reports each sync's version; environments read it from /status-env (and
    from a post's env_status) to tag samples; a (re-)registration forgets it."""
    ids = start_run(api)

    def served() -> int | None:
        return api.get("/status-env", params={"env_id": ids["toy"]}).json()["served_version"]

    assert served() is None
    assert api.post("/served-version", json={"version": 3}).json() == {"status": "success"}
    assert served() == 3
    posted = api.post("/scored_data", params={"env_status": "true"}, json=group(1)).json()
    assert posted["env_status"]["served_version"] == 3
    pair = [group(2, env_id=ids["toy"]), group(3, env_id=ids["toy"])]
    listed = api.post("/scored_data_list", params={"env_status": "true"}, json=pair).json()
    assert (listed["groups_processed"], listed["env_status"]["served_version"]) == (2, 3)
    api.post("/register", json={**TRAINER, "starting_step": 4})
    assert served() is None


def test_disconnect_env(api: httpx.Client) -> None:
    ids = start_run(api)
    assert api.post("/disconnect-env", json={"env_id": ids["toy"]}).json() == {"status": "success"}


def test_min_batch_allocation_and_weights_shape_batches(api: httpx.Client) -> None:
    assert api.post("/register", json={**TRAINER, "batch_size": 8}).status_code == 200
    api.get("/batch")
    big = api.post("/register-env", json=env_registration("big", 2)).json()["env_id"]
    small = api.post(
        "/register-env", json=env_registration("small", 2, min_batch_allocation=0.5)
    ).json()["env_id"]
    api.post("/scored_data_list", json=[group(i, size=2, env_id=big) for i in range(8)])
    assert api.get("/batch").json() == {"batch": None}, "small env's minimum not met yet"
    api.post("/scored_data_list", json=[group(100 + i, size=2, env_id=small) for i in range(2)])
    served = api.get("/batch").json()["batch"]
    assert markers(served) == [0, 1, 100, 101]


def test_latest_example_and_reset(api: httpx.Client) -> None:
    assert api.get("/latest_example").json()["tokens"] == []
    start_run(api)
    api.post("/scored_data", json=group(77))
    assert api.get("/latest_example").json()["tokens"][0][0] == 77
    reset = api.get("/reset_data")
    assert (reset.status_code, reset.text) == (200, "Reset successful")
    assert api.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert api.get("/status").json()["queue_size"] == 0
    assert api.get("/latest_example").json()["tokens"] == []


def test_metrics_report_queue_depth_and_per_env_counters(api: httpx.Client) -> None:
    ids = start_run(api, toy=4)
    api.post("/scored_data_list", json=[group(1), group(2), group(3)])
    api.post("/scored_data", json={**group(4), "masks": [[1]] * 4})
    api.get("/batch")
    text = api.get("/metrics").text
    lines = set(text.splitlines())
    assert ids == {"toy": 0}
    for expected in (
        "grpo_api_queue_groups 1",
        "grpo_api_queue_sequences 4",
        "grpo_api_current_step 1",
        'grpo_api_env_queue_groups{env="toy_0"} 1',
        'grpo_api_groups_received_total{env="toy_0"} 3',
        'grpo_api_groups_served_total{env="toy_0"} 2',
        'grpo_api_groups_dropped_total{env="toy_0"} 1',
    ):
        assert expected in lines, f"{expected!r} missing from:\n{text}"


def gauges(text: str) -> dict[str, float]:
    """The unlabelled samples of a Prometheus text."""
    return {
        name: float(value)
        for name, value in (line.split() for line in text.splitlines() if line[:1] != "#")
        if "{" not in name
    }


def test_metrics_report_time_in_queue_and_the_served_version(api: httpx.Client) -> None:
    start_run(api, toy=4)
    before = gauges(api.get("/metrics").text)
    assert "grpo_api_time_in_queue_seconds" not in before  # unknown, not 0
    assert "grpo_api_served_version" not in before
    api.post("/scored_data_list", json=[group(1), group(2)])
    queued = time.monotonic()
    time.sleep(0.2)
    assert api.get("/batch").json()["batch"]
    waited = time.monotonic() - queued
    api.post("/served-version", json={"version": 7, "incarnation": 2})
    after = gauges(api.get("/metrics").text)
    assert 0.2 <= after["grpo_api_time_in_queue_seconds"] <= waited + 0.05
    assert after["grpo_api_served_version"] == 7
    assert after["grpo_api_served_incarnation"] == 2


def test_no_cors_wildcard(api: httpx.Client) -> None:
    answer = api.get("/status", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in answer.headers


async def test_the_supervisor_scrapes_queue_time_in_queue_and_served_version(
    api: httpx.Client, shared_api: ApiServer
) -> None:
    """The supervisor's samplers (``samplers.GAUGES``) read the real API's ``/metrics``."""
    from grpo_tui.supervisor.samplers import Samplers, Scrape

    start_run(api, toy=4)
    api.post("/scored_data_list", json=[group(i) for i in range(3)])
    assert api.get("/batch").json()["batch"]
    api.post("/served-version", json={"version": 3, "incarnation": 1})
    async with httpx.AsyncClient() as client:
        _, values = await Samplers(client).sample(
            {}, {"api": Scrape(f"{shared_api.url}/metrics", instance=1, ready_at=0.0)}
        )
    assert values["api/queue_groups"] == 1
    assert values["api/served_version"] == 3 and values["api/served_incarnation"] == 1
    assert values["api/time_in_queue_s"] >= 0
    assert "api/tokens_per_s" not in values
