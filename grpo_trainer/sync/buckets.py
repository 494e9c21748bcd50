"""Weight buckets from a multi-rank trainer, trainer side: gather, pack, share.

Every rank gathers the whole parameters (``sharded.full_parameters``, one at a time, in
order: a collective) into flat buckets of at most ``BUCKET_BYTES`` (a larger parameter is
a bucket of its own) on its own device, and shares each bucket's memory for the inference
replica beside it (``serve/buckets.py`` opens it). Extra memory per rank: one bucket and
one gathered parameter, never a second model.

Transports: ``CudaIpcTransport`` (a CUDA IPC handle; the key is the GPU's UUID, which the
vLLM replica on that GPU answers to) and ``SharedMemoryTransport`` (CPU: a file in
``/dev/shm`` that the built-in server's replica ``i`` maps; the key is ``cpu:<rank>``).
Everything else (planning, packing, who sends what) is one code path for both.
"""

from __future__ import annotations

import base64
import itertools
import math
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, Protocol

import torch
from torch import nn
from torch.multiprocessing.reductions import reduce_tensor

from grpo_trainer.serve.buckets import BucketPayload
from grpo_trainer.serve.shared import TensorEntry
from grpo_trainer.sync.client import SyncError
from grpo_trainer.sync.sharded import full_parameters

BUCKET_BYTES = 512 << 20
"""Most bytes of one bucket: bounds the extra memory of a sync on each rank's device
(Qwen2.5-0.5B in bf16 is 2 buckets, 7B about 30)."""

Kind = Literal["cuda_ipc", "shm"]
SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


class BucketTransport(Protocol):
    """How one rank's bucket memory is allocated and made openable by its replica."""

    key: str
    """The device the bucket is for: the replica with this key loads it."""

    def allocate(self, numel: int, dtype: torch.dtype) -> torch.Tensor: ...

    def share(self, flat: torch.Tensor) -> tuple[Kind, str]:
        """``(transport name, handle)`` of ``flat``'s memory, writes finished."""
        ...

    def release(self, flat: torch.Tensor) -> None:
        """After the replica has loaded the bucket."""
        ...


class CudaIpcTransport:
    """The bucket on this rank's GPU, opened by the vLLM replica on the same GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.key = str(torch.cuda.get_device_properties(device).uuid)

    def allocate(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        torch.cuda.ipc_collect()  # blocks of earlier buckets whose receivers let go
        return torch.empty(numel, dtype=dtype, device=self.device)

    def share(self, flat: torch.Tensor) -> tuple[Kind, str]:
        torch.cuda.synchronize(self.device)
        return "cuda_ipc", base64.b64encode(pickle.dumps(reduce_tensor(flat))).decode()

    def release(self, flat: torch.Tensor) -> None:
        """Nothing to do now: torch frees a shared block once this process drops it and
        the receiver has closed it (``ipc_collect`` at the next allocation)."""


class SharedMemoryTransport:
    """The bucket in a shared-memory file, mapped by the built-in server's replica."""

    _serial = itertools.count()

    def __init__(self, rank: int) -> None:
        self.key = f"cpu:{rank}"
        self._paths: dict[int, Path] = {}

    def allocate(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        path = SHM_DIR / f"grpo-bucket-{os.getpid()}-{next(self._serial)}.bin"
        flat = torch.from_file(str(path), shared=True, size=numel, dtype=dtype)
        self._paths[flat.data_ptr()] = path
        return flat

    def share(self, flat: torch.Tensor) -> tuple[Kind, str]:
        return "shm", str(self._paths[flat.data_ptr()])

    def release(self, flat: torch.Tensor) -> None:
        self._paths.pop(flat.data_ptr()).unlink(missing_ok=True)


def transport_for(device: str, rank: int) -> BucketTransport:
    """CUDA IPC on a GPU rank, shared memory on a CPU rank."""
    if device.startswith("cuda"):
        return CudaIpcTransport(torch.device(device))
    return SharedMemoryTransport(rank)


def plan_buckets(model: nn.Module, element_size: int, limit: int) -> list[list[str]]:
    """Parameter names in order, cut into buckets of at most ``limit`` bytes (whole
    parameters; one larger than ``limit`` is a bucket alone). The same on every rank: it
    reads the global shapes (a ``DTensor``'s shape is the whole parameter's)."""
    buckets: list[list[str]] = []
    size = limit
    for name, param in model.named_parameters():
        nbytes = math.prod(param.shape) * element_size
        if size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(name)
        size += nbytes
    return buckets


def gathered_buckets(
    model: nn.Module,
    *,
    dtype: torch.dtype,
    device: str,
    transport: BucketTransport,
    limit: int = BUCKET_BYTES,
) -> Iterator[tuple[torch.Tensor, BucketPayload]]:
    """Each bucket's flat tensor (shared by ``transport``) and its payload, in order.

    Collective: every rank iterates to the end. The caller releases each flat tensor
    (``transport.release``) once the replicas have loaded it.
    """
    element_size = torch.empty((), dtype=dtype).element_size()
    shapes = {name: list(param.shape) for name, param in model.named_parameters()}
    params = full_parameters(model, dtype, device)
    dtype_name = str(dtype).removeprefix("torch.")
    for names in plan_buckets(model, element_size, limit):
        numel = sum(math.prod(shapes[name]) for name in names)
        flat = transport.allocate(numel, dtype)
        entries, offset = [], 0
        for name in names:
            gathered, whole = next(params)
            if gathered != name:
                raise SyncError(f"gathered {gathered} where the bucket plan has {name}")
            flat[offset : offset + whole.numel()].copy_(whole.reshape(-1))
            entries.append(
                TensorEntry(name=name, shape=shapes[name], offset=offset, numel=whole.numel())
            )
            offset += whole.numel()
            del whole
        kind, handle = transport.share(flat)
        yield (
            flat,
            BucketPayload(
                transport=kind, handle=handle, dtype=dtype_name, numel=numel, entries=entries
            ),
        )
        del flat  # before the next bucket is allocated: one bucket at a time
