"""Delta weight transfer: send only the elements that changed since the last sync.

After one optimizer step at a small learning rate most bf16 weights round to the value
they had (an Adam step moves a weight by ~lr; one bf16 step of a weight of 0.02 is 8e-5),
so a sync can send the changed elements alone: per bucket of consecutive tensors, their
positions (int32, relative to the bucket) and values, or the whole bucket where more than
a third changed (6 bytes a changed element against 2 a dense one; the first sync is dense).
The sender keeps what it sent last (one copy of the sent tensors, on its device); the
receiver applies each bucket to its own tensors and compares a checksum of the result with
the sender's, bucket by bucket: a lost or misapplied element raises ``DeltaMismatch``.

The protocol is one ``broadcast`` per message (header, then positions and values), so one
code path serves gloo (tests), NCCL between processes, and vLLM's NCCL weight-transfer
group (``vllm_shared.py`` sends, ``vllm_worker.py`` receives). Like verl's delta sync
(changed bf16 elements only) with an end-to-end check. Both sides cut the same layout (names,
shapes, dtypes, in order) into the same buckets (``plan``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

Broadcast = Callable[[Tensor], None]
"""Broadcast a tensor from the sender (rank 0) into every receiver's tensor of that shape."""
BUCKET_BYTES = 256 << 20
"""Bytes of one bucket (dense size): bounds the extra memory of a dense bucket's send."""
DENSE, SPARSE = 0, 1
_CHUNK = 1 << 24
_MODULUS = 65521


class DeltaMismatch(RuntimeError):
    """The receiver's tensors do not checksum to the sender's after a bucket was applied."""


@dataclass(frozen=True)
class Entry:
    """One tensor of the layout: ``name``, ``shape``, ``dtype`` (a torch dtype name)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def plan(layout: Iterable[Entry], bucket_bytes: int = BUCKET_BYTES) -> list[list[Entry]]:
    """The layout in order, cut into buckets of one dtype and at most ``bucket_bytes``
    (a larger tensor is a bucket alone). Both sides call it on the same layout."""
    buckets: list[list[Entry]] = []
    size = bucket_bytes
    for entry in layout:
        nbytes = entry.numel * torch.empty((), dtype=getattr(torch, entry.dtype)).element_size()
        if size + nbytes > bucket_bytes or buckets[-1][0].dtype != entry.dtype:
            buckets.append([])
            size = 0
        buckets[-1].append(entry)
        size += nbytes
    return buckets


def _words(tensor: Tensor) -> Tensor:
    """The tensor's bits as integers of its width (flat): compared and summed exactly."""
    flat = tensor.detach().reshape(-1)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return flat.view(width[flat.element_size()])


def checksum(tensors: Sequence[Tensor]) -> Tensor:
    """Position-weighted sum of the tensors' bits (int64, wrapping), as a 0-d tensor on
    their device: equal on both sides exactly when every element (and its place) agrees,
    but for collisions of a 64-bit sum."""
    device = tensors[0].device if tensors else torch.device("cpu")
    total = torch.zeros((), dtype=torch.int64, device=device)
    position = 0
    for tensor in tensors:
        words = _words(tensor)
        for start in range(0, words.numel(), _CHUNK):
            chunk = words[start : start + _CHUNK].to(torch.int64)
            first = position + start
            weights = torch.arange(first, first + chunk.numel(), device=device) % _MODULUS + 1
            total += (chunk * weights).sum()
        position += words.numel()
    return total


@dataclass
class SendStats:
    """What one sync sent: elements changed and bytes on the wire, over all buckets."""

    elements: int = 0
    changed: int = 0
    bytes_sent: int = 0
    dense_buckets: int = 0
    buckets: int = 0

    @property
    def changed_fraction(self) -> float:
        return self.changed / max(self.elements, 1)


