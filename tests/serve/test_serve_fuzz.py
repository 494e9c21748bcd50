"""The built-in server under generated completion requests (hypothesis), bounded for CI.

Bodies mix sane and absurd values for every field the server reads: out-of-vocabulary,
negative and huge token ids, empty and nested prompts, huge or non-integer ``n`` /
``max_tokens`` / ``logprobs``, negative or huge temperatures, wrong JSON types. Each answer
is a 200 or a 4xx with an OpenAI-style error naming the reason, never a 5xx, and the
server stays healthy (the session's real server, on a real tiny model).
"""

from __future__ import annotations

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_helpers import MAX_NUM_SEQS

huge = st.integers(min_value=-(2**70), max_value=2**70)
token_ids = st.lists(st.one_of(st.integers(0, 60), huge), max_size=6)
prompt = st.one_of(
    st.text(max_size=12),
    token_ids,
    st.lists(st.text(max_size=5), max_size=3),
    st.lists(token_ids, max_size=3),
    st.none(),
    st.integers(),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
number = st.one_of(
    st.integers(-3, MAX_NUM_SEQS + 2), huge, st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(), st.text(max_size=3), st.none(),
)  # fmt: skip
body = st.fixed_dictionaries(
    {"model": st.sampled_from(["policy-base", "policy-base", "nope"]), "prompt": prompt},
    optional={
        "n": number,
        "max_tokens": st.one_of(st.integers(-2, 8), number),
        "logprobs": st.one_of(st.integers(-1, 30), number),
        "temperature": st.one_of(st.floats(-2, 3, allow_nan=False), number),
        "top_p": st.one_of(st.floats(-1, 2, allow_nan=False), number),
        "top_k": number,
        "seed": number,
        "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=2)),
        "stop_token_ids": token_ids,
        "ignore_eos": st.booleans(),
        "echo": st.booleans(),
    },
)


@settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=body)
def test_any_completion_request_gets_200_or_a_4xx_with_a_reason(
    client: httpx.Client, request: dict
) -> None:
    response = client.post("/v1/completions", json=request)
    assert response.status_code < 500, (request, response.text)
    if response.status_code != 200:
        assert 400 <= response.status_code < 500
        error = response.json()["error"]
        assert error["message"] and error["code"] == response.status_code, response.text
    else:
        choices = response.json()["choices"]
        assert len(choices) == request.get("n", 1) * max(1, _prompts(request["prompt"]))
    assert client.get("/health").status_code == 200


def _prompts(prompt: object) -> int:
    """How many prompts a (valid) ``prompt`` holds."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1
