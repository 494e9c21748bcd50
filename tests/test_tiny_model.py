"""The tiny model's build cache: a hit gives the very files a fresh build writes, without
importing torch or transformers; the key changes with the flags and the builder's code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_trainer import tiny_model


def build(out: Path, cache: Path, *flags: str) -> str:
    """Run the CLI as the model process does; its last line, and whether torch got imported."""
    code = (
        "import sys; from grpo_trainer.tiny_model import main; main(sys.argv[1:]); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch')"
    )
    env = {**os.environ, "GRPO_TUI_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", code, "build", str(out), *flags],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_cache_hit_copies_a_fresh_builds_files_without_torch(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fresh = build(tmp_path / "fresh", cache, "--seed", "5", "--no-cache")
    assert "(built)" in fresh and not (cache / "tiny-models").exists()
    first = build(tmp_path / "first", cache, "--seed", "5")
    assert "built, kept in" in first and "torch imported" in first
    again = build(tmp_path / "again", cache, "--seed", "5")
    assert "copied from" in again and "no torch" in again
    expected = files(tmp_path / "fresh")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(expected)
    assert files(tmp_path / "first") == expected
    assert files(tmp_path / "again") == expected
    assert len(list((cache / "tiny-models").iterdir())) == 1  # no staging dir left behind


def test_key_follows_flags_and_builder_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = {"seed": 0, "hidden_size": 64}
    key = tiny_model.cache_key(shape)
    assert tiny_model.cache_key(dict(shape)) == key
    assert tiny_model.cache_key({**shape, "seed": 1}) != key
    edited = tmp_path / "models.py"
    edited.write_bytes(tiny_model.BUILDER.read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(tiny_model, "BUILDER", edited)
    assert tiny_model.cache_key(shape) != key


def test_cache_only_fills_the_cache_and_writes_nothing_else(tmp_path: Path) -> None:
    """A large shape is built ahead of its runs (benchmarks/seven_b_1gpu.py): the cache
    gets the entry a run's build then copies, without importing torch again."""
    cache = tmp_path / "cache"
    first = build(tmp_path / "ahead", cache, "--seed", "6", "--cache-only")
    assert "tiny model built in " in first and not (tmp_path / "ahead").exists()
    again = build(tmp_path / "ahead", cache, "--seed", "6", "--cache-only")
    assert "tiny model cached in " in again and "no torch" in again
    run = build(tmp_path / "run", cache, "--seed", "6")
    assert "copied from" in run and "no torch" in run
    assert files(tmp_path / "run") == files(Path(first.split(" in ")[1].splitlines()[0]))
