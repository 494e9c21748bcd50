"""Fixtures for environment tests: a tiny model, and real servers stopped at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from env_procs import Proc

from grpo_trainer.models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen2 model directory with the character-level tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[[str, list[str]], Proc]]:
    """Factory: ``spawn(name, argv)`` starts a process; every one is stopped at teardown."""
    procs: list[Proc] = []

    def start(name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, tmp_path / f"{name}.log").start()
        procs.append(proc)
        return proc

    yield start
    for proc in reversed(procs):
        proc.stop()
