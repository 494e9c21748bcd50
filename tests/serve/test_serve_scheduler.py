"""The batch scheduler waits for company while requests keep arriving, within a bound."""

from __future__ import annotations

import threading

from grpo_trainer.serve.scheduler import BatchScheduler, Pending


def _paced_batches(window: float, max_wait: float, count: int, gap: float) -> list[list[int]]:
    """Submit ``count`` items ``gap`` seconds apart; the batches they were run in."""
    batches: list[list[int]] = []

    def run_batch(batch: list[Pending[int]]) -> None:
        batches.append([p.item for p in batch])
        for pending in batch:
            pending.future.set_result(None)

    scheduler: BatchScheduler[int] = BatchScheduler(
        run_batch, max_rows=1000, window=window, max_wait=max_wait
    )
    paced = threading.Event()  # never set: its wait() paces the arrivals
    futures = []
    for item in range(count):
        if item:
            paced.wait(gap)
        futures.append(scheduler.submit(item, adapter=None, rows=8))
    for future in futures:
        future.result(timeout=30)
    return batches


def test_requests_arriving_within_the_window_of_each_other_share_one_batch() -> None:
    # the 8 arrivals span 0.28 s, more than the window, but each comes within it of the last
    assert _paced_batches(window=0.2, max_wait=30.0, count=8, gap=0.04) == [list(range(8))]


def test_a_steady_stream_is_cut_at_max_wait() -> None:
    batches = _paced_batches(window=0.5, max_wait=0.15, count=6, gap=0.05)
    assert len(batches) >= 2
    assert [i for b in batches for i in b] == list(range(6))
