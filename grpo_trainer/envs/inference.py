"""Client of the inference server's ``/v1/completions`` (vLLM and the built-in server).

Prompts go as token ids and the answer must carry, per choice, the sampled ``token_ids``
(``return_token_ids``) and one logprob per token (``logprobs.token_logprobs``). An answer
that lacks them, has the wrong number of choices, or holds non-finite or positive
logprobs is garbage: :class:`BadCompletion` says which part is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx
from pydantic import BaseModel, ValidationError


class BadCompletion(ValueError):
    """The inference server answered, but not with usable completions."""


class InferenceUnavailable(ConnectionError):
    """The inference server could not be reached or answered 5xx (worth retrying).

    ``status`` is the HTTP status of a 5xx answer, None when nothing answered.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Logprobs(BaseModel):
    token_logprobs: list[float | None]


class _Choice(BaseModel):
    index: int = 0
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None


class _CompletionResponse(BaseModel):
    choices: list[_Choice]


@dataclass(frozen=True)
class Sample:
    """One sampled completion: its token ids, their logprobs and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None

    @property
    def truncated(self) -> bool:
        """True when the completion was cut off by ``max_tokens``."""
        return self.finish_reason == "length"


@dataclass(frozen=True)
class SamplingRequest:
    """What to ask of the server for one prompt."""

    model: str
    n: int
    max_tokens: int
    temperature: float
    top_p: float = 1.0
    ignore_eos: bool = False
    copies: bool = False
    """Ask for ``n`` copies of the prompt, one sample each, instead of ``n`` samples of one
    prompt (the same distribution; ``EnvSettings.prompt_copies`` says why)."""


async def complete(
    client: httpx.AsyncClient, prompts: list[list[int]], request: SamplingRequest
) -> list[list[Sample]]:
    """``request.n`` completions of each of ``prompts``, in one request (one batch for the
    server, one HTTP exchange for both sides); raises on errors and garbage.

    One prompt goes as a list of token ids, several as a list of them (vLLM's batched
    completions: the choices of prompt ``p`` are indices ``p * n`` to ``p * n + n - 1``).
    """
    n = request.n
    asked = [ids for ids in prompts for _ in range(n)]  # each choice's prompt, in order
    if request.copies:
        body_prompt: list[int] | list[list[int]] = asked
    else:
        body_prompt = prompts[0] if len(prompts) == 1 else prompts
    body = {
        "model": request.model,
        "prompt": body_prompt,
        "n": 1 if request.copies else n,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "logprobs": 0,
        "return_token_ids": True,
    }
    if request.ignore_eos:  # sent only when set: a plain completion request stays Atropos'
        body["ignore_eos"] = True
    try:
        response = await client.post("/v1/completions", json=body)
    except httpx.TransportError as exc:
        raise InferenceUnavailable(f"inference server unreachable: {exc!r}") from exc
    if response.status_code >= 500:
        raise InferenceUnavailable(
            f"inference server answered {response.status_code}: {response.text[:200]}",
            status=response.status_code,
        )
    if response.status_code >= 400:
        raise BadCompletion(f"inference refused ({response.status_code}): {response.text[:300]}")
    samples = parse_samples(response.content, asked)
    return [samples[p * n : p * n + n] for p in range(len(prompts))]


def parse_samples(content: bytes, asked: list[list[int]]) -> list[Sample]:
    """Validate a ``/v1/completions`` answer and return its samples in index order, one
    per prompt of ``asked`` (a choice that names its prompt must name that one)."""
    n = len(asked)
    try:
        parsed = _CompletionResponse.model_validate_json(content)
    except ValidationError as exc:
        raise BadCompletion(f"malformed completion answer: {_first_error(exc)}") from exc
    if len(parsed.choices) != n:
        raise BadCompletion(f"asked for {n} completions, got {len(parsed.choices)}")
    samples = []
    for choice in sorted(parsed.choices, key=lambda c: c.index):
        if not 0 <= choice.index < n:
            raise BadCompletion(f"choice index {choice.index} is not below {n}")
        if choice.token_ids is None:
            raise BadCompletion(f"choice {choice.index} has no token_ids (return_token_ids?)")
        if not choice.token_ids:
            raise BadCompletion(f"choice {choice.index} is an empty completion")
        if choice.logprobs is None:
            raise BadCompletion(f"choice {choice.index} has no logprobs")
        if choice.prompt_token_ids is not None and choice.prompt_token_ids != asked[choice.index]:
            raise BadCompletion(f"choice {choice.index} answers another prompt")
        logprobs = choice.logprobs.token_logprobs
        if len(logprobs) != len(choice.token_ids):
            raise BadCompletion(
                f"choice {choice.index}: {len(logprobs)} logprobs for "
                f"{len(choice.token_ids)} tokens"
            )
        for position, value in enumerate(logprobs):
            if value is None or not math.isfinite(value) or value > 1e-6:
                raise BadCompletion(
                    f"choice {choice.index}: logprob {value!r} at position {position}"
                )
        samples.append(
            Sample(list(choice.token_ids), [float(v) for v in logprobs], choice.finish_reason)
        )
    return samples


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else error["msg"]
