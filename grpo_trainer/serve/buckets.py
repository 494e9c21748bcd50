"""Weight buckets from a multi-rank trainer, server side: which payload is mine, and open it.

``colocate`` on N devices (``sync/colocate_ranks.py``): after each step every trainer rank
gathers the full parameters a bucket at a time on its own device and shares the bucket's
memory; rank 0 posts the buckets of every rank, keyed by device, in one
``/collective_rpc grpo_load_bucket`` call. Each inference replica takes the payload of its
own device (GPU UUID; ``cpu:<replica>`` for the built-in server's CPU replicas) and must
refuse a call without one: on vLLM's data-parallel front end only engine 0's answer comes
back, so a replica's error is the only way its failure reaches the trainer.

A bucket is one flat tensor (one dtype) holding its parameters back to back. Its memory
travels as a CUDA IPC handle (``cuda_ipc``: ``reduce_tensor`` output, pickled, base64) or,
on CPU, as the path of a shared-memory file the rank wrote (``shm``): the one place the
CPU path differs from the GPU path. The sender keeps the memory alive until rank 0 has
the load's answer.
"""

from __future__ import annotations

import base64
import json
import math
import pickle
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from grpo_trainer.models import DTYPES
from grpo_trainer.serve.cuda_ipc import STORAGE_DEVICE_ARG
from grpo_trainer.serve.shared import TensorEntry

RPC_LOAD = "grpo_load_bucket"
RPC_CHECK = "grpo_check_parameter"


class BucketError(ValueError):
    """A bucket call this replica cannot serve (no payload for its device, bad layout)."""


class BucketPayload(BaseModel):
    """One rank's bucket: how to open its memory and what it holds."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["cuda_ipc", "shm"]
    handle: str
    dtype: str
    numel: int
    entries: list[TensorEntry]
    """The parameters back to back, as in a shared-weights manifest (element offsets)."""


def encode_payloads(payloads: dict[str, BucketPayload]) -> str:
    """Device key -> payload, as the one JSON string argument of the RPC."""
    return json.dumps({key: payload.model_dump() for key, payload in payloads.items()})


def payload_for(payloads: str, key: str) -> BucketPayload:
    """This replica's payload from ``encode_payloads`` output; ``BucketError`` without one."""
    table = json.loads(payloads)
    if key not in table:
        raise BucketError(
            f"no weight bucket for this replica's device {key} (the trainer sent "
            f"{', '.join(sorted(table)) or 'none'}): every replica needs a trainer rank on "
            "its own device"
        )
    return BucketPayload.model_validate(table[key])


def open_flat(payload: BucketPayload, device: torch.device) -> torch.Tensor:
    """The bucket's flat tensor, mapped here (the sender's memory, not a copy)."""
    dtype = DTYPES[payload.dtype]
    if payload.transport == "shm":
        return torch.from_file(payload.handle, shared=True, size=payload.numel, dtype=dtype)
    rebuild, rebuild_args = pickle.loads(base64.b64decode(payload.handle))
    rebuild_args = list(rebuild_args)
    rebuild_args[STORAGE_DEVICE_ARG] = device.index or 0
    return rebuild(*rebuild_args)


def open_bucket(payload: BucketPayload, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views of the bucket's parameters, in the sender's order."""
    flat = open_flat(payload, device)
    if flat.numel() != payload.numel:
        raise BucketError(f"bucket holds {flat.numel()} elements, the payload says {payload.numel}")
    views = []
    for entry in payload.entries:
        end = entry.offset + entry.numel
        if end > payload.numel or entry.numel != math.prod(entry.shape):
            raise BucketError(f"{entry.name} does not fit its bucket or its shape")
        views.append((entry.name, flat[entry.offset : end].view(entry.shape)))
    return views


def check_parameter(served: torch.Tensor, name: str, values: list[float], key: str) -> None:
    """Raise ``BucketError`` unless the replica's ``name`` holds exactly ``values``."""
    expected = torch.tensor(values, dtype=torch.float32).reshape(served.shape)
    if not torch.equal(served.detach().float().cpu(), expected):
        raise BucketError(f"the replica on {key} holds another {name} than the trainer sent")
