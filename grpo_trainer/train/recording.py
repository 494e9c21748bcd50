"""What the trainer records of each step (``grpo_trainer/records``): the groups it trained
on, with its own logprobs, entropy and importance ratio per token, and its phases as spans.

On the training thread this only keeps references to tensors the step computed anyway
(:meth:`StepRecorder.capture`) and, after the optimizer step, copies them to the CPU once;
turning them into per-sequence arrays, decoding texts and writing happen on the background
writer's thread. Records go to ``$GRPO_TUI_RUN_DIR`` (else next to the checkpoint folder,
like ``metrics.jsonl``); each rank of a multi-GPU trainer writes its own files.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo_trainer.records.process import Decode, ProcessRecords
from grpo_trainer.records.rollout_writer import run_directory, writer_stem
from grpo_trainer.records.rollouts import GroupParts
from grpo_trainer.train.data import IGNORE, Group, StepBatch, group_advantages


class StepRecorder(ProcessRecords):
    """One trainer rank's rollout log and timeline, written off the training thread."""

    role = "trainer"

    def __init__(
        self,
        run_dir: Path,
        stem: str,
        decode: Decode,
        *,
        rank: int = 0,
        session: int = 0,
        **settings: Any,
    ) -> None:
        """``settings``: :class:`ProcessRecords`' (``max_mb``, ``every``, ``on_error``)."""
        super().__init__(run_dir, stem, decode, **settings)
        self.rank = rank
        self.session = session
        self._captured: list[tuple[Tensor, Tensor | None, Tensor]] | None = None

    @classmethod
    def for_trainer(
        cls,
        save_path: str,
        decode: Decode,
        *,
        max_mb: float,
        every: int,
        rank: int,
        session: int,
        on_error: Callable[[str], None],
    ) -> StepRecorder | None:
        """The recorder of a trainer process (None when it has nowhere to write);
        ``session``: an id every rank of the process agreed on."""
        run_dir = run_directory(Path(save_path).resolve().parent)
        if run_dir is None:
            return None
        stem = writer_stem("trainer", rank)
        return cls(
            run_dir,
            stem,
            decode,
            max_mb=max_mb,
            every=every,
            rank=rank,
            session=session,
            on_error=on_error,
        )

    # -- the training thread ----------------------------------------------------------

    def span(self, phase: str) -> AbstractContextManager[None]:
        """Time a phase of the current step (``grpo_trainer.records.timeline.PHASES``)."""
        return self.timeline.span(phase)

    def begin_step(self, step: int) -> None:
        """Step ``step`` (1-based) starts training: capture its tensors if it is sampled."""
        due = self.rollouts is not None and self.rollouts.due(step)
        self._captured = [] if due else None

    def capture(self, logp: Tensor, entropy: Tensor | None, ratio: Tensor) -> None:
        """Keep one micro-batch's ``[B, L-1]`` tensors (no copy) for :meth:`record`."""
        if self._captured is not None:
            self._captured.append(
                (logp.detach(), None if entropy is None else entropy.detach(), ratio.detach())
            )

    def record(self, step: int, groups: list[Group], batch: StepBatch, lag_base: int) -> None:
        """After the optimizer step: copy the captured tensors to the CPU once and queue the
        step's groups for writing."""
        captured, self._captured = self._captured, None
        if captured is None or self.rollouts is None:
            return
        on_cpu = [
            tuple(None if t is None else t.to("cpu", torch.float32) for t in micro)
            for micro in captured
        ]
        t = time.time()
        self.rollouts.add(lambda: self._build(step, groups, batch, lag_base, on_cpu, t))

    def end_step(self, step: int) -> None:
        """Write the step's spans."""
        self.timeline.flush(step)

    # -- the writer's thread ----------------------------------------------------------

    def _build(
        self,
        step: int,
        groups: list[Group],
        batch: StepBatch,
        lag_base: int,
        captured: list[tuple[Tensor | None, ...]],
        t: float,
    ) -> Iterator[GroupParts]:
        """One :class:`GroupParts` per group this rank trained sequences of."""
        rows = [
            tuple(None if tensor is None else tensor[b].numpy() for tensor in micro)
            for micro in captured
            for b in range(micro[0].shape[0])  # type: ignore[union-attr]
        ]
        starts = np.cumsum([0, *(len(g.tokens) for g in groups)])
        mine: dict[int, list[tuple[int, tuple[np.ndarray | None, ...]]]] = {}
        for k, values in enumerate(rows):
            index = batch.first_row + k
            group = int(np.searchsorted(starts, index, side="right")) - 1
            mine.setdefault(group, []).append((index - int(starts[group]), values))
        for index, sequences in mine.items():
            yield self._parts(step, index, groups[index], sequences, lag_base, t)

    def _parts(
        self,
        step: int,
        index: int,
        group: Group,
        sequences: list[tuple[int, tuple[np.ndarray | None, ...]]],
        lag_base: int,
        t: float,
    ) -> GroupParts:
        advantages = group_advantages(group)
        arrays: dict[str, list[np.ndarray]] = {}
        lengths, texts, scores, seq_advantages = [], [], [], []
        for seq, (logp, entropy, ratio) in sequences:
            tokens = np.asarray(group.tokens[seq], np.int32)
            trained = np.array([False] + [m != IGNORE for m in group.masks[seq][1:]])
            values = {
                "tokens": tokens,
                "trained": trained,
                "inference_logprobs": _masked(group.inference_logprobs[seq], trained),  # type: ignore[index]
                "trainer_logprobs": _shifted(logp, trained),
                "ratio": _shifted(ratio, trained),
            }
            if entropy is not None:
                values["entropy"] = _shifted(entropy, trained)
            for name, array in values.items():
                arrays.setdefault(name, []).append(array)
            start = int(np.argmax(trained)) if trained.any() else len(tokens)
            lengths.append(len(tokens))
            texts.append(self.decode(tokens[start:].tolist()))
            scores.append(group.scores[seq])
            if group.advantages is not None:
                per_token = np.asarray(group.advantages[seq], float)[trained]
                seq_advantages.append(float(per_token.mean()) if len(per_token) else 0.0)
            else:
                seq_advantages.append(advantages[seq])
        first = np.asarray(group.tokens[0])
        first_trained = np.array([False] + [m != IGNORE for m in group.masks[0][1:]])
        prompt = first[: int(np.argmax(first_trained))] if first_trained.any() else first
        flat = {name: np.concatenate(parts) for name, parts in arrays.items()}
        version = group.policy_version
        return GroupParts(
            kind="trained",
            step=step,
            group=index,
            env=group.env,
            env_id=group.env_id,
            version=version,
            lag=None if version is None else lag_base - version,
            t=t,
            scores=scores,
            group_scores=list(group.scores),
            advantages=seq_advantages,
            lengths=lengths,
            arrays=flat,
            prompt_text=self.decode(prompt.tolist()),
            texts=texts,
            pieces=self.pieces_of(flat["tokens"]),
            rank=self.rank,
            session=self.session,
            sequence_ids=[seq for seq, _ in sequences],
        )


def _masked(values: list[float], trained: np.ndarray) -> np.ndarray:
    array = np.asarray(values, np.float32)
    return np.where(trained, array, np.float32(math.nan))


def _shifted(values: np.ndarray | None, trained: np.ndarray) -> np.ndarray:
    """A ``[L-1]`` label-aligned row (position t predicts token t + 1) as ``[L]`` per token
    of the sequence, NaN where not trained."""
    out = np.full(len(trained), np.nan, np.float32)
    if values is not None:
        out[1:] = values[: len(trained) - 1]
    out[~trained] = np.nan
    return out
