"""The supervisor's inference tokens/s on the built-in server's real ``/metrics``.

The GPU benchmark's ``vllm/none`` cell once reported 23 tokens/s where every other cell
reported thousands: with the server restarted at every sync, the sampler needed two scrapes
of one instance before it gave a rate, and a restart's first scrape was spent as a new
baseline, so short runs between restarts gave no sample at all. Now each instance counts
from the moment it became ready, and a rate never spans two instances.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from serve_helpers import free_port

from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings
from grpo_tui.supervisor.samplers import Samplers, Scrape

TOKENS = 16


def generate(url: str, n: int) -> int:
    body = {
        "model": "policy",
        "prompt": "abc",
        "n": n,
        "max_tokens": TOKENS,
        "ignore_eos": True,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return n * TOKENS


async def sample(samplers: Samplers, server: ServerProcess, ready_at: float):
    assert server.process is not None
    at = Scrape(f"{server.base_url}/metrics", server.process.pid, ready_at)
    before = time.time()
    _, values = await samplers.sample({}, {"inference": at})
    return values.get("inference/tokens_per_s"), before, time.time()


async def test_each_instance_is_measured_from_its_first_scrape(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two real instances stand for one server before and after a restart: both start
    side by side (to save a start), the sampler sees the pid change under one name."""

    servers: list[ServerProcess] = []

    def start(name: str) -> tuple[ServerProcess, float]:
        settings = InferenceSettings(port=free_port(), max_model_len=64)
        launch = inference_command(settings, mode="none", model=str(tiny_model_dir))
        server = ServerProcess(launch, settings.base_url, tmp_path / f"{name}.log")
        servers.append(server)  # stopped in the end even if its start fails
        server.start()
        return server, time.time()

    try:
        with ThreadPoolExecutor(2) as pool:
            starts = [pool.submit(start, name) for name in ("before", "after")]
            (first, first_ready), (second, second_ready) = [f.result() for f in starts]
        async with httpx.AsyncClient() as client:
            samplers = Samplers(client)
            made = await asyncio.to_thread(generate, first.base_url, 2)
            rate, before, after = await sample(samplers, first, first_ready)
            assert rate is not None, "the first scrape of an instance must give a rate"
            assert made / (after - first_ready) <= rate <= made / (before - first_ready)

            # the restart: the same name, a new pid, a counter from zero again
            made = await asyncio.to_thread(generate, second.base_url, 4)  # more than before
            rate, before, after = await sample(samplers, second, second_ready)
            assert rate is not None
            # from zero at its own start, not the difference to the old instance's counter
            assert made / (after - second_ready) <= rate <= made / (before - second_ready)
    finally:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(ServerProcess.stop, servers))
