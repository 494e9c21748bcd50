"""``colocate`` on N ranks (``sync/colocate_ranks.py``) on CPU: 2 gloo FSDP2 ranks and the
built-in server with 2 data-parallel replicas, one per rank.

The same code path as on GPUs but for the bucket transport (a shared-memory file where
GPUs use CUDA IPC): rank 0 puts every replica to sleep, both ranks gather the whole
parameters bucket by bucket, rank 0 posts both ranks' buckets keyed by device, each replica
loads its own rank's, then rank 0 wakes the replicas and every replica is checked. A
replica with no bucket of its own refuses the call, and that failure reaches both ranks; a
wake-up that cannot happen stops both ranks' training loops at the same step.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import torch.multiprocessing as mp
from gloo_ranks import join
from sync_helpers import ModeServer, free_port

from grpo_trainer.models import build_tiny_model, load_model, load_tokenizer
from grpo_trainer.ranks.group import shutdown_distributed
from grpo_trainer.ranks.mirror import Consolidator
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.sync.base import SyncContext
from grpo_trainer.sync.buckets import SHM_DIR, plan_buckets
from grpo_trainer.sync.client import SyncError
from grpo_trainer.sync.colocate_ranks import ColocateRanksSync
from grpo_trainer.sync.sharded import full_parameters
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.fsdp import shard_model
from grpo_trainer.train.loop import SyncLagExceeded, Trainer
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.sources import FileSource
from grpo_trainer.train.strategy import sync_context

BUCKET_BYTES = 16_384
"""Small buckets, so that a sync of the tiny model takes several."""


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ModeServer]:
    server = ModeServer("colocate", build_tiny_model(tmp_path / "model", seed=3), tmp_path)
    server.settings = InferenceSettings(port=free_port(), data_parallel_size=2)
    server.start()
    yield server
    server.stop()


def rpc(url: str, method: str, *args: object) -> httpx.Response:
    body = {"method": method, "args": list(args)}
    return httpx.post(f"{url}/collective_rpc", json=body, timeout=60)


def complete(url: str) -> dict:
    body = {
        "model": "policy",
        "prompt": "repeat 4:",
        "max_tokens": 4,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()


def _worker(rank: int, port: int, model_path: str, url: str, out: str) -> None:
    world = join(rank, port)
    facts: dict[str, object] = {}
    try:
        model = shard_model(load_model(model_path), world, dtype="float32")
        facts["buckets"] = len(plan_buckets(model, 4, BUCKET_BYTES))
        context = SyncContext(url, "policy", Path(out), "builtin")
        strategy = ColocateRanksSync(
            context, world=world, dtype=torch.float32, bucket_bytes=BUCKET_BYTES
        )
        strategy.attach(model)
        facts["check_name"] = strategy.check_name

        strategy.before_train_step()
        with torch.no_grad():  # a trained step's change
            for param in model.parameters():
                param.add_(0.5)
        whole = {name: t.tolist() for name, t in full_parameters(model, torch.float32, "cpu")}
        held = None
        if world.is_main:
            facts["asleep"] = httpx.get(f"{url}/is_sleeping").json()["is_sleeping"]
            stale = rpc(
                url, "grpo_check_parameter", strategy.check_name, whole[strategy.check_name]
            )
            facts["stale_check"] = [stale.status_code, stale.text]
            held = _Held(url)
        world.barrier()
        result = strategy.sync(model, 3)
        facts["result"] = [result.policy_version, sorted(result.phases)]
        if held is not None:
            facts["held"] = held.finish()
            checks = [rpc(url, "grpo_check_parameter", n, v).status_code for n, v in whole.items()]
            facts["all_loaded"] = checks == [200] * len(whole)
            facts["awake"] = not httpx.get(f"{url}/is_sleeping").json()["is_sleeping"]

        # rank 1's bucket names a device no replica has: replica 1 refuses, both ranks fail
        if rank == 1:
            strategy.transport.key = "cpu:7"
        strategy.before_train_step()
        try:
            strategy.sync(model, 4)
        except SyncError as exc:
            facts["refused"] = str(exc)
        strategy.close()
        facts["left"] = sorted(p.name for p in SHM_DIR.glob(f"grpo-bucket-{os.getpid()}-*"))
    finally:
        shutdown_distributed(world)
    Path(out, f"rank{rank}.json").write_text(json.dumps(facts))


class _Held:
    """A request sent while the replicas sleep, answered in a thread."""

    def __init__(self, url: str) -> None:
        self.answer: dict | None = None
        self.thread = threading.Thread(target=self._run, args=(url,))
        self.thread.start()
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/is_sleeping").json()["waiting"] != 1:
            assert time.monotonic() < deadline, "the request never reached the server"
            time.sleep(0.02)
        self.held = self.answer is None

    def _run(self, url: str) -> None:
        self.answer = complete(url)

    def finish(self) -> list[object]:
        """[held while asleep, tokens it got once answered]."""
        self.thread.join(timeout=120)
        assert self.answer is not None
        return [self.held, len(self.answer["choices"][0]["token_ids"])]


def test_each_replica_loads_its_own_ranks_buckets_and_a_missing_one_fails_every_rank(
    tmp_path: Path, replicas: ModeServer
) -> None:
    model = str(replicas.base_model)
    mp.spawn(_worker, args=(free_port(), model, replicas.url, str(tmp_path)), nprocs=2)
    main, other = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    assert main["buckets"] > 2
    assert main["check_name"] == other["check_name"]
    assert main["asleep"] is True
    # the check compares every replica with the trainer: before the sync it must fail
    assert main["stale_check"][0] == 400 and main["check_name"] in main["stale_check"][1]
    assert main["result"] == other["result"] == [3, ["push", "wake"]]
    assert main["held"] == [True, 4]  # held while asleep, served after the wake-up
    assert main["all_loaded"] and main["awake"]  # every parameter, on both replicas
    assert "no weight bucket for this replica's device cpu:1" in main["refused"]
    assert "rank 0's weight sync failed" in other["refused"]
    assert "cpu:7" in main["refused"]
    assert main["left"] == other["left"] == []  # every shared-memory bucket removed


def _stop_worker(rank: int, port: int, model_path: str, url: str, out: str) -> None:
    world = join(rank, port)
    facts: dict[str, object] = {}
    try:
        config = TrainerConfig(
            model_name=model_path,
            inference_url=url,
            inference_backend="builtin",
            weight_bridge_mode="colocate",
            sync_every=1,
            max_sync_lag=0,
            sync_retries=1,
            save_path=str(Path(out, "checkpoints")),
        )
        unsharded = load_model(model_path)
        consolidator = Consolidator(unsharded, world, "float32")
        model = shard_model(unsharded, world, dtype="float32")
        strategy = ColocateRanksSync(sync_context(config), world=world, dtype=torch.float32)
        trainer = Trainer(
            config,
            model,
            load_tokenizer(model_path),
            base=model_path,
            source=FileSource(Path(out, "unused.jsonl"), 8) if world.is_main else None,
            reporter=Reporter(link=None, metrics_path=None),
            strategy=strategy,
            world=world,
            consolidator=consolidator,
        )
        if strategy.client is not None:
            strategy.client.backoff = 0.05  # the client's retries, on a shorter schedule
        strategy.before_train_step()
        Path(out, f"asleep{rank}").touch()
        while not Path(out, "stopped").exists():  # the test stops the server meanwhile
            time.sleep(0.02)
        trainer.step = 1
        try:
            trainer._maybe_sync()
        except SyncLagExceeded as exc:
            facts["stopped"] = str(exc)
        try:  # rank 0 holds the control: its close cannot wake a server that is gone
            strategy.close()
        except SyncError as exc:
            facts["close"] = str(exc)
    finally:
        shutdown_distributed(world)
    Path(out, f"stop{rank}.json").write_text(json.dumps(facts))


def test_a_failed_wake_up_stops_every_rank_at_the_same_step_with_the_reason(
    tmp_path: Path, replicas: ModeServer
) -> None:
    model, url = str(replicas.base_model), replicas.url
    args = (free_port(), model, url, str(tmp_path))
    workers = mp.spawn(_stop_worker, args=args, nprocs=2, join=False)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"asleep{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, "the ranks never put inference to sleep"
            assert all(p.is_alive() for p in workers.processes), "a rank died early"
            time.sleep(0.05)
        assert httpx.get(f"{url}/is_sleeping").json()["is_sleeping"] is True
        replicas.stop()  # a real failure between sleep and wake: nobody left to wake
        (tmp_path / "stopped").touch()
        deadline = time.monotonic() + 120
        while not workers.join(timeout=5):  # True once every rank has exited
            assert time.monotonic() < deadline, "a rank did not stop"
    finally:  # nothing left running, whatever failed
        for process in workers.processes:
            if process.is_alive():
                process.kill()
    main, other = (json.loads((tmp_path / f"stop{r}.json").read_text()) for r in (0, 1))
    assert "after step 1" in main["stopped"] and "after step 1" in other["stopped"]
    assert "last failure: POST" in main["stopped"] and "wake_up failed" in main["stopped"]
    assert "rank 0's weight sync failed" in other["stopped"] and "wake_up" in other["stopped"]
    assert "is left asleep" in main["close"]  # said, not swallowed
    assert "close" not in other  # a rank without the control has nothing to wake
