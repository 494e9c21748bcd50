"""Bad input never stops an environment: the API down at start, an inference server that
answers 500, HTML, the wrong number of choices and NaN logprobs, and a scorer that raises.
Each is logged with its reason and counted; the good groups still arrive, intact.

The runner runs in-process against the real API process; the misbehaving inference server
is a scripted HTTP server (the real one cannot be made to answer garbage)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from env_procs import Trainer, api_argv, free_port

from grpo_trainer.envs.base import Connection, EnvRunner
from grpo_trainer.envs.settings import EnvSettings
from grpo_trainer.envs.task import Prompt
from grpo_trainer.envs.tokenizer import FastTokenizer
from grpo_trainer.envs.toy import LENGTH, RepeatDigit

SCRIPT = ["500", "html", "wrong_n", "nan"]
FILLER = 20


class ScriptedInference(BaseHTTPRequestHandler):
    """Answers each completion request with the next scripted fault, then valid answers
    whose i-th choice repeats the prompt's digit i times (so scores differ)."""

    script: ClassVar[list[str]] = []
    requests: ClassVar[int] = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests += 1
        action = type(self).script.pop(0) if type(self).script else "ok"
        digit, n = body["prompt"][-2], body["n"]
        choices = [
            {"index": i, "token_ids": [digit] * i + [FILLER] * (LENGTH - i),
             "logprobs": {"token_logprobs": [-1.0] * LENGTH}, "finish_reason": "length"}
            for i in range(n)
        ]  # fmt: skip
        if action == "500":
            self._send(500, b'{"error": "engine dead"}')
        elif action == "html":
            self._send(200, b"<html>502 Bad Gateway</html>")
        elif action == "wrong_n":
            self._send(200, json.dumps({"choices": choices[:1]}).encode())
        elif action == "nan":
            choices[0]["logprobs"]["token_logprobs"][0] = float("nan")
            self._send(200, json.dumps({"choices": choices}).encode())
        else:
            self._send(200, json.dumps({"choices": choices}).encode())

    def _send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the runner's log, not the server's."""


@pytest.fixture
def scripted_inference() -> Iterator[str]:
    ScriptedInference.script = list(SCRIPT)
    ScriptedInference.requests = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedInference)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class FlakyScorer(RepeatDigit):
    """The toy task, with a scorer that raises on its first call."""

    calls = 0

    def score(self, prompt: Prompt, completion: str) -> float:
        type(self).calls += 1
        if type(self).calls == 1:
            raise RuntimeError("scorer bug on purpose")
        return super().score(prompt, completion)


async def eventually(condition: object, deadline_s: float, what: str) -> None:
    """Poll ``condition`` without blocking the event loop the runner shares."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_faults_are_counted_and_production_goes_on(
    spawn, tmp_path: Path, tiny_model: Path, scripted_inference: str, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="grpo_trainer.envs")
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    settings = EnvSettings(group_size=4, max_groups=2, max_concurrency=1)
    runner = EnvRunner(
        FlakyScorer(), settings, Connection(api, scripted_inference),
        FastTokenizer.from_dir(tiny_model), status_poll=0.05,
    )  # fmt: skip
    running = asyncio.create_task(runner.run())
    await eventually(lambda: "API unreachable" in caplog.text, 30, "the runner to retry the API")

    api_proc = spawn("api", api_argv(port, tmp_path / "rollouts.db"))
    await eventually(lambda: _healthy(api), 60, "the API")
    assert api_proc.alive
    await eventually(lambda: "wait for trainer to start" in caplog.text, 30, "a wait answer")
    trainer = Trainer(api, batch_size=4)
    trainer.register()
    async with asyncio.timeout(60):
        stats = await running

    assert stats.counts["groups_sent"] == 2
    assert stats.error_kinds == {"inference_error": 1, "bad_completion": 3, "scorer_raised": 1}
    assert stats.counts["errors"] == 5
    assert ScriptedInference.requests == 7
    for reason in ("answered 500", "malformed completion answer", "asked for 4 completions, "
                   "got 1", "logprob nan at position 0", "scorer bug on purpose"):  # fmt: skip
        assert reason in caplog.text
    groups = trainer.take() + trainer.take()
    assert len(groups) == 2
    for group in groups:
        assert group["scores"] == [i / LENGTH for i in range(4)]
        assert all(lp == [1.0] * 9 + [-1.0] * LENGTH for lp in group["inference_logprobs"])
    trainer.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=0.5).status_code == 200
    except httpx.TransportError:
        return False


async def test_too_long_groups_are_dropped_and_counted(
    spawn, tmp_path: Path, tiny_model: Path, scripted_inference: str
) -> None:
    """``max_token_len`` 12 from the trainer: 9 prompt + 6 completion tokens never fit."""
    ScriptedInference.script = []
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    spawn("api", api_argv(port, tmp_path / "rollouts.db"))
    await eventually(lambda: _healthy(api), 60, "the API")
    trainer = Trainer(api, batch_size=4, max_token_len=12)
    trainer.register()
    runner = EnvRunner(
        RepeatDigit(), EnvSettings(group_size=4, max_concurrency=1),
        Connection(api, scripted_inference), FastTokenizer.from_dir(tiny_model),
    )  # fmt: skip
    running = asyncio.create_task(runner.run())
    await eventually(
        lambda: runner.stats.counts["groups_dropped_too_long"] >= 2, 30, "too-long drops"
    )
    runner.stop()
    async with asyncio.timeout(30):
        stats = await running
    assert stats.counts["groups_sent"] == 0 and stats.counts["errors"] == 0
    assert runner.api.max_token_len == 12
    assert trainer.status()["queue_size"] == 0
    trainer.close()


async def test_stop_while_waiting_for_the_trainer_returns_promptly(
    spawn, tmp_path: Path, tiny_model: Path, scripted_inference: str, caplog
) -> None:
    """SIGTERM (``stop``) while the API still says "wait for trainer to start"."""
    caplog.set_level(logging.INFO, logger="grpo_trainer.envs")
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    spawn("api", api_argv(port, tmp_path / "rollouts.db"))
    await eventually(lambda: _healthy(api), 60, "the API")
    runner = EnvRunner(
        RepeatDigit(), EnvSettings(group_size=4), Connection(api, scripted_inference),
        FastTokenizer.from_dir(tiny_model),
    )  # fmt: skip
    running = asyncio.create_task(runner.run())
    await eventually(lambda: "wait for trainer to start" in caplog.text, 30, "a wait answer")
    runner.stop()
    async with asyncio.timeout(10):
        stats = await running
    assert runner.api.env_id is None
    assert stats.counts["groups_sent"] == 0
    assert ScriptedInference.requests == 0
