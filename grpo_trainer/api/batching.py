"""How a batch is cut from the queue: exactly ``batch_size`` sequences, groups whole.

The rule, in order:

1. **Minimums.** Every connected environment with ``min_batch_allocation = m`` first gets
   its oldest groups until it holds at least ``ceil(m * batch_size)`` sequences of the
   batch. If one of them has too little queued, no batch is formed yet (the trainer waits
   for that environment, as in Atropos).
2. **Weights.** The rest is filled one group at a time: among environments whose oldest
   remaining group still fits, take the one whose share so far, ``sequences / weight``,
   would stay smallest; ties go to the older group. Within one environment the order is
   always FIFO. Groups posted without an ``env_id`` count as one environment of weight 1;
   a weight <= 0 counts as ``MIN_WEIGHT``.
3. **Exact fit.** If mixed group sizes leave the batch short, it is cut instead from the
   oldest groups whose sizes sum exactly to ``batch_size`` (weights ignored, among the
   oldest ``EXACT_WINDOW``); if none exist, no batch is formed yet.

With one environment (or equal weights and sizes) this is plain FIFO.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

EXACT_WINDOW = 1024
"""How many of the oldest groups the exact-fit fallback considers (bounds its cost)."""

MIN_WEIGHT = 0.01
"""Floor on an environment's weight: a weight <= 0 slows it but never starves it."""


@dataclass(frozen=True)
class Pending:
    """A queued group as batching sees it: position, origin and number of sequences."""

    seq: int
    env_id: int | None
    size: int


@dataclass(frozen=True)
class EnvShare:
    """What batching needs to know about one registered environment."""

    env_id: int
    weight: float
    min_batch_allocation: float | None
    connected: bool


def form_batch(
    queue: Sequence[Pending], batch_size: int, envs: Sequence[EnvShare]
) -> list[Pending] | None:
    """Pick the groups of the next batch from ``queue`` (FIFO order), or None to wait."""
    if sum(p.size for p in queue) < batch_size:
        return None
    by_env: dict[int | None, list[Pending]] = {}
    for item in queue:
        by_env.setdefault(item.env_id, []).append(item)
    weights = {e.env_id: max(e.weight, MIN_WEIGHT) for e in envs}

    chosen: list[Pending] = []
    counts: dict[int | None, int] = {}
    for env in envs:
        if not env.connected or not env.min_batch_allocation:
            continue
        need = math.ceil(env.min_batch_allocation * batch_size)
        own = by_env.get(env.env_id, [])
        while counts.get(env.env_id, 0) < need and own:
            item = own.pop(0)
            chosen.append(item)
            counts[env.env_id] = counts.get(env.env_id, 0) + item.size
        if counts.get(env.env_id, 0) < need:
            return None
    total = sum(p.size for p in chosen)
    if total > batch_size:
        return _exact_fifo(queue, batch_size)

    while total < batch_size:
        best: tuple[float, int, int | None] | None = None
        for env_id, own in by_env.items():
            head = next((p for p in own if p.size <= batch_size - total), None)
            if head is None:
                continue
            share = (counts.get(env_id, 0) + head.size) / weights.get(env_id, 1.0)
            key = (share, head.seq, env_id)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is None:
            break
        own = by_env[best[2]]
        item = next(p for p in own if p.size <= batch_size - total)
        own.remove(item)
        chosen.append(item)
        counts[best[2]] = counts.get(best[2], 0) + item.size
        total += item.size

    if total != batch_size:
        return _exact_fifo(queue, batch_size)
    return sorted(chosen, key=lambda p: p.seq)


def _exact_fifo(queue: Sequence[Pending], batch_size: int) -> list[Pending] | None:
    """Oldest-first subset of ``queue`` whose sizes sum to ``batch_size``, or None.

    Subset sum over the oldest ``EXACT_WINDOW`` groups in order; each reachable total keeps
    the first way found (a back-pointer), which favours older groups.
    """
    back: dict[int, tuple[int, int]] = {0: (-1, -1)}
    for index, item in enumerate(queue[:EXACT_WINDOW]):
        for total in list(back):
            new_total = total + item.size
            if new_total <= batch_size and new_total not in back:
                back[new_total] = (total, index)
        if batch_size in back:
            picked = []
            total = batch_size
            while total:
                total, index = back[total]
                picked.append(queue[index])
            return sorted(picked, key=lambda p: p.seq)
    return None
