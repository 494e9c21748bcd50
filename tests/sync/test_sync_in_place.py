"""Syncs that keep the server serving, on the real built-in server under real load (CPU).

- ``none`` in place: the running server loads the synced checkpoint (one server start, the
  same pid); requests sent while it reloads are answered; afterwards it serves exactly the
  trainer's weights. Generation is paused (``wait``) around the load, as on vLLM.
- ``lora_only`` with two slots: each sync loads the adapter under a new name and the
  served name moves to it; requests asking for the name in force at their time never fail
  and generation is never paused; at most two adapters stay loaded.
- The hazard the two slots avoid (vllm-project/vllm#13698: vLLM's engine died when an
  adapter was reloaded in place under running requests): the built-in server refuses such
  a reload (409) and keeps serving, so a regression to in-place reloads fails here.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model
from sync_helpers import ModeServer, server_logprobs, trainer_logprobs

from grpo_trainer.models import load_model, load_tokenizer
from grpo_trainer.sync.base import SyncContext, WeightSync
from grpo_trainer.sync.registry import make_strategy

ATOL = 1e-5
RUNNING = re.compile(r"vllm:num_requests_running\{[^}]*\} [1-9]")


class Load:
    """Completions sent back to back from a thread, each asking for ``model()`` at its time;
    records (start, end, status, name) of every request."""

    def __init__(self, url: str, model: Callable[[], str]) -> None:
        self.url = url
        self.model = model
        self.done: list[tuple[float, float, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self._stop.is_set():
                name = self.model()
                body = {"model": name, "prompt": [5, 6, 7], "n": 2, "max_tokens": 12,
                        "ignore_eos": True}  # fmt: skip
                start = time.monotonic()
                status = http.post("/v1/completions", json=body).status_code
                self.done.append((start, time.monotonic(), status, name))

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while len(self.done) < count and time.monotonic() < deadline:
            time.sleep(0.01)


def record_paths(strategy: WeightSync) -> list[str]:
    """Every path the strategy's HTTP client asks the server for, in order."""
    paths: list[str] = []
    strategy.client.http.event_hooks["request"].append(  # type: ignore[attr-defined]
        lambda request: paths.append(request.url.path)
    )
    return paths


def context(server: ModeServer, tmp_path: Path) -> SyncContext:
    return SyncContext(server.url, "policy", tmp_path / "checkpoints", "builtin")


def lora_strategy(
    server: ModeServer, tmp_path: Path, base_model: Path
) -> tuple[WeightSync, torch.nn.Module]:
    """``lora_only``'s strategy attached with a fresh adapter (rank 4 on ``q_proj``)."""
    strategy = make_strategy("lora_only", context(server, tmp_path))
    torch.manual_seed(0)
    peft = get_peft_model(load_model(base_model), LoraConfig(r=4, target_modules=["q_proj"]))
    return strategy, strategy.attach(peft)


