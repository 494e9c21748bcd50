"""Mode ``colocate`` on the built-in server (CPU): the same code path as on a GPU.

The server sleeps from ``before_train_step`` until ``sync``; a request that arrives in
between waits and is then served by the trained weights. A wake-up that cannot happen
(the server process stopped between sleep and wake) is retried, then stops the training
loop with the reason: no step trains against a sleeping or stale engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from sync_helpers import ModeServer, server_logprobs, trainer_logprobs
from test_sync_modes import ATOL, MIN_CHANGE, train

from grpo_trainer.models import build_tiny_model, load_model, load_tokenizer
from grpo_trainer.sync.base import SyncContext
from grpo_trainer.sync.client import SyncError
from grpo_trainer.sync.colocate import ColocateSharedSync
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.loop import SyncLagExceeded, Trainer
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.sources import FileSource


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("colocate-model") / "model", seed=2)


@pytest.fixture
def server(tmp_path: Path, base_model: Path) -> Iterator[ModeServer]:
    server = ModeServer("colocate", base_model, tmp_path)
    server.start()
    yield server
    server.stop()


def is_sleeping(url: str) -> bool:
    return httpx.get(f"{url}/is_sleeping", timeout=10).json()["is_sleeping"]


def context(server: ModeServer, tmp_path: Path) -> SyncContext:
    return SyncContext(server.url, "policy", tmp_path / "checkpoints", "builtin")


def test_inference_sleeps_through_the_step_and_wakes_on_the_new_weights(
    server: ModeServer, base_model: Path, tmp_path: Path
) -> None:
    tokenizer = load_tokenizer(base_model)
    prompt, completion = tokenizer.encode("repeat 4:"), tokenizer.encode(" 4444")
    strategy = ColocateSharedSync(context(server, tmp_path))
    model = strategy.attach(load_model(base_model))
    try:
        before = server_logprobs(server.url, "policy", prompt, completion)
        assert torch.allclose(before, trainer_logprobs(model, prompt, completion), atol=ATOL)

        strategy.before_train_step()
        assert is_sleeping(server.url)
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(server_logprobs, server.url, "policy", prompt, completion)
            train(model, strategy, prompt, completion)
            assert not held.done(), "the server answered while asleep"
            result = strategy.sync(model, 5)
            served_late = held.result(timeout=60)
        assert not is_sleeping(server.url)
        assert 0 <= result.phases["wake"] <= result.sync_time

        expected = trainer_logprobs(model, prompt, completion)
        assert torch.allclose(served_late, expected, atol=ATOL), "held request saw old weights"
        assert (served_late - before).abs().max() > MIN_CHANGE
        assert result.policy_version == 5
    finally:
        strategy.close()
    # a trainer restarted mid-step finds the server asleep: attaching wakes it
    assert httpx.post(f"{server.url}/sleep", timeout=30).status_code == 200
    again = ColocateSharedSync(context(server, tmp_path))
    try:
        again.attach(load_model(base_model))
        assert not is_sleeping(server.url)
    finally:
        again.close()


def test_a_failed_wake_up_is_retried_then_stops_training_with_the_reason(
    server: ModeServer, base_model: Path, tmp_path: Path
) -> None:
    config = TrainerConfig(
        model_name=str(base_model),
        inference_url=server.url,
        weight_bridge_mode="colocate",
        sync_every=1,
        max_sync_lag=0,
        sync_retries=1,
        save_path=str(tmp_path / "checkpoints"),
    )
    strategy = ColocateSharedSync(context(server, tmp_path))
    events: list[str] = []

    class Events(Reporter):
        def event(self, level: str, message: str) -> None:
            events.append(f"{level}: {message}")

    trainer = Trainer(
        config,
        load_model(base_model),
        load_tokenizer(base_model),
        base=str(base_model),
        source=FileSource(tmp_path / "unused.jsonl", config.step_batch_size),
        reporter=Events(None, tmp_path / "metrics.jsonl"),
        strategy=strategy,
    )
    strategy.client.backoff = 0.05  # the client's retries, on a shorter schedule
    try:
        strategy.before_train_step()
        assert is_sleeping(server.url)
        server.stop()  # a real failure between sleep and wake: nobody left to wake
        trainer.step = 1
        reason = r"last failure: POST .*/wake_up failed: ConnectError"
        with pytest.raises(SyncLagExceeded, match=reason):
            trainer._maybe_sync()
        # every sync attempt (each after the client's own retries) was made and reported
        assert len(events) == config.sync_retries + 1
        assert all("ConnectError" in e for e in events), events
        with pytest.raises(SyncError):
            strategy.control.confirm_awake()
    finally:
        # a server left asleep is said, not suppressed (the trainer's loop reports it)
        with pytest.raises(SyncError, match=r"is left asleep: POST .*/wake_up failed"):
            strategy.close()
