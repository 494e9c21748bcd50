"""Fixtures of the weight-sync tests: a tiny model and the real built-in server per mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sync_helpers import ModeServer

from grpo_trainer.models import build_tiny_model


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("sync-model") / "model", seed=2)


@pytest.fixture
def mode_server(
    request: pytest.FixtureRequest, tmp_path: Path, base_model: Path
) -> Iterator[ModeServer]:
    """The built-in server started for ``request.param``'s mode (``ModeServer``)."""
    server = ModeServer(request.param, base_model, tmp_path)
    server.start()
    yield server
    server.stop()
