"""Fixtures running the real built-in server (a child process) on a real tiny model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from serve_helpers import MAX_MODEL_LEN, MAX_NUM_SEQS, free_port

from grpo_trainer.models import build_tiny_model
from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("serve-model") / "model", seed=1)


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[ServerProcess]:
    """One LoRA-enabled server for all tests here; each leaves it as it found it. Sleep
    mode off (a capability the profile can turn off): its refusal is tested too."""
    settings = InferenceSettings(
        port=free_port(),
        max_model_len=MAX_MODEL_LEN,
        enable_sleep_mode=False,
        extra_args=["--max-num-seqs", str(MAX_NUM_SEQS)],
    )
    launch = inference_command(settings, mode="lora_only", model=str(tiny_model_dir))
    process = ServerProcess(launch, settings.base_url, tmp_path_factory.mktemp("log") / "s.log")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        yield http


@pytest.fixture
def complete(client: httpx.Client) -> Callable[..., dict]:
    """POST /v1/completions and return the JSON body, asserting 200."""

    def call(**body: object) -> dict:
        response = client.post("/v1/completions", json={"model": "policy-base", **body})
        assert response.status_code == 200, response.text
        return response.json()

    return call
