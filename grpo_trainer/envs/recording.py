"""What an environment records (``grpo_trainer/records``): the all-equal groups it drops,
which the trainer never sees, and its generation and back-pressure waits as timeline spans.

On the event loop this only appends to lists; decoding and writing run on the background
writer's thread. Records go to ``$GRPO_TUI_RUN_DIR`` (none without a supervisor).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import numpy as np

from grpo_trainer.envs.groups import Group
from grpo_trainer.records.process import Decode, ProcessRecords
from grpo_trainer.records.rollout_writer import run_directory, writer_stem
from grpo_trainer.records.rollouts import GroupParts


class EnvRecorder(ProcessRecords):
    """One environment process's dropped-group log and timeline."""

    role = "env"
    drops = 0
    """Groups dropped for equal scores so far (every ``every``-th is recorded)."""

    @classmethod
    def for_env(
        cls,
        name: str,
        decode: Decode,
        *,
        max_mb: float,
        every: int,
        on_error: Callable[[str], None],
    ) -> EnvRecorder | None:
        """The recorder of a supervised environment (None without a run directory)."""
        run_dir = run_directory()
        if run_dir is None:
            return None
        stem = writer_stem(f"env.{name}")
        return cls(run_dir, stem, decode, max_mb=max_mb, every=every, on_error=on_error)

    def dropped(
        self, group: Group, *, step: int, env: str, env_id: int | None, lag: int | None
    ) -> None:
        """Record a group dropped for equal scores (every ``every``-th one)."""
        self.drops += 1
        if self.rollouts is None or not self.rollouts.due(self.drops - 1):
            return
        index, t = self.drops, time.time()
        self.rollouts.add(lambda: self._parts(group, step, index, env, env_id, lag, t))

    def flush(self, step: int) -> None:
        """Write the spans since the last flush (overlapping requests merged)."""
        self.timeline.flush(step, merged=True)

    def _parts(
        self,
        group: Group,
        step: int,
        index: int,
        env: str,
        env_id: int | None,
        lag: int | None,
        t: float,
    ) -> Iterator[GroupParts]:
        tokens = [np.asarray(seq, np.int32) for seq in group.tokens]
        trained = [np.asarray(mask, np.int64) >= 0 for mask in group.masks]
        logprobs = [
            np.where(mask, np.asarray(lp, np.float32), np.float32(math.nan))
            for lp, mask in zip(group.inference_logprobs, trained, strict=True)
        ]
        flat_tokens = np.concatenate(tokens)
        starts = [int(np.argmax(mask)) if mask.any() else len(mask) for mask in trained]
        yield GroupParts(
            kind="dropped",
            step=step,
            group=index,
            env=env,
            env_id=env_id,
            version=group.policy_version,
            lag=lag,
            t=t,
            scores=list(group.scores),
            advantages=None,
            lengths=[len(seq) for seq in tokens],
            arrays={
                "tokens": flat_tokens,
                "trained": np.concatenate(trained),
                "inference_logprobs": np.concatenate(logprobs),
            },
            prompt_text=self.decode(tokens[0][: starts[0]].tolist()),
            texts=[self.decode(seq[s:].tolist()) for seq, s in zip(tokens, starts, strict=True)],
            pieces=self.pieces_of(flat_tokens),
        )
