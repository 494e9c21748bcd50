"""Mode ``colocate`` on N devices: N trainer ranks, one inference replica beside each.

The FSDP2 trainer's ranks and the inference server's data-parallel replicas (vLLM: one
per GPU, tensor parallel size 1; built-in: ``--data-parallel-size N`` on CPU) time-share
the devices. Every call here is collective (every rank makes it, rank 0 alone talks HTTP,
``collective.on_main`` gives every rank its outcome)::

    before_train_step()  rank 0: POST /sleep?level=2&mode=wait (every replica sleeps:
                         vLLM's front end sends utility calls to every engine)
    forward / backward / optimizer.step()   on every rank, the devices are the trainer's
    sync()               rank 0: /wake_up?tags=weights; then per bucket: every rank gathers
                         the whole parameters on its own device (``buckets.py``), shares
                         the bucket (CUDA IPC, or shared memory on CPU), rank 0 gathers the
                         ranks' payloads keyed by device and posts them in one
                         /collective_rpc grpo_load_bucket; each replica loads its own
                         device's (and refuses a call without one); then rank 0:
                         /wake_up?tags=kv_cache, GET /is_sleeping false, and every replica
                         compares one parameter with the trainer's (grpo_check_parameter)

No weights cross devices: each replica reads the bucket its own rank gathered. A failed
wake-up or load is raised on every rank at once; the loop retries the sync and then stops
every rank at the same step (``max_sync_lag`` 0), so no step trains, and no environment
samples, against a sleeping or stale engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from grpo_trainer.ranks.group import Dist
from grpo_trainer.serve.buckets import RPC_CHECK, RPC_LOAD, BucketPayload, encode_payloads
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.buckets import (
    BUCKET_BYTES,
    BucketTransport,
    gathered_buckets,
    transport_for,
)
from grpo_trainer.sync.client import InferenceClient, SyncError, base_model_name
from grpo_trainer.sync.collective import on_main
from grpo_trainer.sync.colocate import SleepControl, release_cached_memory

T = TypeVar("T")

SLEEP_LEVEL = 2
"""vLLM frees weights and KV cache (the trainer loads the weights back); the built-in
server treats level 2 as level 1 and keeps its replicas' weights until they are loaded."""


class ColocateRanksSync(WeightSync):
    """``colocate`` from FSDP2 shards: every rank loads the replica on its own device."""

    mode = "colocate"
    sleeps = True

    def __init__(
        self,
        context: SyncContext,
        *,
        world: Dist,
        dtype: torch.dtype,
        transport: BucketTransport | None = None,
        bucket_bytes: int = BUCKET_BYTES,
    ) -> None:
        super().__init__(context)
        self.world = world
        self.dtype = dtype
        self.bucket_bytes = bucket_bytes
        self.transport = transport or transport_for(world.device, world.rank)
        self.client = InferenceClient(context.inference_url) if world.is_main else None
        self.control = SleepControl(self.client) if self.client is not None else None
        self.check_name = ""

    def _main(self, action: Callable[[], T]) -> T:
        return on_main(self.world, action)

    def _rank0(self) -> tuple[InferenceClient, SleepControl]:
        if self.client is None or self.control is None:
            raise SyncError("only rank 0 talks to inference")
        return self.client, self.control

    def attach(self, model: nn.Module) -> nn.Module:
        """Pick the parameter every replica is checked by, then push the start weights
        through one sleep/load/wake cycle (this also wakes replicas a trainer restarted
        mid-step left asleep)."""
        if hasattr(model, "peft_config"):
            raise SyncError("colocate trains the full model; got a peft (LoRA) model")
        self.check_name = self._main(lambda: self._pick_check(model))
        self.served_model = self._main(lambda: base_model_name(self._rank0()[0]))
        self.before_train_step()
        self.sync(model, 0)
        return model

    def _pick_check(self, model: nn.Module) -> str:
        """The smallest parameter that the replicas hold under the trainer's own name."""
        client, _ = self._rank0()
        layout = client.post("/collective_rpc", json={"method": "grpo_weight_layout"})
        served = {entry[0] for entry in layout.json()["results"][0]}
        ours = [(p.numel(), name) for name, p in model.named_parameters() if name in served]
        if not ours:
            raise SyncError("inference and the trainer share no parameter name to check by")
        return min(ours)[1]

    def before_train_step(self) -> None:
        """Every replica sleeps: the devices' memory is the trainer's until the sync."""
        self._main(lambda: self._rank0()[1].sleep(SLEEP_LEVEL))

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Wake the weights, load every replica from its rank's buckets, wake the rest."""
        start = time.perf_counter()
        release_cached_memory()
        self._main(self._wake_weights)
        pushed = time.perf_counter()
        expected: list[float] = []
        buckets = gathered_buckets(
            model,
            dtype=self.dtype,
            device=self.world.device,
            transport=self.transport,
            limit=self.bucket_bytes,
        )
        for flat, payload in buckets:
            try:
                if self.world.is_main:
                    expected = expected or _values(flat, payload, self.check_name)
                shares = self.world.gather((self.transport.key, payload.model_dump()))
                self._main(lambda: self._load(shares, len(payload.entries)))  # noqa: B023
            finally:
                self.transport.release(flat)
                del flat
        push_time = time.perf_counter() - pushed
        phases = self._main(lambda: self._wake_rest(expected, push_time))
        return SyncResult(sync_time=time.perf_counter() - start, policy_version=step, phases=phases)

    def _wake_weights(self) -> None:
        _, control = self._rank0()
        if control.asleep:
            control.wake(["weights"])

    def _load(self, shares: list[tuple[str, dict[str, Any]]], count: int) -> None:
        """Post every rank's bucket, keyed by device, to every replica (rank 0)."""
        client, _ = self._rank0()
        table: dict[str, BucketPayload] = {}
        for rank, (key, payload) in enumerate(shares):
            if key in table:
                raise SyncError(f"trainer ranks share device {key} (rank {rank}): one rank a GPU")
            table[key] = BucketPayload.model_validate(payload)
        answer = client.post(
            "/collective_rpc", json={"method": RPC_LOAD, "args": [encode_payloads(table)]}
        )
        loaded = [str(result) for result in answer.json().get("results", [])]
        if loaded != [str(count)]:
            raise SyncError(f"inference loaded {loaded} tensors of a bucket of {count}")

    def _wake_rest(self, expected: list[float], push_time: float) -> dict[str, float]:
        """Wake the KV cache, confirm awake, check every replica holds our weights."""
        client, control = self._rank0()
        if control.asleep:
            control.wake(["kv_cache"])
        control.confirm_awake()
        client.post(
            "/collective_rpc", json={"method": RPC_CHECK, "args": [self.check_name, expected]}
        )
        return {"wake": control.take_wake_time(), "push": push_time}

    def close(self) -> None:
        """Never leave the replicas asleep: a wake that fails raises ``SyncError`` once the
        client is closed, so that the caller says so (as ``ColocateSharedSync.close``)."""
        if self.client is None or self.control is None:
            return
        try:
            if self.control.asleep:
                try:
                    self.control.wake()
                except SyncError as exc:
                    url = self.client.base_url
                    raise SyncError(f"inference at {url} is left asleep: {exc}") from exc
        finally:
            self.client.close()


def _values(flat: torch.Tensor, payload: BucketPayload, name: str) -> list[float]:
    """``name``'s values as float32 numbers when this bucket holds it, else ``[]``."""
    for entry in payload.entries:
        if entry.name == name:
            part = flat[entry.offset : entry.offset + entry.numel]
            return part.detach().float().cpu().tolist()
    return []
