"""Fixtures that run the real rollout API process on a free port with a temporary database."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from api_helpers import ApiServer


@pytest.fixture
def start_api(tmp_path: Path) -> Iterator[Callable[..., ApiServer]]:
    """Factory: ``start_api(*flags, db=None)`` starts a server; all are stopped afterwards."""
    servers: list[ApiServer] = []

    def start(*args: str, db: Path | str | None = None) -> ApiServer:
        server = ApiServer(
            db or tmp_path / "rollouts.db", tmp_path / f"api-{len(servers)}.log", list(args)
        )
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.kill(signal.SIGTERM)


@pytest.fixture(scope="module")
def shared_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """One server for a whole module of tests that reset it between them."""
    root = tmp_path_factory.mktemp("api")
    server = ApiServer(root / "rollouts.db", root / "api.log", ["--max-body-bytes", "200000"])
    server.start()
    yield server
    server.kill(signal.SIGTERM)


@pytest.fixture
def api(shared_api: ApiServer) -> Iterator[httpx.Client]:
    """A client of the shared server, which starts empty (``GET /reset_data``)."""
    with shared_api.client() as client:
        assert client.get("/reset_data").status_code == 200
        yield client
