"""The built-in server's completions: vLLM's answer shape, sampling, and logprob alignment."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import torch

from grpo_trainer.models import load_model, load_tokenizer
from grpo_trainer.serve.sampling import processed_logprobs
from grpo_trainer.train.logprobs import naive_token_logprobs

PROMPT = "what is 7:"


def trainer_logprobs(
    model_dir: Path, prompt_ids: list[int], completions: list[list[int]], t: float
):
    """The trainer's recomputation: log_softmax(logits / T) at each completion token."""
    model = load_model(model_dir).eval()
    rows = [prompt_ids + c for c in completions]
    ids = torch.tensor(rows)
    with torch.no_grad():
        out = naive_token_logprobs(
            model, ids, torch.ones_like(ids), torch.full((len(rows),), t)
        ).logprobs
    return out[:, len(prompt_ids) - 1 :]


def test_answer_has_vllm_shape(complete, tiny_model_dir: Path) -> None:
    body = complete(prompt=PROMPT, n=3, max_tokens=5, logprobs=0, return_token_ids=True, seed=1)
    again = complete(prompt=PROMPT, n=3, max_tokens=5, logprobs=0, return_token_ids=True, seed=1)
    tokenizer = load_tokenizer(tiny_model_dir)
    for choice in [*body["choices"], *again["choices"]]:  # token texts are remembered
        texts = [tokenizer.decode([t]) for t in choice["token_ids"]]
        assert choice["logprobs"]["tokens"] == texts
        assert choice["logprobs"]["text_offset"] == [
            len("".join(texts[:i])) for i in range(len(texts))
        ]
    assert body["object"] == "text_completion"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    completion_tokens = 0
    for choice in body["choices"]:
        ended = choice["token_ids"][-1] == tokenizer.eos_token_id
        assert choice["finish_reason"] == ("stop" if ended else "length"), choice
        assert ended or len(choice["token_ids"]) == 5  # max_tokens
        assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
        assert len(choice["logprobs"]["tokens"]) == len(choice["token_ids"])
        assert all(lp <= 0 for lp in choice["logprobs"]["token_logprobs"])
        assert choice["prompt_token_ids"] == body["choices"][0]["prompt_token_ids"]
        completion_tokens += len(choice["token_ids"])
    prompt_tokens = len(body["choices"][0]["prompt_token_ids"])
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None,
    }


def test_token_id_prompts_and_prompt_lists(complete, tiny_model_dir: Path) -> None:
    ids = load_tokenizer(tiny_model_dir).encode(PROMPT)
    body = complete(prompt=[ids, ids[:3]], n=2, max_tokens=2, return_token_ids=True)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["choices"][0]["prompt_token_ids"] == ids
    assert body["choices"][3]["prompt_token_ids"] == ids[:3]
    assert body["choices"][0]["logprobs"] is None
    assert "token_ids" not in complete(prompt=ids, max_tokens=1)["choices"][0]


def test_alignment_with_trainer_recomputation(complete, tiny_model_dir: Path) -> None:
    """Sampled-token logprobs == trainer's log_softmax(logits / T): diff_abs_mean < 1e-4."""
    temperature = 0.7
    body = complete(
        prompt=PROMPT,
        n=8,
        max_tokens=12,
        temperature=temperature,
        logprobs=0,
        return_token_ids=True,
        ignore_eos=True,
        seed=7,
    )
    prompt_ids = body["choices"][0]["prompt_token_ids"]
    completions = [c["token_ids"] for c in body["choices"]]
    server = torch.tensor([c["logprobs"]["token_logprobs"] for c in body["choices"]])
    trainer = trainer_logprobs(tiny_model_dir, prompt_ids, completions, temperature)
    diff = (server - trainer).abs()
    assert diff.mean().item() < 1e-4, diff
    assert diff.max().item() < 1e-3
    assert len({tuple(c) for c in completions}) > 1, "the 8 samples of a batch should differ"


