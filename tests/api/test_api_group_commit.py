"""Group commit: concurrent posts share transactions, keep their order, all get committed."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from grpo_trainer.api.runner import StoreRunner
from grpo_trainer.api.store import Store


async def test_concurrent_inserts_share_commits_and_keep_order(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "q.db"), "full")
    commits: list[int] = []
    add_groups = store.add_groups

    def counting(rows: list[tuple[int | None, int, bytes]]) -> int:
        commits.append(len(rows))
        return add_groups(rows)

    store.add_groups = counting  # type: ignore[method-assign]
    runner = StoreRunner(store)
    try:
        await asyncio.gather(*(runner.add_groups([(None, 4, b'{"n":%d}' % i)]) for i in range(50)))
        assert sum(commits) == 50
        assert len(commits) < 50, "every post paid its own commit"
        pending = store.pending()
        assert [p.seq for p in pending] == sorted(p.seq for p in pending)
        bodies = store._payloads([p.seq for p in pending])
        assert bodies == [b'{"n":%d}' % i for i in range(50)]
    finally:
        runner.close()


async def test_a_failed_commit_fails_its_waiters_and_not_later_ones(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "q.db"), "full")
    runner = StoreRunner(store)
    try:
        with pytest.raises(sqlite3.Error):
            await runner.add_groups([(None, 4, object())])  # type: ignore[list-item]
        await runner.add_groups([(None, 4, b"{}")])
        assert len(store.pending()) == 1
    finally:
        runner.close()
