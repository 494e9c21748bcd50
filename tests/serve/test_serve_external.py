"""A server a run attaches to (``serve/external.py``, ``serve/attach.py``), on the real built-in
server: what it says it serves and has, what a run in each mode finds missing (each reason
``check`` gives), and the reset every attached run starts and ends with (generation resumed,
every adapter unloaded, the base reloaded in place)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from serve_helpers import make_adapter

from grpo_trainer.models import build_tiny_model
from grpo_trainer.serve.attach import LeaseHeld, reset_to_base, take_lease
from grpo_trainer.serve.external import Needs, describe, missing
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.lease import LEASE_PATH

TINY = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""The tiny model's shape as a profile with ``model = "tiny"`` and no ``[run.tiny]`` says it."""


def needs(mode: str, **changes: object) -> Needs:
    fields = {
        "mode": mode,
        "backend": "builtin",
        "served_model_name": "policy",
        "shape": TINY,
        "model": None,
        "weight_transfer": "cuda_ipc",
        **changes,
    }
    return Needs(**fields)  # type: ignore[arg-type]


def test_the_server_says_what_it_serves_and_has(server: ServerProcess) -> None:
    facts = describe(server.base_url)
    assert facts.backend == "builtin"
    assert facts.base_names == ("policy-base",)  # started in lora_only
    assert facts.adapters == ()
    assert facts.shape is not None and {k: facts.shape[k] for k in TINY} == TINY
    assert (facts.reload, facts.lora, facts.sleep) == (True, True, False)
    assert facts.shared_weights is None
    assert facts.lease is not None and facts.lease["holder"] is None


def test_what_each_mode_finds_missing(server: ServerProcess) -> None:
    facts = describe(server.base_url)
    assert missing(facts, needs("lora_only")) == []
    assert missing(facts, needs("none")) == []
    (colocate,) = missing(facts, needs("colocate"))[:1]
    assert "no sleep mode" in colocate
    assert any("no --shared-weights" in m for m in missing(facts, needs("shared_vllm")))
    assert any("needs a server we own" in m for m in missing(facts, needs("lora_restart")))
    (vllm,) = missing(facts, needs("none", backend="vllm"))
    assert "it is a builtin server, the profile says backend = 'vllm'" in vllm
    (name,) = missing(facts, needs("none", served_model_name="other"))
    assert "it serves policy-base, not 'other'" in name
    (shape,) = missing(facts, needs("none", shape={**TINY, "hidden_size": 128}))
    assert "another shape: hidden_size 64 (profile: 128)" in shape
    (model,) = missing(facts, needs("none", model="Qwen/Qwen2.5-0.5B"))
    assert "the profile's is 'Qwen/Qwen2.5-0.5B'" in model


def test_a_held_lease_is_named_and_is_no_conflict_for_its_holder(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        take_lease(http, "h:/runs/first", "run first", ttl=30)
        try:
            facts = describe(server.base_url)
            (held,) = missing(facts, needs("none"))
            assert "another run holds it: run first (holder h:/runs/first" in held
            assert missing(facts, needs("none", holder="h:/runs/first")) == []
            with pytest.raises(LeaseHeld, match="run first"):
                take_lease(http, "h:/runs/second", "run second")
        finally:
            http.delete(LEASE_PATH, params={"holder": "h:/runs/first"})


def scores(http: httpx.Client, model: str) -> list[float]:
    """Logprobs of a fixed text under ``model`` (``echo``, nothing sampled)."""
    body = {"model": model, "prompt": "7 7 7 3 1", "max_tokens": 0, "echo": True, "logprobs": 0}
    answer = http.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["logprobs"]["token_logprobs"][1:]


@pytest.mark.timeout(240)
def test_a_reset_serves_the_base_whatever_the_last_run_left(
    server: ServerProcess, tiny_model_dir: Path, tmp_path: Path
) -> None:
    trained = build_tiny_model(tmp_path / "trained", seed=7)  # other weights, same shape
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        base = scores(http, "policy-base")
        rpc = {"method": "grpo_reload_weights", "kwargs": {"weights_path": str(trained)}}
        assert http.post("/collective_rpc", json=rpc).status_code == 200
        load = {"lora_name": "left-behind", "lora_path": str(adapter)}
        assert http.post("/v1/load_lora_adapter", json=load).status_code == 200
        assert http.post("/pause", params={"mode": "keep"}).status_code == 200  # as a crash
        assert http.get("/is_paused").json()["is_paused"]

        done = reset_to_base(http, describe(server.base_url), str(tiny_model_dir))

        assert done[:2] == ["generation resumed", "adapter left-behind unloaded"], done
        assert done[-1] == "prefix cache reset"
        assert not http.get("/is_paused").json()["is_paused"]
        assert describe(server.base_url).adapters == ()
        assert scores(http, "policy-base") == base  # the base's weights, to the bit
