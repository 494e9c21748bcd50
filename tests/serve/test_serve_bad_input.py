"""Bad requests get a 4xx with the reason and the server keeps serving; bad flags exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from serve_helpers import MAX_MODEL_LEN, MAX_NUM_SEQS, make_adapter

from grpo_trainer.models import build_tiny_model, load_model
from grpo_trainer.serve.__main__ import main

BAD_COMPLETIONS = [
    ({"model": "nope", "prompt": "a"}, 404, "does not exist"),
    ({"prompt": "a", "n": 0}, 400, "n:"),
    ({"prompt": "a", "n": MAX_NUM_SEQS + 1}, 400, "--max-num-seqs"),
    ({"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "a", "max_tokens": 0}, 400, "echo"),
    ({"prompt": "a" * MAX_MODEL_LEN, "max_tokens": 1}, 400, "maximum context length"),
    ({"prompt": [1, 2, 10_000]}, 400, "outside the vocabulary"),
    ({"prompt": []}, 400, "empty"),
    ({"prompt": "a", "temperature": -1}, 400, "temperature"),
    ({"prompt": "a", "top_p": 0}, 400, "top_p"),
    ({"prompt": "a", "logprobs": 99}, 400, "logprobs"),
    ({"prompt": "a", "frequency_penalty": 1.0}, 400, "frequency_penalty"),
    ({"prompt": "a", "stream": True}, 400, "stream"),
    ({"n": 2}, 400, "prompt"),
]


@pytest.mark.parametrize(("body", "status", "reason"), BAD_COMPLETIONS)
def test_bad_completion_request(client: httpx.Client, body: dict, status: int, reason: str):
    response = client.post("/v1/completions", json={"model": "policy-base", **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert reason in error["message"]
    assert error["code"] == status
    assert client.get("/health").status_code == 200


def test_malformed_json_is_400(client: httpx.Client) -> None:
    response = client.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400


def test_adapter_errors(client: httpx.Client, tmp_path: Path, tiny_model_dir: Path) -> None:
    other_base = build_tiny_model(tmp_path / "other", seed=5, hidden_size=32)
    mismatched = make_adapter(other_base, tmp_path / "mismatched")
    too_big = make_adapter(tiny_model_dir, tmp_path / "rank32", rank=32)
    cases = [
        ({"lora_name": "x", "lora_path": str(tmp_path / "missing")}, 400, "no LoRA adapter"),
        ({"lora_name": "x", "lora_path": str(mismatched)}, 400, "trained on base"),
        ({"lora_name": "x", "lora_path": str(too_big)}, 400, "--max-lora-rank"),
        ({"lora_name": "policy-base", "lora_path": str(too_big)}, 400, "base model"),
        ({"lora_path": str(too_big)}, 400, "lora_name"),
    ]
    for body, status, reason in cases:
        response = client.post("/v1/load_lora_adapter", json=body)
        assert response.status_code == status, response.text
        assert reason in response.json()["error"]["message"]
    names = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert names == ["policy-base"]
    missing = client.post("/v1/unload_lora_adapter", json={"lora_name": "x"})
    assert missing.status_code == 404


def test_an_adapter_on_a_checkpoint_of_the_served_shape_loads(
    client: httpx.Client, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A trainer resumed (or switched in place) into LoRA puts its adapter on its checkpoint,
    ``step_N``, not on the path the server started from; the server serves those weights
    (synced, reloaded or shared), so an adapter on a model of its shape is taken."""
    checkpoint = tmp_path / "checkpoints" / "step_4"
    load_model(tiny_model_dir).save_pretrained(checkpoint)
    adapter = make_adapter(checkpoint, tmp_path / "adapter_step_4")
    body = {"lora_name": "resumed", "lora_path": str(adapter)}
    assert client.post("/v1/load_lora_adapter", json=body).status_code == 200
    unload = client.post("/v1/unload_lora_adapter", json={"lora_name": "resumed"})
    assert unload.status_code == 200


