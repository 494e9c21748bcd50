"""The answer of ``POST /v1/completions``, shaped like vLLM's.

``choices[i]`` holds the text, ``token_ids`` and ``prompt_token_ids`` (with
``return_token_ids``), ``logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``,
``text_offset``), ``finish_reason`` and ``stop_reason``; ``usage`` counts the tokens. The
request's checks and the generation are ``InferenceService.complete`` (``service.py``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

from grpo_trainer.serve.engine import Sample
from grpo_trainer.serve.protocol import CompletionRequest
from grpo_trainer.serve.sampling import SamplingParams

Echo = tuple[list[float | None], list[dict[int, float] | None]]
"""The prompt's own logprobs and top logprobs (``echo``: the first token's are None)."""


class TokenTexts(Protocol):
    """How the answer spells tokens: one token's text, and a whole prompt's."""

    def token_text(self, token: int) -> str: ...

    def prompt_text(self, ids: list[int]) -> str: ...


def sampling_params(request: CompletionRequest, max_tokens: int) -> SamplingParams:
    """The engine's sampling parameters of ``request``."""
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    return SamplingParams(
        n=request.n,
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        seed=request.seed,
        stop=stop,
        stop_token_ids=tuple(request.stop_token_ids or ()),
        ignore_eos=request.ignore_eos,
        top_logprobs=request.logprobs or 0,
    )


def _token_text(texts: TokenTexts, token: int, as_ids: bool) -> str:
    return f"token_id:{token}" if as_ids else texts.token_text(token)


def _logprobs_block(
    texts: TokenTexts,
    tokens: list[int],
    values: list[float | None],
    tops: list[dict[int, float] | None],
    *,
    as_ids: bool,
) -> dict[str, Any]:
    spelled = [_token_text(texts, t, as_ids) for t in tokens]
    offsets, position = [], 0
    for text in spelled:
        offsets.append(position)
        position += len(text)
    return {
        "text_offset": offsets,
        "token_logprobs": values,
        "tokens": spelled,
        "top_logprobs": [
            None if top is None else {_token_text(texts, t, as_ids): v for t, v in top.items()}
            for top in tops
        ],
    }


def _choice(
    texts: TokenTexts,
    request: CompletionRequest,
    index: int,
    prompt_ids: list[int],
    sample: Sample,
    echo: Echo | None,
) -> dict[str, Any]:
    as_ids = bool(request.return_tokens_as_token_ids)
    text = sample.text
    logprobs = None
    if request.logprobs is not None:
        tokens, values, tops = sample.token_ids, list(sample.logprobs), list(sample.top_logprobs)
        if echo is not None:
            tokens = [*prompt_ids, *tokens]
            values = [*echo[0], *values]
            tops = [*echo[1], *tops]
        logprobs = _logprobs_block(texts, tokens, values, tops, as_ids=as_ids)
    if echo is not None:
        text = texts.prompt_text(prompt_ids) + text
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": sample.finish_reason,
        "stop_reason": sample.stop_reason,
        "prompt_logprobs": None,
    }
    if request.return_token_ids:
        choice["token_ids"] = sample.token_ids
        choice["prompt_token_ids"] = prompt_ids
    return choice


def completion_body(
    texts: TokenTexts,
    request: CompletionRequest,
    model: str,
    prompts: list[list[int]],
    results: list[tuple[list[Sample], Echo | None]],
) -> dict[str, Any]:
    """The answer: ``request.n`` choices per prompt, in prompt order, and the usage."""
    choices = []
    completion_tokens = 0
    for p, (ids, (samples, echo)) in enumerate(zip(prompts, results, strict=True)):
        for i, sample in enumerate(samples):
            completion_tokens += len(sample.token_ids)
            choices.append(_choice(texts, request, p * request.n + i, ids, sample, echo))
    prompt_tokens = sum(len(ids) for ids in prompts)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        },
        "system_fingerprint": None,
        "kv_transfer_params": None,
    }