def nudge(model: torch.nn.Module, seed: int) -> None:
    """Change every trainable parameter (an optimizer step's stand-in: only values matter)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)


@pytest.mark.parametrize("mode_server", ["none"], indirect=True)
def test_none_reloads_in_place_while_requests_are_served(
    mode_server: ModeServer, tmp_path: Path, base_model: Path
) -> None:
    server = mode_server
    tokenizer = load_tokenizer(base_model)
    prompt, completion = tokenizer.encode("repeat 3:"), tokenizer.encode(" 333")
    strategy = make_strategy("none", context(server, tmp_path))
    model = strategy.attach(load_model(base_model))
    pid = server.process.process.pid  # type: ignore[union-attr]
    paths = record_paths(strategy)
    assert strategy.served_model is None  # no server reached before the first sync
    try:
        before = server_logprobs(server.url, "policy", prompt, completion)
        nudge(model, seed=1)
        with Load(server.url, lambda: strategy.served_model or "policy") as load:
            load.wait_for(2)
            began = time.monotonic()
            result = strategy.sync(model, 1)
            ended = time.monotonic()
            load.wait_for(len(load.done) + 2)
        after = server_logprobs(server.url, str(strategy.served_model), prompt, completion)
    finally:
        strategy.close()
    assert strategy.served_model == "policy"  # the base's name, read after the first load
    assert torch.allclose(after, trainer_logprobs(model, prompt, completion), atol=ATOL)
    assert (after - before).abs().max() > 1e-3
    assert result.policy_version == 1 and set(result.phases) == {"save", "load"}
    assert server.starts == 1 and server.process.process.pid == pid  # type: ignore[union-attr]
    assert [p for p in paths if p != "/v1/models"] == [
        "/pause", "/collective_rpc", "/resume", "/reset_prefix_cache",
    ]  # fmt: skip
    assert {status for *_, status, _ in load.done} == {200}
    during = [r for r in load.done if r[0] < ended and r[1] > began]
    assert during, "no request was in flight while the server reloaded"


@pytest.mark.parametrize("mode_server", ["lora_only"], indirect=True)
def test_lora_syncs_move_the_served_name_without_pausing_or_failing_a_request(
    mode_server: ModeServer, tmp_path: Path, base_model: Path
) -> None:
    server = mode_server
    tokenizer = load_tokenizer(base_model)
    prompt, completion = tokenizer.encode("repeat 5:"), tokenizer.encode(" 555")
    strategy, model = lora_strategy(server, tmp_path, base_model)
    paths = record_paths(strategy)
    names = [strategy.served_model]
    try:
        with Load(server.url, lambda: str(strategy.served_model)) as load:
            for step in range(1, 5):
                load.wait_for(2 * step)
                nudge(model, seed=step)
                strategy.sync(model, step)
                names.append(strategy.served_model)
            load.wait_for(len(load.done) + 2)
        served = server_logprobs(server.url, str(strategy.served_model), prompt, completion)
        listed = httpx.get(f"{server.url}/v1/models").json()["data"]
        # a re-attach to this same server (a trainer that found inference down at its start
        # attaches to the next one, then re-attaches once it is up): ours are replaced
        strategy.attach(model)
        relisted = httpx.get(f"{server.url}/v1/models").json()["data"]
    finally:
        strategy.close()
    assert torch.allclose(served, trainer_logprobs(model, prompt, completion), atol=ATOL)
    assert len(set(names)) == len(names) == 5, names
    assert {status for *_, status, _ in load.done} == {200}, load.done
    assert len({name for *_, name in load.done}) >= 3, "requests followed the served name"
    assert "/pause" not in paths and "/resume" not in paths
    adapters = [m["id"] for m in listed if m.get("parent")]
    assert len(adapters) <= 2 and names[-1] in adapters, adapters
    assert [m["id"] for m in relisted if m.get("parent")] == [strategy.served_model]


@pytest.mark.parametrize("mode_server", ["lora_only"], indirect=True)
def test_an_adapter_reloaded_in_place_under_running_requests_is_refused(
    mode_server: ModeServer, tmp_path: Path, base_model: Path
) -> None:
    server = mode_server
    strategy, _ = lora_strategy(server, tmp_path, base_model)
    name, path = str(strategy.served_model), str(tmp_path / "checkpoints/served/adapter_start")
    body = {"model": name, "prompt": [5, 6], "n": 4, "max_tokens": 480, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        answers: list[int] = []
        running = threading.Thread(
            target=lambda: answers.append(http.post("/v1/completions", json=body).status_code)
        )
        running.start()
        deadline = time.monotonic() + 60
        while not RUNNING.search(http.get("/metrics").text) and time.monotonic() < deadline:
            time.sleep(0.01)
        swap = {"lora_name": name, "lora_path": path, "load_inplace": True}
        refused = http.post("/v1/load_lora_adapter", json=swap)
        running.join(120)
        assert refused.status_code == 409, refused.text
        assert "vllm-project/vllm#13698" in refused.json()["error"]["message"]
        assert answers == [200]
        assert http.post("/v1/load_lora_adapter", json=swap).status_code == 200  # idle: fine
    strategy.close()