def test_adapters_still_load_once_the_served_checkpoint_is_pruned(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A server started on ``step_4`` goes on serving after the trainer pruned that folder;
    an adapter on a model of its shape still loads (issue 35: every later sync got HTTP 400,
    "trained on base ..., but this server serves .../step_4"), one of another shape does
    not."""
    from grpo_trainer.serve.lora import AdapterError, AdapterSet

    checkpoint = tmp_path / "checkpoints" / "step_4"
    load_model(tiny_model_dir).save_pretrained(checkpoint)
    adapters = AdapterSet(load_model(checkpoint), base_path=str(checkpoint), max_rank=16)
    shutil.rmtree(checkpoint)
    adapters.validate(str(make_adapter(tiny_model_dir, tmp_path / "adapter_step_8")))
    other_base = build_tiny_model(tmp_path / "other", seed=5, hidden_size=32)
    with pytest.raises(AdapterError, match="trained on base"):
        adapters.validate(str(make_adapter(other_base, tmp_path / "mismatched")))


def test_adapter_load_swap_and_unload(
    client: httpx.Client, tmp_path: Path, tiny_model_dir: Path
) -> None:
    first = make_adapter(tiny_model_dir, tmp_path / "first", seed=1)
    second = make_adapter(tiny_model_dir, tmp_path / "second", seed=2)

    def score(model: str) -> list[float]:
        body = {"model": model, "prompt": "abc 123", "max_tokens": 0, "echo": True, "logprobs": 0}
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["logprobs"]["token_logprobs"][1:]

    base = score("policy-base")
    load = {"lora_name": "policy", "lora_path": str(first)}
    assert client.post("/v1/load_lora_adapter", json=load).status_code == 200
    try:
        again = client.post("/v1/load_lora_adapter", json=load)
        assert again.status_code == 400
        assert "already been loaded" in again.json()["error"]["message"]
        with_first = score("policy")
        assert with_first != base
        assert score("policy-base") == base
        swap = {"lora_name": "policy", "lora_path": str(second), "load_inplace": True}
        assert client.post("/v1/load_lora_adapter", json=swap).status_code == 200
        assert score("policy") not in (base, with_first)
        assert [m["root"] for m in client.get("/v1/models").json()["data"]][1] == str(second)
    finally:
        unload = client.post("/v1/unload_lora_adapter", json={"lora_name": "policy"})
    assert unload.status_code == 200
    assert (
        client.post("/v1/completions", json={"model": "policy", "prompt": "a"}).status_code == 404
    )


def exit_status(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run the server's ``main`` (as ``python -m grpo_trainer.serve`` does) until it exits."""
    with pytest.raises(SystemExit) as exited:
        main([*args, "--port", "1"])
    return int(exited.value.code), capsys.readouterr().err


def test_bad_flags_exit_2_before_binding(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_model_dir: Path
) -> None:
    model = str(tiny_model_dir)
    assert exit_status(capsys, str(tmp_path / "no-model"))[0] == 2
    status, err = exit_status(capsys, model, "--enable-lora", "--lora-modules", "no-equals")
    assert (status, "NAME=PATH" in err) == (2, True)
    status, err = exit_status(capsys, model, "--enable-lora", "--lora-modules", f"p={tmp_path}")
    assert (status, "no LoRA adapter" in err) == (2, True)
    status, err = exit_status(capsys, model, "--lora-modules", f"p={tmp_path}")
    assert (status, "needs --enable-lora" in err) == (2, True)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "manifest.json").write_text(
        json.dumps({"dtype": "float32", "numel": 1, "tensors": []})
    )
    status, err = exit_status(capsys, model, "--shared-weights", str(shared))
    assert (status, "do not match" in err) == (2, True)


def test_shared_weight_endpoints_refuse_when_not_sharing(client: httpx.Client) -> None:
    assert client.get("/v1/shared_weights").status_code == 404
    rpc = client.post("/collective_rpc", json={"method": "grpo_export_weights"})
    assert rpc.status_code == 404
    assert "CUDA" in rpc.json()["error"]["message"]
    assert client.get("/health").status_code == 200
