"""The run's token on the inference servers we do not write ourselves: vLLM and SGLang.

vLLM's ``--api-key`` guards ``/v1/*`` only; beyond loopback the command line adds
``--middleware grpo_trainer.sync.vllm_guard.EnvTokenGuard``, which guards its dev routes
too. vLLM is not installed here: the guard is loaded the way vLLM's ``build_app`` loads a
``--middleware`` (import by dotted path, ``app.add_middleware(cls)`` with no arguments)
into a FastAPI app with vLLM's routes, on a real uvicorn server, and called by our real
sync client. SGLang's ``--api-key`` reaches it through our launcher, never its argv; a
stand-in ``sglang.launch_server`` module (SGLang is not installed either) reports what
SGLang would parse and what ``ps`` would show.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.testclient import TestClient
from serve_helpers import free_port

from grpo_trainer.serve.command_lines import (
    SGLANG_TOKEN_LAUNCH,
    VLLM_LEASE,
    VLLM_TOKEN_GUARD,
    inference_command,
)
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.sync.client import InferenceClient, SyncError
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan

REPO = Path(__file__).resolve().parents[2]
KEY = "run-token-5d1e"
DEV_ROUTES = ("/pause", "/resume", "/collective_rpc", "/sleep", "/update_weights")


def vllm_like_app() -> FastAPI:
    """vLLM's routes that matter here, with our middlewares added as ``build_app`` adds
    each ``--middleware`` class: the lease, then the guard (outermost)."""
    app = FastAPI()
    for path in ("/health", "/metrics", "/v1/models"):
        app.add_api_route(path, lambda: {"ok": True}, methods=["GET"])
    for path in DEV_ROUTES:
        app.add_api_route(path, lambda: {"ok": True}, methods=["POST"])

    @app.websocket("/v1/realtime")
    async def realtime(socket: WebSocket) -> None:
        await socket.accept()
        await socket.send_text("open")
        await socket.close()

    for dotted in (VLLM_LEASE, VLLM_TOKEN_GUARD):  # the command's order, added as vLLM does
        module_path, name = dotted.rsplit(".", 1)
        app.add_middleware(getattr(importlib.import_module(module_path), name))
    return app


@pytest.fixture
def vllm_like_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(vllm_like_app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        InferenceClient(url).wait_healthy(30)
        yield url
    finally:
        server.should_exit = True
        thread.join(10)


def test_vllm_guard_covers_dev_routes_and_our_client_sends_the_token(
    vllm_like_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with httpx.Client(base_url=vllm_like_server, timeout=10) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/metrics").status_code == 200
        assert http.get("/v1/models").status_code == 401
        for path in DEV_ROUTES:
            answer = http.post(path)
            assert answer.status_code == 401, path
            assert "missing 'Authorization: Bearer' token" in answer.text
        wrong = http.post("/pause", headers={"Authorization": f"Bearer {KEY}x"})
        assert wrong.status_code == 401 and "wrong bearer token" in wrong.text
    client = InferenceClient(vllm_like_server, attempts=1)  # reads VLLM_API_KEY, as ours do
    try:
        for path in DEV_ROUTES:
            assert client.post(path).json() == {"ok": True}
        assert client.get("/v1/models").status_code == 200
    finally:
        client.close()
    monkeypatch.delenv("VLLM_API_KEY")
    keyless = InferenceClient(vllm_like_server, attempts=1)
    try:
        with pytest.raises(SyncError, match="HTTP 401"):
            keyless.post("/collective_rpc")
    finally:
        keyless.close()


def test_vllm_guard_refuses_a_websocket_without_the_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM serves websocket routes too (its realtime API): the handshake needs the token."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    with TestClient(vllm_like_app()) as client:
        with (
            pytest.raises(WebSocketDisconnect) as refused,
            client.websocket_connect("/v1/realtime"),
        ):
            pass
        assert refused.value.code == 1008
        bearer = {"Authorization": f"Bearer {KEY}"}
        with client.websocket_connect("/v1/realtime", headers=bearer) as socket:
            assert socket.receive_text() == "open"


def test_vllm_keeps_a_lease_behind_the_guard(vllm_like_server: str) -> None:
    lease = f"{vllm_like_server}/grpo/lease"
    assert httpx.get(lease, timeout=10).status_code == 401
    bearer = {"Authorization": f"Bearer {KEY}"}
    body = {"holder": "h:/runs/a", "label": "run a", "ttl": 30}
    assert httpx.post(lease, json=body, headers=bearer, timeout=10).status_code == 200
    assert httpx.get(lease, headers=bearer, timeout=10).json()["holder"] == "h:/runs/a"
    assert httpx.get(f"{vllm_like_server}/health", timeout=10).status_code == 200


def test_vllm_guard_without_a_token_refuses_to_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    module_path, name = VLLM_TOKEN_GUARD.rsplit(".", 1)
    guard = getattr(importlib.import_module(module_path), name)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is not set"):
        guard(FastAPI())


def middlewares(argv: list[str]) -> list[str]:
    """The ``--middleware`` classes of a vLLM command, in the order vLLM adds them (each
    added later wraps the ones before: the last is outermost)."""
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--middleware"]


def test_vllm_command_adds_the_guard_beyond_loopback_only() -> None:
    for mode in ("none", "shared_vllm", "lora_only", "colocate"):
        wide = inference_command(
            InferenceSettings(backend="vllm", host="0.0.0.0"), mode=mode, model="/m"
        ).argv
        assert middlewares(wide) == [VLLM_LEASE, VLLM_TOKEN_GUARD], mode  # the guard outside
        local = inference_command(InferenceSettings(backend="vllm"), mode=mode, model="/m").argv
        assert middlewares(local) == [VLLM_LEASE], mode


def test_cluster_plan_guards_vllm_and_keeps_the_token_off_every_command(tmp_path: Path) -> None:
    plan = build_plan(load_profile(REPO / "profiles/qwen2.5-7b-2node.toml"), tmp_path / "run")
    specs = {spec.name: spec for spec in plan.specs}
    token = specs["inference"].env["VLLM_API_KEY"]
    served = specs["inference"].command
    assert middlewares(served)[-1] == VLLM_TOKEN_GUARD
    assert "--api-key" not in served
    for spec in plan.specs:
        assert not any(token in part for part in spec.command), spec.name


def sglang_stand_in(tmp_path: Path) -> Path:
    """A ``sglang.launch_server`` that prints what it parses and what ``ps`` shows."""
    package = tmp_path / "stand_in" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(
        "import json, sys\n"
        "cmdline = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        "print(json.dumps({'name': __name__, 'argv': sys.argv[1:],\n"
        "                  'cmdline': [part.decode() for part in cmdline if part]}))\n"
    )
    return package.parent


def test_sglang_beyond_loopback_gets_its_key_from_the_environment(tmp_path: Path) -> None:
    settings = InferenceSettings(backend="sglang", host="0.0.0.0", port=free_port())
    argv = inference_command(settings, mode="none", model="/m").argv
    assert argv[:3] == [sys.executable, "-m", SGLANG_TOKEN_LAUNCH]
    assert "--api-key" not in argv
    path = f"{sglang_stand_in(tmp_path)}{os.pathsep}{REPO}"
    env = {**os.environ, "PYTHONPATH": path, "VLLM_API_KEY": KEY}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(done.stdout)
    assert seen["name"] == "__main__"
    assert seen["argv"][-2:] == ["--api-key", KEY] and seen["argv"][:2] == ["--model-path", "/m"]
    assert seen["cmdline"][-2:] != ["--api-key", KEY] and KEY not in " ".join(seen["cmdline"])

    env.pop("VLLM_API_KEY")
    refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "VLLM_API_KEY is not set" in refused.stderr

    custom = settings.model_copy(update={"sglang_executable": ["/opt/sglang/bin/serve"]})
    with pytest.raises(ValueError, match=r"must end with '-m sglang\.launch_server'"):
        inference_command(custom, mode="none", model="/m")
    loopback = settings.model_copy(update={"host": "127.0.0.1"})
    assert inference_command(loopback, mode="none", model="/m").argv[2] == "sglang.launch_server"
