"""Groups of scored rollouts -> padded micro-batch tensors for one optimizer step.

Alignment: position ``t`` of a micro-batch predicts token ``t + 1``. Its label is
``tokens[t + 1]``, it is trained when ``masks[t + 1] != -100``, and its inference logprob is
``inference_logprobs[t + 1]`` (the server's logprob of that sampled token).

Advantages as Atropos computes them: ``(score - mean) / max(std, 1e-8)`` per group
(population std), one scalar per sequence; ``overrides[i].set_advantage_to_zero`` zeroes a
sequence; per-token ``advantages`` sent by the environment are used as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from torch import Tensor

IGNORE = -100


class DataError(ValueError):
    """A batch the trainer cannot train on; the message says which group and why."""


class Group(BaseModel):
    """The fields of an Atropos ScoredData group that the trainer reads."""

    model_config = ConfigDict(extra="ignore")

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    inference_logprobs: list[list[float]] | None = None
    advantages: list[list[float]] | None = None
    generation_params: dict[str, Any] | None = None
    overrides: list[dict[str, Any] | None] | None = None
    policy_version: int | None = None
    env_id: int | None = None
    env_name: str | None = None
    """Our environments' registered name (an extension field, like ``policy_version``)."""

    @property
    def env(self) -> str:
        """The environment that made the group: its name, ``env<id>``, or "" (unknown)."""
        if self.env_name:
            return self.env_name
        return "" if self.env_id is None else f"env{self.env_id}"

    @model_validator(mode="after")
    def _shapes(self) -> Group:
        size = len(self.tokens)
        if size == 0:
            raise ValueError("group has no sequences")
        for name in ("masks", "scores", "inference_logprobs", "advantages", "overrides"):
            value = getattr(self, name)
            if value is not None and len(value) != size:
                raise ValueError(f"{name} has {len(value)} entries for {size} sequences")
        for i, seq in enumerate(self.tokens):
            for name in ("masks", "inference_logprobs", "advantages"):
                value = getattr(self, name)
                if value is not None and len(value[i]) != len(seq):
                    raise ValueError(f"{name}[{i}] has {len(value[i])} entries for {len(seq)}")
        return self


def parse_groups(raw: list[dict[str, Any]]) -> list[Group]:
    """Validate the groups of one batch; a bad group is a ``DataError`` naming it."""
    groups = []
    for index, item in enumerate(raw):
        try:
            group = Group.model_validate(item)
        except ValidationError as exc:
            raise DataError(f"group {index} of the batch is malformed: {exc}") from None
        if group.inference_logprobs is None:
            raise DataError(
                f"group {index} has no inference_logprobs: the trainer needs the sampling "
                "policy's logprobs for the importance ratio (no on-policy fallback); make "
                "the environment request logprobs from the inference server"
            )
        groups.append(group)
    return groups


def group_advantages(group: Group) -> list[float]:
    """Atropos' per-sequence advantage: standardised scores, with zeroing overrides."""
    mean = sum(group.scores) / len(group.scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in group.scores) / len(group.scores))
    values = [(s - mean) / max(std, 1e-8) for s in group.scores]
    for i, override in enumerate(group.overrides or []):
        if override and override.get("set_advantage_to_zero"):
            values[i] = 0.0
    return values


def sequence_temperature(group: Group, index: int) -> float:
    """Sampling temperature of sequence ``index``: its override, else the group's, else 1."""
    override = (group.overrides or [None] * len(group.tokens))[index] or {}
    value = override.get("temperature")
    if value is None:
        value = (group.generation_params or {}).get("temperature", 1.0)
    value = float(value)
    if value <= 0:
        raise DataError(f"temperature {value} is not positive (greedy samples cannot be trained)")
    return value


@dataclass
class MicroBatch:
    """Padded tensors of ``B`` sequences; label-aligned tensors are ``[B, L-1]``."""

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    inference_logprobs: Tensor
    advantages: Tensor
    temperatures: Tensor
    policy_versions: Tensor
    """``[B]``: the policy version each sequence was sampled at (its group's; -1 unknown)."""
    envs: Tensor
    """``[B]``: each sequence's environment, an index into ``StepBatch.env_names``."""

    def to(self, device: str) -> MicroBatch:
        """The same micro-batch on ``device``."""
        return MicroBatch(**{k: v.to(device) for k, v in vars(self).items()})


