"""Request bodies of the OpenAI/vLLM-compatible endpoints, validated at the edge, and the
refusal of a request the server will not carry out.

Unknown fields are rejected (400 naming the field) rather than silently ignored: a
sampling option this server does not implement must not change results unnoticed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_LOGPROBS = 20


class ApiError(Exception):
    """A request the server refuses, with the HTTP status and the reason."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class CompletionRequest(BaseModel):
    """``POST /v1/completions``: the subset of vLLM's fields this server honours."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    n: int = Field(default=1, ge=1)
    max_tokens: int | None = Field(default=16, ge=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    stream: bool = False
    user: str | None = None


class LoadLoraRequest(BaseModel):
    """``POST /v1/load_lora_adapter``."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False


class UnloadLoraRequest(BaseModel):
    """``POST /v1/unload_lora_adapter``."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None


class RpcRequest(BaseModel):
    """``POST /collective_rpc`` (built-in server on CUDA: the two export methods only)."""

    model_config = ConfigDict(extra="forbid")

    method: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
