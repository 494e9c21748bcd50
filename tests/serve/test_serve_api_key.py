"""The built-in server's bearer token (``--api-key`` / ``VLLM_API_KEY``, vLLM's names).

On a cluster the server listens beyond loopback: without a key it refuses to start, and
with one every request but ``/health`` and ``/metrics`` needs it. Our clients (the sync
client, environments) send it from ``VLLM_API_KEY``.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from serve_helpers import free_port

from grpo_trainer.serve.__main__ import main as serve_main
from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.sync.client import InferenceClient

KEY = "k-1f3a9c"


def test_non_loopback_host_without_a_key_exits_2(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(SystemExit) as done:
        serve_main([str(tiny_model_dir), "--host", "0.0.0.0"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "--api-key" in err and "VLLM_API_KEY" in err


@pytest.mark.timeout(240)
def test_key_guards_every_route_but_health_and_metrics(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = InferenceSettings(host="0.0.0.0", port=free_port())
    launch = inference_command(settings, mode="none", model=str(tiny_model_dir))
    launch = launch.model_copy(update={"env": {**launch.env, "VLLM_API_KEY": KEY}})
    url = f"http://127.0.0.1:{settings.port}"
    server = ServerProcess(launch, url, tmp_path / "server.log")
    server.start()
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/health").status_code == 200
            assert http.get("/metrics").status_code == 200
            assert http.get("/v1/models").status_code == 401
            wrong = http.get("/v1/models", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and "wrong" in wrong.text
            body = {"model": "policy", "prompt": [1, 2], "max_tokens": 1}
            assert http.post("/v1/completions", json=body).status_code == 401
        monkeypatch.setenv("VLLM_API_KEY", KEY)
        client = InferenceClient(url)
        assert client.call("GET", "/v1/models").status_code == 200
        client.http.close()
    finally:
        server.stop()