@dataclass
class StepBatch:
    """Everything one optimizer step trains on, plus the batch-level facts for metrics."""

    micro_batches: list[MicroBatch]
    sequences: int
    tokens: int
    """Trained (completion) tokens in the whole step."""
    scores: list[float]
    zero_std_groups: int
    groups: int
    completion_lengths: list[int]
    policy_versions: list[int]
    sequence_versions: list[int]
    """The policy version of every sequence of the step, in order (-1 unknown)."""
    env_names: list[str]
    """The step's environments (``Group.env``), in order of first appearance."""
    first_row: int = 0
    """This rank's first sequence in the step (its share starts there)."""


@dataclass
class _Row:
    tokens: list[int]
    trained: list[float]
    inference: list[float]
    advantage: list[float]
    temperature: float
    version: int
    env: int


def _rows(group: Group, index: int, seq_len: int, env: int) -> list[_Row]:
    advantages = group_advantages(group)
    rows = []
    inference = group.inference_logprobs or []
    for i, tokens in enumerate(group.tokens):
        if len(tokens) > seq_len:
            raise DataError(
                f"group {index} sequence {i} has {len(tokens)} tokens, more than --seq-len "
                f"{seq_len}; raise --seq-len or have the environment drop longer groups"
            )
        if len(tokens) < 2:
            raise DataError(f"group {index} sequence {i} has fewer than 2 tokens")
        trained = [0.0 if m == IGNORE else 1.0 for m in group.masks[i][1:]]
        per_token = (
            group.advantages[i][1:]
            if group.advantages is not None
            else [advantages[i]] * (len(tokens) - 1)
        )
        rows.append(
            _Row(
                tokens=tokens,
                trained=trained,
                inference=[lp * t for lp, t in zip(inference[i][1:], trained, strict=True)],
                advantage=per_token,
                temperature=sequence_temperature(group, i),
                version=-1 if group.policy_version is None else group.policy_version,
                env=env,
            )
        )
    return rows


def _pad(rows: list[_Row], pad_id: int) -> MicroBatch:
    length = max(len(r.tokens) for r in rows)

    def padded(values: list[float], size: int, fill: float) -> list[float]:
        return values + [fill] * (size - len(values))

    return MicroBatch(
        input_ids=torch.tensor([padded(r.tokens, length, pad_id) for r in rows], dtype=torch.long),
        attention_mask=torch.tensor(
            [[1] * len(r.tokens) + [0] * (length - len(r.tokens)) for r in rows], dtype=torch.long
        ),
        loss_mask=torch.tensor([padded(r.trained, length - 1, 0.0) for r in rows]),
        inference_logprobs=torch.tensor([padded(r.inference, length - 1, 0.0) for r in rows]),
        advantages=torch.tensor([padded(r.advantage, length - 1, 0.0) for r in rows]),
        temperatures=torch.tensor([r.temperature for r in rows]),
        policy_versions=torch.tensor([r.version for r in rows], dtype=torch.long),
        envs=torch.tensor([r.env for r in rows], dtype=torch.long),
    )


def build_step_batch(
    groups: list[Group],
    *,
    micro_batch_size: int,
    seq_len: int,
    pad_id: int,
    share: slice = slice(None),
) -> StepBatch:
    """Flatten groups into sequences, in order, and cut micro-batches of ``micro_batch_size``.

    ``share`` selects this rank's sequences (a multi-rank trainer): advantages, counts and
    batch facts still come from the whole step, so each rank's loss is its exact share.
    """
    env_names = list(dict.fromkeys(group.env for group in groups))
    rows = [
        row
        for index, group in enumerate(groups)
        for row in _rows(group, index, seq_len, env_names.index(group.env))
    ]
    mine = rows[share]
    micro = [
        _pad(mine[i : i + micro_batch_size], pad_id) for i in range(0, len(mine), micro_batch_size)
    ]
    lengths = [int(sum(r.trained)) for r in rows]
    return StepBatch(
        micro_batches=micro,
        sequences=len(rows),
        tokens=sum(lengths),
        scores=[s for g in groups for s in g.scores],
        zero_std_groups=sum(1 for g in groups if max(g.scores) == min(g.scores)),
        groups=len(groups),
        completion_lengths=lengths,
        policy_versions=[g.policy_version for g in groups if g.policy_version is not None],
        sequence_versions=[r.version for r in rows],
        env_names=env_names,
        first_row=share.indices(len(rows))[0],
    )
