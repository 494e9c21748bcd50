"""The rollout API's rules called directly, without HTTP: ``RolloutService`` over a real
in-memory store. What a client sees of the same rules is tested over HTTP beside this."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from api_helpers import TRAINER, env_registration, group

from grpo_trainer.api.runner import StoreRunner
from grpo_trainer.api.schemas import RegisterEnv, Registration
from grpo_trainer.api.service import WAIT, RolloutService
from grpo_trainer.api.settings import MEMORY_DB, ApiSettings
from grpo_trainer.api.store import Store
from grpo_trainer.api.validation import Refused
from grpo_trainer.live_edits import EditWatcher, record_edit


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[RolloutService]:
    """A service on an empty in-memory queue; live edits come from ``tmp_path``."""
    runner = StoreRunner(Store(MEMORY_DB))
    edits = EditWatcher(["max_batches_offpolicy"], tmp_path)
    yield RolloutService(ApiSettings(max_batches_offpolicy=1), runner, edits)
    runner.close()


async def start(service: RolloutService, batch_size: int = 8, group_size: int = 4) -> int:
    """Register the trainer, take its first (empty) batch, register one environment."""
    await service.register(Registration(**{**TRAINER, "batch_size": batch_size}))
    assert await service.next_batch(None, 0) is None
    env = await service.register_env(RegisterEnv(**env_registration("toy", group_size)))
    assert env["status"] == "success", env
    return env["env_id"]


def body(*groups: dict[str, Any]) -> bytes:
    return json.dumps(groups[0] if len(groups) == 1 else list(groups)).encode()


async def test_ingest_refuses_before_registration_and_counts_what_it_drops(
    service: RolloutService,
) -> None:
    with pytest.raises(Refused) as refused:
        await service.ingest(body(group(1)), many=False)
    assert refused.value.status == 409 and "POST /register" in refused.value.detail
    env_id = await start(service)
    too_long = group(2, env_id=env_id, tokens=[[1] * 33] * 4, masks=[[1] * 33] * 4)
    del too_long["inference_logprobs"]
    cases = [
        (b"", 400, "empty body"),
        (b"{not json", 400, "malformed JSON"),
        (body(group(3, env_id=7)), 422, "env_id 7 is not registered"),
        (body(group(4, size=3, scores=[1.0])), 422, "scores has 1 entries for 3 sequences"),
        (body(too_long), 422, "a sequence has 33 tokens, over max_token_len 32"),
    ]
    for data, status, reason in cases:
        with pytest.raises(Refused) as refused:
            await service.ingest(data, many=False)
        assert (refused.value.status, reason in refused.value.detail) == (status, True), data
    status = await service.status()
    assert status["queue_size"] == 0
    dropped = sum(n for (_, name), n in service.store.counters().items() if name == "dropped")
    assert dropped == len(cases)


async def test_a_list_is_queued_whole_or_not_at_all(service: RolloutService) -> None:
    env_id = await start(service)
    good, bad = group(1, env_id=env_id), group(2, env_id=env_id, size=9)
    with pytest.raises(Refused) as refused:
        await service.ingest(body(good, bad), many=True)
    assert refused.value.detail == "group 1: 9 sequences cannot fit a batch of 8"
    assert (await service.status())["queue_size"] == 0
    assert len(await service.ingest(body(good, good), many=True)) == 2
    assert (await service.status())["queue_size"] == 2


async def test_register_env_needs_a_started_run_and_a_dividing_group_size(
    service: RolloutService,
) -> None:
    assert await service.register_env(RegisterEnv(**env_registration())) == WAIT
    await service.register(Registration(**TRAINER))
    assert await service.register_env(RegisterEnv(**env_registration())) == WAIT
    assert await service.next_batch(None, 0) is None  # the trainer's first request starts
    with pytest.raises(Refused) as refused:
        await service.register_env(RegisterEnv(**env_registration("odd", group_size=3)))
    assert refused.value.status == 422
    assert "batch_size 8 (from the trainer) is not a multiple of group_size 3" in str(refused.value)
    assert (await service.register_env(RegisterEnv(**env_registration())))["env_id"] == 0
    with pytest.raises(Refused, match="not a multiple of the group size of toy_0"):
        await service.register(Registration(**{**TRAINER, "batch_size": 6}))


async def test_batches_form_from_whole_groups_and_a_lease_is_acked_once(
    service: RolloutService,
) -> None:
    env_id = await start(service)
    await service.ingest(body(group(1, env_id=env_id)), many=False)
    assert await service.next_batch(None, 0) is None  # 4 of 8 sequences
    await service.ingest(body(group(2, env_id=env_id)), many=False)
    delivery = await service.next_batch(30.0, 0)
    assert delivery is not None and delivery.batch_id is not None
    assert [json.loads(p)["tokens"][0][0] for p in delivery.payloads] == [1, 2]
    assert (await service.status())["leased_batches"] == 1
    assert await service.ack(delivery.batch_id) == 1
    with pytest.raises(Refused) as refused:
        await service.ack(delivery.batch_id)
    assert refused.value.status == 404


async def test_a_synchronous_queue_has_room_again_once_a_restarted_trainer_registers(
    tmp_path: Path,
) -> None:
    """``max_batches_offpolicy = 0``: environments pause while the trainer holds a leased
    batch. The trainer dies holding it; its successor (another ``trainer_id``) registers at
    the step it resumes from and gets the batch at once, and the environments get room
    after its ack. Before, the dead trainer's lease held the room for 600 s (issue 35)."""
    runner = StoreRunner(Store(MEMORY_DB))
    edits = EditWatcher(["max_batches_offpolicy"], tmp_path)
    service = RolloutService(ApiSettings(max_batches_offpolicy=0), runner, edits)
    try:
        first = {**TRAINER, "trainer_id": "first"}
        await service.register(Registration(**first))
        assert await service.next_batch(None, 0) is None
        env = await service.register_env(RegisterEnv(**env_registration()))
        env_id = env["env_id"]
        for marker in (1, 2, 3):
            await service.ingest(body(group(marker, env_id=env_id)), many=False)
        held = await service.next_batch(600.0, 0)
        assert held is not None and held.batch_id is not None
        await service.register(Registration(**first))  # the same trainer again: kept
        assert (await service.env_status(env_id))["pause"] is True
        assert (await service.status())["backpressure"] is True  # what the stall report reads

        await service.register(Registration(**{**TRAINER, "trainer_id": "second"}))
        assert (await service.status())["leased_batches"] == 0
        again = await service.next_batch(600.0, 0)
        assert again is not None and again.batch_id is not None
        assert again.payloads == held.payloads
        assert await service.ack(again.batch_id) == 1
        status = await service.env_status(env_id)
        assert (status["pause"], status["queued_batches"]) == (False, 0.5)
        assert (await service.status())["backpressure"] is False
        with pytest.raises(Refused) as refused:
            await service.ack(held.batch_id)
        assert refused.value.status == 404
    finally:
        runner.close()


