"""The built-in server's data-parallel replicas (``--data-parallel-size``, CPU colocate).

A real server started as the role layer starts it for ``colocate`` with 2 trainer ranks:
requests that arrive while it sleeps wait and are all served after the wake-up, none lost,
spread over both replicas (``/metrics`` counts each replica under vLLM's ``engine`` label).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from serve_helpers import MAX_MODEL_LEN, completion, free_port

from grpo_trainer.models import load_model
from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings

REQUESTS = 12
TOKENS = 6


@pytest.fixture(scope="module")
def replicated(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[ServerProcess]:
    settings = InferenceSettings(
        port=free_port(), max_model_len=MAX_MODEL_LEN, data_parallel_size=2
    )
    run_dir = tmp_path_factory.mktemp("replicas")
    launch = inference_command(
        settings, mode="colocate", model=str(tiny_model_dir), shared_dir=str(run_dir / "w")
    )
    assert "--data-parallel-size" in launch.argv and "--shared-weights" not in launch.argv
    process = ServerProcess(launch, settings.base_url, run_dir / "server.log")
    process.start()
    yield process
    process.stop()


def per_engine_tokens(http: httpx.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    pattern = r'vllm:generation_tokens_total\{model_name="policy",engine="(\d)"\} (\S+)'
    return {engine: float(value) for engine, value in re.findall(pattern, text)}


def test_requests_during_sleep_are_all_served_by_both_replicas_after_wake_up(
    replicated: ServerProcess,
) -> None:
    url = replicated.base_url
    with httpx.Client(base_url=url, timeout=60) as http, ThreadPoolExecutor(REQUESTS) as pool:
        before = per_engine_tokens(http)
        assert sorted(before) == ["0", "1"]
        assert http.post("/sleep", params={"level": 2}).json()["status"] == "sleeping"
        futures = [pool.submit(completion, url, f"prompt {i}", TOKENS) for i in range(REQUESTS)]
        deadline = time.monotonic() + 60
        while http.get("/is_sleeping").json()["waiting"] != REQUESTS:
            assert time.monotonic() < deadline, "not every request reached the server"
            time.sleep(0.02)
        assert not any(f.done() for f in futures), "a request was served while asleep"

        assert http.post("/wake_up", params={"tags": "weights"}).status_code == 200
        assert not any(f.done() for f in futures), "served before the KV cache woke"
        assert http.post("/wake_up", params={"tags": "kv_cache"}).json()["status"] == "awake"
        answers = [f.result(timeout=120) for f in futures]
        after = per_engine_tokens(http)

    assert [len(a["choices"][0]["token_ids"]) for a in answers] == [TOKENS] * REQUESTS
    served = {engine: after[engine] - before[engine] for engine in after}
    assert sum(served.values()) == REQUESTS * TOKENS  # none lost, none counted twice
    assert min(served.values()) > 0, f"one replica served nothing: {served}"


def test_a_load_without_every_replicas_bucket_changes_no_replica(
    replicated: ServerProcess, tiny_model_dir: Path, tmp_path: Path
) -> None:
    name, original = next(iter(load_model(tiny_model_dir).named_parameters()))
    bucket = tmp_path / "bucket.bin"  # replica 0's bucket: real, with other values
    flat = torch.from_file(str(bucket), shared=True, size=original.numel(), dtype=torch.float32)
    flat.fill_(0.25)
    entry = {"name": name, "shape": list(original.shape), "offset": 0, "numel": original.numel()}
    payload = {"transport": "shm", "handle": str(bucket), "dtype": "float32"}
    only_0 = {"cpu:0": {**payload, "numel": original.numel(), "entries": [entry]}}
    with httpx.Client(base_url=replicated.base_url, timeout=60) as http:

        def rpc(method: str, *args: object) -> httpx.Response:
            return http.post("/collective_rpc", json={"method": method, "args": list(args)})

        refused = rpc("grpo_load_bucket", json.dumps(only_0))
        assert refused.status_code == 400
        assert "no weight bucket for this replica's device cpu:1" in refused.text
        unchanged = rpc("grpo_check_parameter", name, original.flatten().tolist())
        assert unchanged.status_code == 200, unchanged.text  # replica 0 kept its weights too

        both = {**only_0, "cpu:1": only_0["cpu:0"]}
        loaded = rpc("grpo_load_bucket", json.dumps(both))
        assert loaded.json()["results"] == [1], loaded.text
        assert rpc("grpo_check_parameter", name, flat.tolist()).status_code == 200
        stale = rpc("grpo_check_parameter", name, original.flatten().tolist())
        assert stale.status_code == 400 and "replica on cpu:0" in stale.text