class DeltaSender:
    """The sending side: keeps the last-sent tensors, sends each bucket's changes."""

    def __init__(self, layout: Sequence[Entry], bucket_bytes: int = BUCKET_BYTES) -> None:
        self.buckets = plan(layout, bucket_bytes)
        self.last: dict[str, Tensor] = {}

    def send(self, named: Iterator[tuple[str, Tensor]], broadcast: Broadcast) -> SendStats:
        """Send ``named`` (the layout's tensors, in order) as deltas against the last send."""
        stats = SendStats()
        for bucket in self.buckets:
            tensors = []
            for entry in bucket:
                name, tensor = next(named)
                if name != entry.name or tuple(tensor.shape) != entry.shape:
                    raise ValueError(f"sent {name} {tuple(tensor.shape)} where the layout has "
                                     f"{entry.name} {entry.shape}")  # fmt: skip
                tensors.append(tensor.detach())
            self._send_bucket(bucket, tensors, broadcast, stats)
        return stats

    def _send_bucket(
        self, bucket: list[Entry], tensors: list[Tensor], broadcast: Broadcast, stats: SendStats
    ) -> None:
        numel = sum(entry.numel for entry in bucket)
        changed: list[Tensor] = []
        known = all(entry.name in self.last for entry in bucket)
        for entry, tensor in zip(bucket, tensors, strict=True) if known else ():
            changed.append((_words(tensor) != _words(self.last[entry.name])).nonzero().squeeze(1))
        counts = [c.numel() for c in changed]
        changed_total = sum(counts) if known else numel
        size = tensors[0].element_size()
        dense = not known or changed_total * (4 + size) >= numel * size
        checks = checksum(tensors)
        header = torch.tensor([DENSE if dense else SPARSE, changed_total], device=checks.device)
        header = torch.cat([header, checks[None], torch.tensor(counts or [0] * len(bucket),
                                                               device=checks.device)])  # fmt: skip
        broadcast(header)
        if dense:
            flat = torch.cat([t.reshape(-1) for t in tensors])
            broadcast(flat)
            stats.bytes_sent += flat.numel() * size
            stats.dense_buckets += 1
        elif changed_total:
            starts = _starts(bucket)
            index = torch.cat([c + s for c, s in zip(changed, starts, strict=True)])
            index = index.to(torch.int32)
            values = torch.cat([t.reshape(-1)[c] for t, c in zip(tensors, changed, strict=True)])
            broadcast(index)
            broadcast(values)
            stats.bytes_sent += index.numel() * 4 + values.numel() * size
        stats.bytes_sent += header.numel() * 8
        for entry, tensor in zip(bucket, tensors, strict=True):
            kept = self.last.get(entry.name)
            if kept is None:
                self.last[entry.name] = tensor.clone()
            else:
                kept.copy_(tensor)
        stats.elements += numel
        stats.changed += changed_total
        stats.buckets += 1


def _starts(bucket: list[Entry]) -> list[int]:
    """Each tensor's first position in its bucket."""
    starts, offset = [], 0
    for entry in bucket:
        starts.append(offset)
        offset += entry.numel
    return starts


def receive(
    targets: Sequence[tuple[str, Tensor]],
    broadcast: Broadcast,
    layout: Sequence[Entry],
    bucket_bytes: int = BUCKET_BYTES,
) -> int:
    """Apply a ``DeltaSender.send`` to ``targets`` (the layout's tensors, in order, written
    in place) and check every bucket's checksum; returns the elements written.

    Every bucket is received before a mismatch is raised (``DeltaMismatch`` names each
    bucket that failed): a receiver that stopped early would leave the sender blocked in
    its next broadcast."""
    by_name = dict(targets)
    written = 0
    failures = []
    for number, bucket in enumerate(plan(layout, bucket_bytes)):
        tensors = [by_name[entry.name] for entry in bucket]
        device = tensors[0].device
        header = torch.empty(3 + len(bucket), dtype=torch.int64, device=device)
        broadcast(header)
        kind, total, expected, *counts = header.tolist()
        with torch.no_grad():
            if kind == DENSE:
                total = sum(entry.numel for entry in bucket)
                flat = torch.empty(total, dtype=tensors[0].dtype, device=device)
                broadcast(flat)
                for tensor, start, entry in zip(tensors, _starts(bucket), bucket, strict=True):
                    tensor.copy_(flat[start : start + entry.numel].view(tensor.shape))
            elif total:
                index = torch.empty(total, dtype=torch.int32, device=device)
                values = torch.empty(total, dtype=tensors[0].dtype, device=device)
                broadcast(index)
                broadcast(values)
                first = 0
                for tensor, start, count in zip(tensors, _starts(bucket), counts, strict=True):
                    where = index[first : first + count].to(torch.int64) - start
                    tensor.view(-1)[where] = values[first : first + count]
                    first += count
        written += total
        got = int(checksum(tensors))
        if got != expected:
            names = ", ".join(entry.name for entry in bucket[:3])
            what = "the whole bucket" if kind == DENSE else f"{total} changed elements"
            failures.append(
                f"bucket {number} ({names}{', ...' if len(bucket) > 3 else ''}): checksum "
                f"{got} after applying {what}, the sender's is {expected}"
            )
    if failures:
        raise DeltaMismatch("; ".join(failures))
    return written
