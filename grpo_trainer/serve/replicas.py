"""Data-parallel replicas of the built-in server (``--data-parallel-size N``, CPU).

vLLM's data-parallel front end spreads requests over N engines, each with its own copy of
the weights; ``colocate`` on N devices puts one replica beside each trainer rank and loads
each from the weights that rank gathered. The built-in server does the same on CPU, so that
the N-rank ``colocate`` path runs in CI: one HTTP front end (one sleep gate, as vLLM sleeps
every engine at once), N engines in one process, each with its own model and scheduler
thread. A request goes to the replica with the fewest requests in flight (ties in turn).

Replica ``i`` is device ``cpu:i`` (``device_key``): rank ``i`` of the trainer sends its
buckets under that key (``serve/buckets.py``). A load refuses the whole call, before any
replica changes, when one replica has no payload.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from grpo_trainer.serve.buckets import (
    BucketError,
    BucketPayload,
    check_parameter,
    open_bucket,
    payload_for,
)
from grpo_trainer.serve.engine import Engine


def device_key(index: int) -> str:
    """The device name replica ``index`` takes its buckets under (its trainer rank's)."""
    return f"cpu:{index}"


class Replicas:
    """The engines of one server; ``lease`` picks one per request."""

    def __init__(self, engines: list[Engine]) -> None:
        if not engines:
            raise ValueError("a server needs at least one engine")
        self.engines = engines
        self.in_flight = [0] * len(engines)
        self._turn = 0

    def __len__(self) -> int:
        return len(self.engines)

    @contextmanager
    def lease(self) -> Iterator[Engine]:
        """The least busy replica for one request (called on the event loop only)."""
        count = len(self.engines)
        order = [(self._turn + i) % count for i in range(count)]
        index = min(order, key=lambda i: self.in_flight[i])
        self._turn = (index + 1) % count
        self.in_flight[index] += 1
        try:
            yield self.engines[index]
        finally:
            self.in_flight[index] -= 1

    def layout(self) -> list[list[Any]]:
        """``[name, shape, dtype]`` of every parameter (the replicas are alike)."""
        return [
            [name, list(param.shape), str(param.dtype).removeprefix("torch.")]
            for name, param in self.engines[0].model.named_parameters()
        ]

    def load_bucket(self, payloads: str) -> int:
        """Copy each replica's bucket into its weights; returns the tensors per replica.

        Every replica's payload is found and checked against its model first, so a call
        that one replica must refuse changes none.
        """
        mine: list[tuple[Engine, BucketPayload]] = []
        for index, engine in enumerate(self.engines):
            payload = payload_for(payloads, device_key(index))
            params = dict(engine.model.named_parameters())
            for entry in payload.entries:
                param = params.get(entry.name)
                if param is None or list(param.shape) != entry.shape:
                    raise BucketError(
                        f"replica {index} has no parameter {entry.name} {entry.shape}"
                    )
            mine.append((engine, payload))
        for engine, payload in mine:
            params = dict(engine.model.named_parameters())
            with engine.lock, torch.no_grad():
                for name, tensor in open_bucket(payload, engine.device):
                    params[name].copy_(tensor)
        return len(mine[0][1].entries)

    def check_parameter(self, name: str, values: list[float]) -> None:
        """Raise ``BucketError`` unless every replica's ``name`` holds exactly ``values``."""
        for index, engine in enumerate(self.engines):
            served = dict(engine.model.named_parameters()).get(name)
            if served is None:
                raise BucketError(f"replica {index} has no parameter {name}")
            check_parameter(served, name, values, device_key(index))