def test_echo_scores_a_fixed_completion(complete, tiny_model_dir: Path) -> None:
    """echo + max_tokens=0 returns the prompt's logprobs: how tests read a fixed completion."""
    tokenizer = load_tokenizer(tiny_model_dir)
    prompt_ids = tokenizer.encode(PROMPT)
    completion = tokenizer.encode(" 7777")
    body = complete(prompt=prompt_ids + completion, max_tokens=0, echo=True, logprobs=0)
    values = body["choices"][0]["logprobs"]["token_logprobs"]
    assert values[0] is None
    server = torch.tensor(values[len(prompt_ids) :])
    trainer = trainer_logprobs(tiny_model_dir, prompt_ids, [completion], 1.0)[0]
    assert torch.allclose(server, trainer, atol=1e-5)


def test_seed_makes_sampling_reproducible(complete) -> None:
    first = complete(prompt=PROMPT, n=4, max_tokens=8, seed=11, return_token_ids=True)
    again = complete(prompt=PROMPT, n=4, max_tokens=8, seed=11, return_token_ids=True)
    other = complete(prompt=PROMPT, n=4, max_tokens=8, seed=12, return_token_ids=True)
    tokens = [[c["token_ids"] for c in b["choices"]] for b in (first, again, other)]
    assert tokens[0] == tokens[1]
    assert tokens[0] != tokens[2]


def test_greedy_equals_top_k_one(complete) -> None:
    greedy = complete(prompt=PROMPT, max_tokens=6, temperature=0, return_token_ids=True)
    top1 = complete(prompt=PROMPT, max_tokens=6, top_k=1, seed=3, logprobs=0, return_token_ids=True)
    assert greedy["choices"][0]["token_ids"] == top1["choices"][0]["token_ids"]
    # top-k = 1 leaves one token with all the mass: its processed logprob is 0.
    assert all(abs(v) < 1e-6 for v in top1["choices"][0]["logprobs"]["token_logprobs"])


def test_top_p_logprobs_are_of_the_truncated_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    full = processed_logprobs(logits, temperature=1.0)
    kept = processed_logprobs(logits, temperature=1.0, top_p=0.8)
    probs = full.exp()[0]
    assert probs[0] < 0.8 < probs[0] + probs[1]
    assert torch.isinf(kept[0, 2:]).all()
    expected = full[0, :2] - torch.logsumexp(full[0, :2], dim=0)
    assert torch.allclose(kept[0, :2], expected)


def test_stop_strings_and_length(complete) -> None:
    long = complete(prompt=PROMPT, max_tokens=20, seed=5, ignore_eos=True, return_token_ids=True)
    text = long["choices"][0]["text"]
    assert long["choices"][0]["finish_reason"] == "length"
    stop = text[4]
    stopped = complete(prompt=PROMPT, max_tokens=20, seed=5, ignore_eos=True, stop=[stop])
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    assert choice["text"] == text[: text.index(stop)]


def test_metrics_count_generated_tokens(client: httpx.Client, complete) -> None:
    def generated() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("vllm:generation_tokens_total{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError("vllm:generation_tokens_total missing")

    before = generated()
    body = complete(prompt=PROMPT, n=2, max_tokens=3, ignore_eos=True)
    assert body["usage"]["completion_tokens"] == 6
    assert generated() == before + 6
    assert "vllm:num_requests_running{" in client.get("/metrics").text


def test_models_lists_the_base(client: httpx.Client, tiny_model_dir: Path) -> None:
    data = client.get("/v1/models").json()["data"]
    assert data[0]["id"] == "policy-base"
    assert data[0]["root"] == str(tiny_model_dir)


def test_pause_keep_holds_requests_until_resume(client: httpx.Client, server) -> None:
    assert client.post("/pause", params={"mode": "keep"}).status_code == 200
    assert client.get("/is_paused").json() == {"is_paused": True}
    results: list[int] = []

    def request() -> None:
        with httpx.Client(base_url=server.base_url, timeout=60) as other:
            body = {"model": "policy-base", "prompt": PROMPT, "max_tokens": 2}
            results.append(other.post("/v1/completions", json=body).status_code)

    worker = threading.Thread(target=request)
    worker.start()
    deadline = time.monotonic() + 10
    while (
        'vllm:num_requests_waiting{model_name="policy-base"} 1' not in client.get("/metrics").text
    ):
        assert time.monotonic() < deadline, "request never reached the pause gate"
        time.sleep(0.05)
    assert results == []
    assert client.post("/resume").status_code == 200
    worker.join(30)
    assert results == [200]
    assert client.get("/is_paused").json() == {"is_paused": False}
