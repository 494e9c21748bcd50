"""Mode ``shared_vllm``: the trainer updates the weights the server computes with, in place.

Built-in backend: the server keeps its parameters in a memory-mapped file
(``--shared-weights DIR``, see ``grpo_trainer/serve/shared.py``); ``attach`` writes the
trainer's weights into that file and makes the trainer's parameters views of it. vLLM
backend: see ``vllm_ipc.py`` (same GPU) and ``vllm_nccl.py`` (other GPUs). In all three,
generation is paused (``/pause?mode=wait``: running requests finish first) around the
optimizer step, so no sequence is sampled from half-updated weights, and a sync is only
a version bump plus a prefix-cache reset.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from torch import nn

from grpo_trainer.serve.shared import map_shared_weights
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.client import (
    InferenceClient,
    InferenceUnreachable,
    SyncError,
    base_model_name,
)
from grpo_trainer.sync.cuda_ipc import map_server_weights, same_gpu, share_parameters


class PausedUpdateSync(WeightSync):
    """Pause generation around the optimizer step; a sync resets the prefix cache."""

    mode = "shared_vllm"

    def __init__(self, context: SyncContext) -> None:
        super().__init__(context)
        self.client = InferenceClient(context.inference_url)
        self._paused = False

    def before_optimizer_step(self) -> None:
        """Let running requests finish and hold new ones while the weights change.

        A server that cannot be reached (killed, restarting) samples nothing, and its next
        incarnation serves nothing before the trainer re-attaches to it (the rollout API
        holds the environments until then): the step goes on without a pause.
        """
        try:
            self.client.post("/pause", mode="wait")
        except InferenceUnreachable:
            return
        self._paused = True

    def after_optimizer_step(self) -> None:
        """Release the held requests; they run on the new weights. Nothing to release when
        the pause did not happen, or the paused server is gone (its successor starts
        unpaused)."""
        if not self._paused:
            return
        self._paused = False
        with contextlib.suppress(InferenceUnreachable):
            self.client.post("/resume")

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """The weights are already in place: drop cached prefixes computed with old ones."""
        start = time.perf_counter()
        self.client.post("/reset_prefix_cache")
        return SyncResult(sync_time=time.perf_counter() - start, policy_version=step)

    def close(self) -> None:
        """Never leave the server paused; close the HTTP client."""
        if self._paused:
            self.client.post("/resume")
        self.client.close()


class SharedFileSync(PausedUpdateSync):
    """Built-in backend: trainer parameters become views of the server's weights.

    CPU server: views of its memory-mapped file. CUDA server: views of its GPU tensors
    through CUDA IPC (the trainer on the same GPU), as with vLLM.
    """

    @property
    def shares_weights(self) -> bool:
        return True

    def attach(self, model: nn.Module) -> nn.Module:
        """Copy the trainer's weights into the server's (server paused), then share them."""
        if hasattr(model, "peft_config"):
            raise SyncError("shared_vllm trains the full model; got a peft (LoRA) model")
        self.served_model = base_model_name(self.client)
        answer = self.client.get("/v1/shared_weights").json()
        if answer["transport"] == "cuda_ipc":
            if not same_gpu(self.client, model):
                raise SyncError("the built-in server's weights are on another device")
            views = map_server_weights(self.client, model)
        self.before_optimizer_step()
        try:
            if answer["transport"] == "cuda_ipc":
                share_parameters(model, views)
            else:
                map_shared_weights(model, Path(answer["directory"]), copy_in=True)
        finally:
            self.after_optimizer_step()
        self.client.post("/reset_prefix_cache")
        return model
