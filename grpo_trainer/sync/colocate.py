"""Mode ``colocate``: trainer and inference time-share one device; inference sleeps per step.

Per optimizer step::

    before_train_step()   POST /sleep (mode=wait: running requests finish; new ones wait)
    forward / backward / optimizer.step()   the device's memory is the trainer's
    sync()                weights to the server, POST /wake_up, then GET /is_sleeping must
                          say false before anything samples again

Built-in backend: the weights are shared zero-copy as in ``shared_vllm`` (memory-mapped
file on CPU, CUDA IPC on GPU); sleep level 1 releases the server's caches and holds its
requests, the weights stay (they are the trainer's). vLLM (0.24): sleep always takes the
weights with it (level 1 copies them to CPU and unmaps them, level 2 drops them), so the
trainer cannot hold views of them; it keeps its own copy, vLLM sleeps at level 2 (weights
and KV cache freed), and the sync is ``/wake_up?tags=weights``, vLLM's native ``ipc`` weight
transfer from the trainer's tensors on the same GPU, ``/wake_up?tags=kv_cache``.

A wake-up that fails is retried (the HTTP client's backoff, then the training loop's sync
retries); then the run stops with the reason (``max_sync_lag`` is 0 in this mode), so no
step ever trains, and no environment ever samples, against a sleeping or stale engine.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from torch import nn

from grpo_trainer.sync.base import SyncContext, SyncResult
from grpo_trainer.sync.client import InferenceClient, SyncError
from grpo_trainer.sync.shared import SharedFileSync


class SleepControl:
    """``/sleep``, ``/wake_up`` and ``/is_sleeping`` of one server; wake-ups timed."""

    def __init__(self, client: InferenceClient) -> None:
        self.client = client
        self.asleep = False
        self.wake_time = 0.0

    def sleep(self, level: int) -> None:
        """Put the server to sleep; running requests finish first, new ones wait."""
        self.client.post("/sleep", level=level, mode="wait")
        self.asleep = True

    def wake(self, tags: list[str] | None = None) -> None:
        """Wake ``tags`` (all when None); adds its seconds to ``wake_time``."""
        start = time.perf_counter()
        self.client.post("/wake_up", **({"tags": tags} if tags else {}))
        self.wake_time += time.perf_counter() - start

    def confirm_awake(self) -> None:
        """Raise ``SyncError`` unless the server says it is awake."""
        answer = self.client.get("/is_sleeping").json()
        if answer.get("is_sleeping") is not False:
            raise SyncError(f"{self.client.base_url} is still asleep after /wake_up: {answer}")
        self.asleep = False

    def take_wake_time(self) -> float:
        """Seconds spent waking since the last call."""
        seconds, self.wake_time = self.wake_time, 0.0
        return seconds


class ColocateSharedSync(SharedFileSync):
    """Built-in backend: shared weights (as ``shared_vllm``) plus sleep level 1 per step."""

    mode = "colocate"
    sleeps = True
    sleep_level = 1

    def __init__(self, context: SyncContext) -> None:
        super().__init__(context)
        self.control = SleepControl(self.client)

    def attach(self, model: nn.Module) -> nn.Module:
        """Share the weights, then wake the server (a trainer restarted mid-step finds it
        asleep) and confirm it is awake."""
        model = super().attach(model)
        self.control.wake()
        self.control.confirm_awake()
        self.control.take_wake_time()  # not a step's
        return model

    def before_train_step(self) -> None:
        """Sleep: the device's memory is the trainer's until the sync wakes the server."""
        self.control.sleep(self.sleep_level)

    def before_optimizer_step(self) -> None:
        """Asleep, nothing runs: no pause needed (attach still pauses while it copies)."""
        if not self.control.asleep:
            super().before_optimizer_step()

    def after_optimizer_step(self) -> None:
        """Mirror of ``before_optimizer_step``."""
        if not self.control.asleep:
            super().after_optimizer_step()

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """The weights are in place (sleep dropped every cache): wake, confirm awake."""
        start = time.perf_counter()
        self.control.wake()
        self.control.confirm_awake()
        return SyncResult(
            sync_time=time.perf_counter() - start,
            policy_version=step,
            phases={"wake": self.control.take_wake_time()},
        )

    def close(self) -> None:
        """Never leave the server asleep (best effort: it may be gone already)."""
        if self.control.asleep:
            with contextlib.suppress(SyncError):
                self.control.wake()
        super().close()


class VllmColocateSync(ColocateSharedSync):
    """vLLM: own weights, sleep level 2, IPC weight transfer between the two wake-ups."""

    sleep_level = 2

    def attach(self, model: nn.Module) -> nn.Module:
        """Push the start weights through one sleep/wake cycle (also wakes a server that a
        trainer restarted mid-step left asleep, its weights dropped)."""
        if hasattr(model, "peft_config"):
            raise SyncError("colocate trains the full model; got a peft (LoRA) model")
        if next(model.parameters()).device.type != "cuda":
            raise SyncError("colocate on vLLM needs the trainer on the server's CUDA device")
        self.client.post("/init_weight_transfer_engine", json={"init_info": {}})
        self.before_train_step()
        self.sync(model, 0)
        return model

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Wake the weights, send ours into them, wake the KV cache, confirm awake."""
        start = time.perf_counter()
        if self.control.asleep:
            self.control.wake(["weights"])
        pushed = time.perf_counter()
        self._push(model)
        push_time = time.perf_counter() - pushed
        if self.control.asleep:
            self.control.wake(["kv_cache"])
        self.control.confirm_awake()
        return SyncResult(
            sync_time=time.perf_counter() - start,
            policy_version=step,
            phases={"wake": self.control.take_wake_time(), "push": push_time},
        )

    def _push(self, model: nn.Module) -> None:
        """vLLM's native IPC transfer: handles of our tensors, loaded by its workers."""
        from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine

        args: dict[str, Any] = {"send_mode": "http", "url": self.client.base_url}
        self.client.post("/start_weight_update", json={"is_checkpoint_format": True})
        IPCWeightTransferEngine.trainer_send_weights(iter(model.named_parameters()), args)
        self.client.post("/finish_weight_update")
