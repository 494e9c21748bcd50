"""Batch forming (exact size, whole groups, minimums, weights) and the settings' argv."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from grpo_trainer.api.batching import EnvShare, Pending, form_batch
from grpo_trainer.api.settings import ApiSettings


def _queue(*items: tuple[int | None, int]) -> list[Pending]:
    return [Pending(seq, env, size) for seq, (env, size) in enumerate(items)]


def _env(env_id: int, weight: float = 1.0, minimum: float | None = None) -> EnvShare:
    return EnvShare(env_id, weight, minimum, connected=True)


def _seqs(batch: list[Pending] | None) -> list[int]:
    assert batch is not None
    return [p.seq for p in batch]


def test_fifo_with_one_environment() -> None:
    queue = _queue(*[(0, 4)] * 5)
    assert _seqs(form_batch(queue, 8, [_env(0)])) == [0, 1]


def test_waits_until_a_full_batch_is_queued() -> None:
    assert form_batch(_queue((0, 4)), 8, [_env(0)]) is None


def test_weights_split_the_batch() -> None:
    queue = _queue(*[(0, 2)] * 8, *[(1, 2)] * 8)
    batch = form_batch(queue, 8, [_env(0, weight=1), _env(1, weight=3)])
    assert batch is not None
    assert sum(p.size for p in batch if p.env_id == 1) == 6
    assert sum(p.size for p in batch if p.env_id == 0) == 2


def test_equal_weights_alternate_and_keep_per_env_fifo() -> None:
    queue = _queue(*[(0, 2)] * 4, *[(1, 2)] * 4)
    assert _seqs(form_batch(queue, 8, [_env(0), _env(1)])) == [0, 1, 4, 5]


def test_an_idle_environment_does_not_stall_the_others() -> None:
    queue = _queue(*[(0, 4)] * 2)
    assert _seqs(form_batch(queue, 8, [_env(0), _env(1, weight=10)])) == [0, 1]


def test_minimum_allocation_is_met_or_the_batch_waits() -> None:
    envs = [_env(0), _env(1, minimum=0.5)]
    assert form_batch(_queue(*[(0, 2)] * 6, (1, 2)), 8, envs) is None
    batch = form_batch(_queue(*[(0, 2)] * 6, (1, 2), (1, 2)), 8, envs)
    assert _seqs(batch) == [0, 1, 6, 7]


def test_disconnected_environment_minimum_is_ignored() -> None:
    envs = [_env(0), EnvShare(1, 1.0, 0.5, connected=False)]
    assert _seqs(form_batch(_queue(*[(0, 2)] * 4), 8, envs)) == [0, 1, 2, 3]


def test_mixed_group_sizes_still_make_an_exact_batch() -> None:
    queue = _queue((0, 6), (0, 6), (None, 2))
    batch = form_batch(queue, 8, [_env(0)])
    assert _seqs(batch) == [0, 2]
    assert form_batch(_queue((0, 6), (0, 6)), 8, [_env(0)]) is None


def test_settings_argv_and_defaults(tmp_path: Path) -> None:
    settings = ApiSettings(port=8123, max_batches_offpolicy=2)
    argv = settings.argv(run_dir=tmp_path)
    assert argv[:3] == [sys.executable, "-m", "grpo_trainer.api"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs["--host"] == "127.0.0.1"
    assert pairs["--port"] == "8123"
    assert pairs["--db"] == str(tmp_path / "rollouts.db")
    assert pairs["--max-batches-offpolicy"] == "2"
    assert "--token" not in pairs
    assert settings.health_url == "http://127.0.0.1:8123/health"
    with pytest.raises(ValueError, match="run directory"):
        settings.argv()


def test_settings_refuse_unknown_keys_and_open_hosts_without_token() -> None:
    with pytest.raises(ValidationError, match="extra"):
        ApiSettings(batch_size=8)
    with pytest.raises(ValidationError, match="token"):
        ApiSettings(host="0.0.0.0")
    open_host = ApiSettings(host="0.0.0.0", token="s3cr3t-value")
    assert open_host.url == "http://127.0.0.1:8000"
    assert "s3cr3t-value" not in open_host.argv(Path("/r"))
    assert open_host.environment() == {"GRPO_API_TOKEN": "s3cr3t-value"}
    assert "s3cr3t-value" not in repr(open_host)


def test_exact_fit_picks_the_oldest_combination() -> None:
    queue = _queue((0, 5), (0, 5), (0, 3), (0, 6), (0, 3), (0, 2))
    assert _seqs(form_batch(queue, 8, [_env(0)])) == [0, 2]


def test_no_exact_fit_waits() -> None:
    queue = _queue(*[(0, 3)] * 50)
    assert form_batch(queue, 8, [_env(0)]) is None


def test_exact_fit_when_greedy_gets_stuck() -> None:
    queue = _queue((0, 6), (0, 5), (0, 3), (0, 2))
    assert _seqs(form_batch(queue, 8, [_env(0)])) == [0, 3]
    assert _seqs(form_batch(_queue((0, 6), (0, 5), (0, 3)), 8, [_env(0)])) == [1, 2]
