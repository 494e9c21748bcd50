"""The rollout record's format: one binary record per group, and a fixed-size index row.

A writer's log (``segments.py``) has two files per segment: ``data``, the records end to
end, and ``index``, one :data:`INDEX_DTYPE` row per record (where it is, and the summary the
inspector lists and filters on). A reader maps the index with numpy and reads one record
when a group is opened, so opening a group costs the same in a record of a hundred groups
as in one of a million.

A record is ``u32 header length``, the JSON header (step, environment, policy version,
lag, scores, advantages, texts, ``lengths`` of the sequences), then
one array per field over all sequences' positions end to end (``ARRAYS``): token ids,
whether the position is trained, and per trained position the inference logprob and, for a
group the trainer trained on, its own logprob, the entropy and the importance ratio
``exp(trainer - inference)``. Untrained positions hold NaN.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

KINDS = ("trained", "dropped")
"""``trained``: a group the trainer took an optimizer step on. ``dropped``: a group an
environment did not send because every score was equal (no GRPO signal)."""
NO_LAG = -(2**31)
"""Index value for an unknown lag (a group without a policy version)."""

INDEX_DTYPE = np.dtype(
    [
        ("offset", "<u8"),
        ("length", "<u4"),
        ("t", "<f8"),
        ("step", "<i4"),
        ("group", "<i4"),
        ("version", "<i4"),
        ("lag", "<i4"),
        ("session", "<u4"),
        ("kind", "u1"),
        ("rank", "u1"),
        ("env", "<u2"),
        ("sequences", "<u2"),
        ("reward_mean", "<f4"),
        ("reward_min", "<f4"),
        ("reward_max", "<f4"),
        ("length_mean", "<f4"),
        ("mismatch_kl", "<f4"),
    ]
)
"""One row per record. ``session`` tells apart the trainer processes of one run (a resumed
trainer may train a step again): a random id its ranks agreed on. ``env`` indexes the
writer's environment names (``<stem>.envs.json``); ``mismatch_kl`` is the group's mean k3
over trained tokens (NaN without trainer logprobs)."""

ARRAYS: tuple[tuple[str, str], ...] = (
    ("tokens", "<i4"),
    ("trained", "u1"),
    ("inference_logprobs", "<f4"),
    ("trainer_logprobs", "<f4"),
    ("entropy", "<f4"),
    ("ratio", "<f4"),
)
TRAINER_ARRAYS = ("trainer_logprobs", "entropy", "ratio")
_HEADER_LENGTH = struct.Struct("<I")


def k3(delta: np.ndarray) -> np.ndarray:
    """Schulman's k3 estimate of KL(inference || trainer) per sampled token, from
    ``delta = logp_trainer - logp_inference``: ``exp(delta) - 1 - delta`` (>= 0, unbiased
    for tokens sampled by inference). The same form as prime-rl's ``mismatch_kl``."""
    return np.expm1(delta) - delta


@dataclass
class GroupFacts:
    """Where a group came from: trained or dropped, at which step, by which environment,
    sampled by which policy version, how many steps behind the trainer (``lag``), when."""

    kind: str
    step: int
    group: int
    """Its index in the step's batch (a dropped group: the environment's running count)."""
    env: str
    env_id: int | None
    version: int | None
    lag: int | None
    t: float


@dataclass
class GroupParts(GroupFacts):
    """What a writer knows of one group, as flat arrays over its sequences' positions.

    ``arrays`` holds ``tokens``, ``trained`` and ``inference_logprobs``, and for a trained
    group ``trainer_logprobs``, ``entropy`` and ``ratio``; ``lengths`` cuts them into
    sequences. ``pieces`` maps token ids to their text (the writer records each id once,
    in its vocabulary file, ``<stem>.pieces.jsonl``).
    """

    scores: list[float]
    """The scores of these sequences (``sequence_ids``)."""
    advantages: list[float] | None
    lengths: list[int]
    arrays: dict[str, np.ndarray]
    prompt_text: str = ""
    texts: list[str] = field(default_factory=list)
    pieces: dict[int, str] = field(default_factory=dict)
    rank: int = 0
    session: int = 0
    sequence_ids: list[int] | None = None
    """Which of the group's sequences these are (a rank of a multi-GPU trainer holds only
    its share); None: all of them, in order."""
    group_scores: list[float] | None = None
    """Every score of the group, for the index summary (None: ``scores`` are all of them)."""


def encode(parts: GroupParts, env_code: int) -> tuple[bytes, np.ndarray]:
    """The record's bytes and its index row (``offset`` left 0 for the writer to set)."""
    header = {
        "kind": parts.kind,
        "step": parts.step,
        "group": parts.group,
        "env": parts.env,
        "env_id": parts.env_id,
        "version": parts.version,
        "lag": parts.lag,
        "t": parts.t,
        "rank": parts.rank,
        "scores": parts.scores,
        "advantages": parts.advantages,
        "sequence_ids": parts.sequence_ids,
        "lengths": parts.lengths,
        "prompt_text": parts.prompt_text,
        "texts": parts.texts,
        "arrays": [name for name, _ in ARRAYS if name in parts.arrays],
    }
    body = json.dumps(header, separators=(",", ":")).encode()
    chunks = [_HEADER_LENGTH.pack(len(body)), body]
    for name, dtype in ARRAYS:
        if name in parts.arrays:
            chunks.append(np.ascontiguousarray(parts.arrays[name], dtype=dtype).tobytes())
    data = b"".join(chunks)
    return data, np.array([summary(parts, env_code, len(data))], INDEX_DTYPE)


