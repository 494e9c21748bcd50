"""Wire models of the rollout API: Atropos field names, checked before anything is queued.

Atropos clients may send fields we do not know; a group keeps them (``extra="allow"``) and
serves them back. The fields we do know are validated for type and for shape: every
per-sequence list has one entry per sequence, every per-token list one entry per token.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StrictInt,
    TypeAdapter,
    field_validator,
    model_validator,
)


class Problem(BaseModel):
    """Every error body: ``detail`` is a sentence, or pydantic's list for a request that
    failed the declared schema before our handler ran."""

    detail: str | list[dict[str, Any]]


class Registration(BaseModel):
    """``POST /register``: the trainer announces its batch shape (and where it resumes).

    Strict, as the schema says: ``false`` is not an integer here.
    """

    model_config = ConfigDict(strict=True)

    wandb_group: str = ""
    wandb_project: str = ""
    batch_size: int = Field(gt=0)
    max_token_len: int = Field(gt=0)
    checkpoint_dir: str = ""
    save_checkpoint_interval: int = 0
    starting_step: int = Field(0, ge=0)
    num_steps: int = Field(0, ge=0)
    trainer_id: str | None = Field(None, min_length=1, max_length=200)
    """Ours, not Atropos's: the trainer process's own id, the same in each of its
    registrations. A new one is a restarted trainer: the batches leased to the one before
    and never acknowledged are queued again (``Store.register_trainer``)."""


class RegisterEnv(BaseModel):
    """``POST /register-env``: an environment announces its group size and share (strict)."""

    model_config = ConfigDict(strict=True)

    max_token_length: int = Field(gt=0)
    desired_name: str = Field(min_length=1, max_length=200)
    weight: float = Field(1.0, allow_inf_nan=False)  # <= 0 (Atropos "ignore": -1) -> 0.01
    group_size: int = Field(gt=0)
    min_batch_allocation: float | None = Field(None, ge=0, le=1)


class EnvIdentifier(BaseModel):
    """Body of ``/disconnect-env`` and ``/status-env``."""

    env_id: StrictInt


class Ack(BaseModel):
    """``POST /batch/ack``: the trainer took the leased batch; it is now consumed."""

    batch_id: str = Field(min_length=1, max_length=100)


class ServedVersion(BaseModel):
    """``POST /served-version``: inference now serves the weights of this trainer step.

    ``model`` is the name environments ask inference for those weights (a new adapter
    name at each ``lora_only`` sync, the base model's name in the full modes); ``incarnation``
    the inference server's (``grpo_trainer.run_notices``) they were pushed to.
    """

    version: StrictInt = Field(ge=0)
    model: str | None = Field(default=None, min_length=1, max_length=500)
    incarnation: StrictInt | None = Field(default=None, ge=0)


PerToken = list[list[FiniteFloat]]


class ScoredData(BaseModel):
    """One group of rollouts for one prompt, as an environment posts it.

    ``tokens[i]`` is sequence i (prompt + completion); ``masks[i]`` holds -100 on prompt
    positions and the token id where the loss applies; ``inference_logprobs[i]`` holds 1.0 on
    prompt positions and the sampled token's logprob elsewhere. ``policy_version`` is the
    API step at which generation started (our environments stamp it).
    """

    model_config = ConfigDict(extra="allow")

    tokens: list[list[StrictInt]] = Field(min_length=1)
    masks: list[list[StrictInt]]
    scores: list[FiniteFloat]
    advantages: PerToken | None = None
    ref_logprobs: PerToken | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: PerToken | None = None
    overrides: list[dict[str, Any]] | None = None
    group_overrides: dict[str, Any] | None = None
    images: Any = None
    env_id: StrictInt | None = None
    policy_version: StrictInt | None = None

    @field_validator("messages")
    @classmethod
    def _messages_have_role_and_content(
        cls, value: list[list[dict[str, Any]]] | None
    ) -> list[list[dict[str, Any]]] | None:
        for conversation in value or []:
            for message in conversation:
                if "role" not in message or "content" not in message:
                    raise ValueError("every message needs 'role' and 'content'")
        return value

    @model_validator(mode="after")
    def _shapes_agree(self) -> ScoredData:
        size = len(self.tokens)
        for name in ("masks", "scores", "inference_logprobs", "advantages", "ref_logprobs"):
            value = getattr(self, name)
            if value is not None and len(value) != size:
                raise ValueError(f"{name} has {len(value)} entries for {size} sequences")
        for name in ("overrides", "messages"):
            value = getattr(self, name)
            if value is not None and len(value) != size:
                raise ValueError(f"{name} has {len(value)} entries for {size} sequences")
        for i, seq in enumerate(self.tokens):
            if not seq:
                raise ValueError(f"tokens[{i}] is empty")
            for name in ("masks", "inference_logprobs", "advantages", "ref_logprobs"):
                value = getattr(self, name)
                if value is not None and len(value[i]) != len(seq):
                    raise ValueError(
                        f"{name}[{i}] has {len(value[i])} entries, tokens[{i}] has {len(seq)}"
                    )
        return self


GROUP = TypeAdapter(ScoredData)
GROUP_LIST = TypeAdapter(list[ScoredData])
