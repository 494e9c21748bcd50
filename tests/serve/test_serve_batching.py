"""Concurrent requests share one decode batch and keep their own parameters and exact logprobs.

In-process engine on the real tiny model (the scheduler's batches are not visible over
HTTP), plus concurrent requests through the real server.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from test_serve_completions import PROMPT, trainer_logprobs

from grpo_trainer.models import load_model, load_tokenizer
from grpo_trainer.serve.engine import Engine, Sample
from grpo_trainer.serve.sampling import SamplingParams


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_queued_requests_decode_as_one_batch_with_their_own_parameters(
    tiny_model_dir: Path,
) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = Engine(load_model(tiny_model_dir), tokenizer, max_model_len=64, batch_window=0)
    texts = ["what is 7:", "ab", "a longer prompt than the others, 12:"]
    params = [
        SamplingParams(n=2, max_tokens=3, temperature=0.7, seed=1, ignore_eos=True),
        SamplingParams(n=3, max_tokens=9, temperature=1.0, seed=2, ignore_eos=True),
        SamplingParams(n=1, max_tokens=5, temperature=0, ignore_eos=True),
    ]
    prompts = [tokenizer.encode(text) for text in texts]
    with ThreadPoolExecutor(4) as pool:
        with engine.lock:  # as a LoRA load would: the first batch waits, the rest queue
            first = pool.submit(engine.generate, prompts[0], params[0])
            _wait(lambda: engine.scheduler.batches == 1, "the first batch")
            pairs = zip(prompts, params, strict=True)
            rest = [pool.submit(engine.generate, p, s) for p, s in pairs]
            _wait(lambda: engine.scheduler.queued == 3, "three queued requests")
        results = [first.result(), *(f.result() for f in rest)]
    assert engine.scheduler.batches == 2
    assert [s.token_ids for s in results[0]] == [s.token_ids for s in results[1]]  # same seed
    for prompt, setting, samples in zip(prompts, params, results[1:], strict=True):
        assert len(samples) == setting.n
        assert all(len(s.token_ids) == setting.max_tokens for s in samples)
        assert all(s.finish_reason == "length" for s in samples)
        _assert_exact(tiny_model_dir, prompt, samples, setting.temperature or 1.0)
    assert engine.stats.generation_tokens == 2 * 3 * 2 + 3 * 9 + 5


def _assert_exact(model_dir: Path, prompt: list[int], samples: list[Sample], t: float) -> None:
    server = torch.tensor([s.logprobs for s in samples])
    trainer = trainer_logprobs(model_dir, prompt, [s.token_ids for s in samples], t)
    assert (server - trainer).abs().max().item() < 1e-4


def test_concurrent_http_requests_answer_exact_logprobs(server, tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    prompts = [tokenizer.encode(f"{PROMPT} {'x' * k}") for k in range(8)]
    barrier = threading.Barrier(len(prompts))

    def ask(index: int) -> dict:
        body = {
            "model": "policy-base",
            "prompt": prompts[index],
            "n": 4,
            "max_tokens": 2 + index,
            "temperature": 0.8,
            "logprobs": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        }
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            barrier.wait()
            response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(ask, range(len(prompts))))
    for index, answer in enumerate(answers):
        choices = answer["choices"]
        assert all(c["prompt_token_ids"] == prompts[index] for c in choices)
        assert all(len(c["token_ids"]) == 2 + index for c in choices)
        server_lp = torch.tensor([c["logprobs"]["token_logprobs"] for c in choices])
        trainer = trainer_logprobs(
            tiny_model_dir, prompts[index], [c["token_ids"] for c in choices], 0.8
        )
        assert (server_lp - trainer).abs().max().item() < 1e-4