def summary(parts: GroupParts, env_code: int, length: int) -> tuple[object, ...]:
    """The index row of a record of ``length`` bytes, as a tuple in :data:`INDEX_DTYPE`'s
    order (``offset`` 0: the writer sets it)."""
    scores = parts.group_scores or parts.scores
    trained = parts.arrays["trained"].astype(bool, copy=False)
    count = int(np.count_nonzero(trained))
    mismatch = math.nan
    if "trainer_logprobs" in parts.arrays and count:
        delta = (
            parts.arrays["trainer_logprobs"][trained] - parts.arrays["inference_logprobs"][trained]
        )
        mismatch = float(k3(delta.astype(float)).mean())
    return (
        0,
        length,
        parts.t,
        parts.step,
        parts.group,
        -1 if parts.version is None else parts.version,
        NO_LAG if parts.lag is None else parts.lag,
        parts.session,
        KINDS.index(parts.kind),
        parts.rank,
        env_code,
        len(scores),
        sum(scores) / len(scores),
        min(scores),
        max(scores),
        count / max(len(parts.lengths), 1),
        mismatch,
    )


@dataclass
class Completion:
    """One sequence of a group, its trained part at the positions it was sampled at."""

    index: int
    score: float
    advantage: float | None
    text: str
    tokens: np.ndarray
    """All token ids of the sequence (prompt included)."""
    trained: np.ndarray
    start: int
    """Position of the first trained token: the completion starts here."""
    values: dict[str, np.ndarray]
    """Per position: ``inference_logprobs`` and, when the trainer trained it,
    ``trainer_logprobs``, ``entropy``, ``ratio`` (NaN at untrained positions)."""

    @property
    def length(self) -> int:
        """Trained (completion) tokens."""
        return int(self.trained.sum())

    def delta(self) -> np.ndarray | None:
        """``logp_trainer - logp_inference`` per position (None without the trainer's)."""
        if "trainer_logprobs" not in self.values:
            return None
        return self.values["trainer_logprobs"] - self.values["inference_logprobs"]

    def mean(self, name: str) -> float:
        """Mean of ``name`` (``delta``, ``abs_delta``, ``mismatch_kl`` or an array) over the
        trained positions; NaN when not recorded."""
        delta = self.delta()
        if name in ("delta", "abs_delta", "mismatch_kl"):
            if delta is None or not self.trained.any():
                return math.nan
            picked = delta[self.trained]
            values = {"delta": picked, "abs_delta": np.abs(picked), "mismatch_kl": k3(picked)}
            return float(np.mean(values[name]))
        array = self.values.get(name)
        if array is None or not self.trained.any():
            return math.nan
        return float(np.nanmean(array[self.trained]))


@dataclass
class GroupRecord(GroupFacts):
    """A decoded record: the group's facts and its completions."""

    prompt_text: str
    prompt_tokens: np.ndarray
    completions: list[Completion]
    pieces: dict[int, str]

    @property
    def scores(self) -> list[float]:
        return [c.score for c in self.completions]

    def piece(self, token: int) -> str:
        """The text of one token id (``<id>`` when the writer did not record it)."""
        return self.pieces.get(int(token), f"<{int(token)}>")


def decode(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header and the arrays of one record's bytes."""
    (size,) = _HEADER_LENGTH.unpack_from(data)
    header = json.loads(data[4 : 4 + size])
    total = sum(header["lengths"])
    arrays: dict[str, np.ndarray] = {}
    offset = 4 + size
    dtypes = dict(ARRAYS)
    for name in header["arrays"]:
        dtype = np.dtype(dtypes[name])
        arrays[name] = np.frombuffer(data, dtype, total, offset)
        offset += total * dtype.itemsize
    return header, arrays


def group_record(
    parts: Sequence[tuple[dict[str, Any], Mapping[str, np.ndarray]]], pieces: dict[int, str]
) -> GroupRecord:
    """One group from its decoded parts (one per writer that holds some of its sequences;
    a single-process trainer or an environment writes one) and its writers' vocabulary."""
    first = parts[0][0]
    completions: list[Completion] = []
    for header, arrays in parts:
        ids = header.get("sequence_ids") or list(range(len(header["lengths"])))
        advantages = header.get("advantages")
        texts = header.get("texts") or []
        cuts = np.cumsum([0, *header["lengths"]])
        for i, (a, b) in enumerate(pairwise(cuts.tolist())):
            trained = arrays["trained"][a:b].astype(bool)
            hits = np.flatnonzero(trained)
            completions.append(
                Completion(
                    index=ids[i],
                    score=float(header["scores"][i]),
                    advantage=None if advantages is None else float(advantages[i]),
                    text=texts[i] if i < len(texts) else "",
                    tokens=arrays["tokens"][a:b],
                    trained=trained,
                    start=int(hits[0]) if len(hits) else int(b - a),
                    values={
                        name: array[a:b]
                        for name, array in arrays.items()
                        if name not in ("tokens", "trained")
                    },
                )
            )
    completions.sort(key=lambda c: c.index)
    prompt = completions[0].tokens[: completions[0].start] if completions else np.zeros(0, "<i4")
    return GroupRecord(
        kind=first["kind"],
        step=first["step"],
        group=first["group"],
        env=first["env"],
        env_id=first.get("env_id"),
        version=first.get("version"),
        lag=first.get("lag"),
        t=first["t"],
        prompt_text=next((h["prompt_text"] for h, _ in parts if h.get("prompt_text")), ""),
        prompt_tokens=prompt,
        completions=completions,
        pieces=pieces,
    )
