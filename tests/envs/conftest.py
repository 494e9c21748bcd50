"""Fixtures for environment tests: a tiny model, and real servers stopped at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from env_procs import Proc, free_port, serve_argv

from grpo_trainer.models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen2 model directory with the character-level tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Factory: ``spawn(name, argv, env=None)`` starts a process; all are stopped at teardown."""
    procs: list[Proc] = []

    def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, tmp_path / f"{name}.log", env).start()
        procs.append(proc)
        return proc

    yield start
    for proc in reversed(procs):
        proc.stop()


@pytest.fixture(scope="session")
def inference(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One built-in inference server (tiny model, served as ``policy``) for the session."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc = Proc("serve", serve_argv(tiny_model, port), log).start()
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(f"{url}/health")
        yield url
    finally:
        proc.stop()