async def test_env_status_pauses_at_the_bound_and_takes_live_edits(
    service: RolloutService, tmp_path: Path
) -> None:
    env_id = await start(service)
    for marker in (1, 2):
        answer = await service.scored_data(body(group(marker, env_id=env_id)), env_status=True)
    assert answer["env_status"]["queued_batches"] == 1.0
    assert answer["env_status"]["pause"] is True  # max_batches_offpolicy 1
    record_edit(tmp_path, {"max_batches_offpolicy": 2})
    status = await service.env_status(env_id)
    assert (status["max_batches_offpolicy"], status["pause"]) == (2, False)
    with pytest.raises(Refused) as refused:
        await service.env_status(99)
    assert refused.value.status == 404


async def test_a_list_post_queues_all_or_none_and_answers_the_status_after_it(
    service: RolloutService,
) -> None:
    """``/scored_data_list?env_status=true``: the environment's status is read after every
    group of the list was queued (one request for an environment's whole round)."""
    env_id = await start(service)
    answer = await service.scored_data(
        body(group(1, env_id=env_id), group(2, env_id=env_id)), many=True, env_status=True
    )
    assert answer["groups_processed"] == 2
    assert (answer["env_status"]["queue_size"], answer["env_status"]["pause"]) == (2, True)
    with pytest.raises(Refused):
        await service.scored_data(
            body(group(3, env_id=env_id), group(4, env_id=99)), many=True, env_status=True
        )
    assert (await service.status())["queue_size"] == 2  # the bad list queued nothing
    plain = await service.scored_data(body(group(5, env_id=env_id), group(6, env_id=env_id)),
                                      many=True)  # fmt: skip
    assert plain == {"status": "received", "groups_processed": 2}
