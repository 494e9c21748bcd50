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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from grpo_trainer.records.process import Decode, ProcessRecords
from grpo_trainer.records.rollout_writer import run_directory, writer_stem
from grpo_trainer.records.rollouts import GroupParts
from grpo_trainer.train.data import Group, StepBatch, group_advantages


def fast_decode(tokenizer: PreTrainedTokenizerBase) -> Decode:
    """Token ids to text through the tokenizers library directly when the tokenizer is a
    fast one (transformers' ``decode`` checks every id in Python first: most of the
    recording's cost), else through ``decode``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return lambda ids: tokenizer.decode(ids)
    return lambda ids: backend.decode(ids, skip_special_tokens=False)


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
        """``settings``: :class:`ProcessRecords`' (``max_mb``, ``every``, ``on_error``).
        The writer works while the trainer waits for a batch (:meth:`waiting`)."""
        self.idle = threading.Event()
        super().__init__(run_dir, stem, decode, idle=self.idle, **settings)
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

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The wait for the next batch: its span, and the writer's time to work."""
        self.idle.set()
        try:
            with self.timeline.span("wait"):
                yield
        finally:
            self.idle.clear()

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
        """One :class:`GroupParts` per group this rank trained sequences of, cut from the
        micro-batches' padded tensors (a group's rows are consecutive) with a few array
        operations per group."""
        table = _StepArrays(batch, captured)
        starts = np.cumsum([0, *(len(g.tokens) for g in groups)])
        first, rows = batch.first_row, len(table.tokens)
        begin = int(np.searchsorted(starts, first, side="right")) - 1
        spans = []
        for index in range(begin, len(groups)):
            a, b = max(int(starts[index]), first) - first, min(int(starts[index + 1]) - first, rows)
            if a >= b:
                break
            spans.append((index, a, b))
        completions = [
            table.tokens[r, table.start[r] : table.length[r]].tolist() for r in range(rows)
        ]
        texts = [self.decode(ids) for ids in completions]
        for index, a, b in spans:
            group = groups[index]
            seq0 = a + first - int(starts[index])
            prompt = table.tokens[a, : table.start[a]].tolist() if seq0 == 0 else []
            yield self._parts(
                step, index, group, table, a, b, seq0, texts[a:b], prompt, lag_base, t
            )

    def _parts(
        self,
        step: int,
        index: int,
        group: Group,
        table: _StepArrays,
        a: int,
        b: int,
        seq0: int,
        texts: list[str],
        prompt: list[int],
        lag_base: int,
        t: float,
    ) -> GroupParts:
        keep = table.present[a:b]
        flat = {name: array[a:b][keep] for name, array in table.arrays.items()}
        sequence_ids = list(range(seq0, seq0 + b - a))
        if group.advantages is not None:
            advantages = [
                float(
                    np.mean(
                        np.asarray(group.advantages[i])[1:][
                            table.trained[a + k, 1 : table.length[a + k]]
                        ]
                    )
                )
                if table.trained[a + k].any()
                else 0.0
                for k, i in enumerate(sequence_ids)
            ]
        else:
            per_group = group_advantages(group)
            advantages = [per_group[i] for i in sequence_ids]
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
            scores=[group.scores[i] for i in sequence_ids],
            group_scores=list(group.scores),
            advantages=advantages,
            lengths=table.length[a:b].tolist(),
            arrays=flat,
            prompt_text=self.decode(prompt) if prompt else "",
            texts=texts,
            pieces=self.pieces_of(flat["tokens"]),
            rank=self.rank,
            session=self.session,
            sequence_ids=sequence_ids,
        )


class _StepArrays:
    """This rank's rows of the step, padded to one width: token ids, which positions exist
    and which are trained, and per position the inference logprob and the captured
    trainer logprob, entropy and ratio (moved from label positions, ``t`` predicts
    ``t + 1``, to the token they score; NaN where not trained)."""

    def __init__(self, batch: StepBatch, captured: list[tuple[Tensor | None, ...]]) -> None:
        width = max(m.input_ids.shape[1] for m in batch.micro_batches)

        def stacked(tensors: list[Tensor], fill: float, shift: int) -> np.ndarray:
            out = np.full((sum(t.shape[0] for t in tensors), width), fill, np.float32)
            row = 0
            for tensor in tensors:
                values = tensor.numpy()
                out[row : row + len(values), shift : shift + values.shape[1]] = values
                row += len(values)
            return out

        micro = batch.micro_batches
        self.tokens = stacked([m.input_ids for m in micro], 0, 0).astype(np.int32)
        self.present = stacked([m.attention_mask for m in micro], 0, 0) > 0
        self.trained = stacked([m.loss_mask for m in micro], 0, 1) > 0
        self.length = self.present.sum(axis=1)
        trained_any = self.trained.any(axis=1)
        self.start = np.where(trained_any, self.trained.argmax(axis=1), self.length)
        nan = np.float32(math.nan)
        self.arrays = {
            "tokens": self.tokens,
            "trained": self.trained,
            "inference_logprobs": np.where(
                self.trained, stacked([m.inference_logprobs for m in micro], 0, 1), nan
            ),
        }
        names = ("trainer_logprobs", "entropy", "ratio")
        for position, name in enumerate(names):
            tensors = [c[position] for c in captured]
            if all(t is not None for t in tensors):
                values = stacked(tensors, 0, 1)  # type: ignore[arg-type]
                self.arrays[name] = np.where(self.trained, values, nan)
