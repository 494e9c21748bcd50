"""The built-in server's rules called directly, without HTTP: ``InferenceService`` over the
real tiny model, built as ``python -m grpo_trainer.serve`` builds it. What a client sees of
the same rules (status codes, vLLM's error body) is tested over HTTP beside this."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_trainer.serve.__main__ import build_parser, build_service
from grpo_trainer.serve.protocol import (
    ApiError,
    CompletionRequest,
    LoadLoraRequest,
    RpcRequest,
)
from grpo_trainer.serve.service import InferenceService

MAX_LEN = 32


@pytest.fixture(scope="module")
def service(tiny_model_dir: Path) -> InferenceService:
    argv = [str(tiny_model_dir), "--served-model-name", "policy", "--max-num-seqs", "4"]
    return build_service(build_parser().parse_args([*argv, "--max-model-len", str(MAX_LEN)]))


def refusal(error: pytest.ExceptionInfo[ApiError]) -> tuple[int, str]:
    return error.value.status, str(error.value)


def test_prompts_are_token_ids_inside_the_vocabulary(service: InferenceService) -> None:
    vocab = service.engine.vocab_size
    assert service.prompts([3, 4]) == [[3, 4]]
    assert service.prompts([[3], [4, 5]]) == [[3], [4, 5]]
    assert service.prompts("ab") == [service.engine.tokenizer.encode("ab")]
    with pytest.raises(ApiError) as error:
        service.prompts([1, vocab])
    assert refusal(error) == (400, f"token ids [{vocab}] are outside the vocabulary [0, {vocab})")
    for empty in ([], "", [[]]):
        with pytest.raises(ApiError, match="prompt must not be empty"):
            service.prompts(empty)


async def test_complete_refuses_what_the_server_cannot_do(service: InferenceService) -> None:
    cases = [
        ({"stream": True}, (400, "stream=true is not supported by the built-in server")),
        ({"n": 5}, (400, "n=5 exceeds --max-num-seqs 4")),
        ({"model": "other"}, (404, "The model `other` does not exist.")),
        ({"max_tokens": 0}, (400, "max_tokens must be at least 1 (0 is only allowed with echo")),
        ({"max_tokens": MAX_LEN}, (400, f"maximum context length is {MAX_LEN} tokens")),
    ]
    for fields, (status, reason) in cases:
        with pytest.raises(ApiError) as error:
            await service.complete(CompletionRequest(prompt=[3, 4], **fields))
        assert error.value.status == status and reason in str(error.value), fields


async def test_complete_samples_n_choices_per_prompt_with_usage(
    service: InferenceService,
) -> None:
    request = CompletionRequest(
        model="policy", prompt=[[3, 4], [5]], n=2, max_tokens=3, ignore_eos=True, seed=7,
        logprobs=0, return_token_ids=True,
    )  # fmt: skip
    answer = await service.complete(request)
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in choices] == [[3, 4], [3, 4], [5], [5]]
    assert all(len(c["token_ids"]) == 3 and c["finish_reason"] == "length" for c in choices)
    assert all(len(c["logprobs"]["token_logprobs"]) == 3 for c in choices)
    assert answer["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 12,
        "total_tokens": 15,
        "prompt_tokens_details": None,
    }
    scored = await service.complete(
        CompletionRequest(prompt=[3, 4, 5], max_tokens=0, echo=True, logprobs=0)
    )
    (choice,) = scored["choices"]
    assert choice["logprobs"]["token_logprobs"][0] is None  # the first token has no context
    assert all(v < 0 for v in choice["logprobs"]["token_logprobs"][1:])


async def test_features_not_started_are_refused_naming_the_flag(
    service: InferenceService,
) -> None:
    with pytest.raises(ApiError) as error:
        await service.load_lora(LoadLoraRequest(lora_name="a", lora_path="/nowhere"))
    assert refusal(error) == (400, "LoRA is not enabled: start the server with --enable-lora")
    with pytest.raises(ApiError) as error:
        service.shared_weights_transport()
    assert refusal(error) == (404, "not started with --shared-weights")
    with pytest.raises(ApiError) as error:
        await service.collective_rpc(RpcRequest(method="grpo_device_uuid"))
    assert refusal(error) == (404, "collective_rpc needs --shared-weights on a CUDA device")
    await service.pause("keep")
    assert service.paused
    service.resume()
    assert not service.paused
