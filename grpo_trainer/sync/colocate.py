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
and KV cache freed), and the sync is ``/wake_up?tags=weights``, then the worker extension
opens the trainer's tensors by CUDA IPC and loads them in place (``grpo_load_weights``),
then ``/wake_up?tags=kv_cache`` (TRL's order for vLLM's sleep mode).

A wake-up that fails is retried (the HTTP client's backoff, then the training loop's sync
retries); then the run stops with the reason (``max_sync_lag`` is 0 in this mode), so no
step ever trains, and no environment ever samples, against a sleeping or stale engine.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from grpo_trainer.sync.base import SyncContext, SyncResult
from grpo_trainer.sync.client import InferenceClient, SyncError, base_model_name
from grpo_trainer.sync.cuda_ipc import same_gpu, tensor_handles
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


def release_cached_memory() -> None:
    """Give the trainer's cached, unused CUDA blocks (the step's activations) back to the
    device before inference wakes and allocates its KV cache there (no-op without CUDA)."""
    torch.cuda.empty_cache()


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
        release_cached_memory()
        self.control.wake()
        self.control.confirm_awake()
        return SyncResult(
            sync_time=time.perf_counter() - start,
            policy_version=step,
            phases={"wake": self.control.take_wake_time()},
        )

    def close(self) -> None:
        """Never leave the server asleep: wake it. A wake that fails (the server is gone or
        refuses) raises ``SyncError`` once the rest is released, so that the caller says so:
        a mode switch then fails (the trainer restarts in the new mode), a trainer that ends
        reports it."""
        try:
            if self.control.asleep:
                try:
                    self.control.wake()
                except SyncError as exc:
                    url = self.client.base_url
                    raise SyncError(f"inference at {url} is left asleep: {exc}") from exc
        finally:
            super().close()


class VllmColocateSync(ColocateSharedSync):
    """vLLM: own weights, sleep level 2, weights loaded by CUDA IPC between the two wake-ups."""

    sleep_level = 2

    @property
    def shares_weights(self) -> bool:
        """The trainer keeps its own copy: vLLM's sleep takes the weights with it."""
        return False

    def attach(self, model: nn.Module) -> nn.Module:
        """Push the start weights through one sleep/wake cycle (also wakes a server that a
        trainer restarted mid-step left asleep, its weights dropped), then read one
        parameter back: vLLM must now hold exactly the trainer's values."""
        if hasattr(model, "peft_config"):
            raise SyncError("colocate trains the full model; got a peft (LoRA) model")
        if not same_gpu(self.client, model):
            raise SyncError(
                "colocate on vLLM needs the trainer on the GPU vLLM runs on "
                "([trainer] gpus = [inference] gpus, one GPU)"
            )
        self.served_model = base_model_name(self.client)
        self.before_train_step()
        self.sync(model, 0)
        self._check_loaded(model)
        return model

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Wake the weights, load ours into them, wake the KV cache, confirm awake."""
        start = time.perf_counter()
        release_cached_memory()
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
        """Handles of our parameters to the worker, which loads them (it reads our memory,
        so the optimizer step's kernels must have finished first)."""
        params = list(model.named_parameters())
        torch.cuda.synchronize(params[0][1].device)
        payload = tensor_handles(params)
        answer = self.client.post(
            "/collective_rpc", json={"method": "grpo_load_weights", "args": [payload]}
        )
        loaded = answer.json().get("results", [])
        if loaded != [str(len(params))]:
            raise SyncError(f"vLLM loaded {loaded} tensors, the trainer sent {len(params)}")
        torch.cuda.ipc_collect()

    def _check_loaded(self, model: nn.Module) -> None:
        """vLLM's smallest unfused parameter must equal the trainer's after a push."""
        layout = self.client.post("/collective_rpc", json={"method": "grpo_weight_layout"})
        ours = dict(model.named_parameters())
        common = [entry[0] for entry in layout.json()["results"][0] if entry[0] in ours]
        if not common:
            raise SyncError("vLLM and the trainer share no parameter name to check the load by")
        name = min(common, key=lambda key: ours[key].numel())
        answer = self.client.post(
            "/collective_rpc", json={"method": "grpo_parameter_values", "args": [name]}
        )
        served = torch.tensor(answer.json()["results"][0])
        if not torch.equal(served, ours[name].detach().float().cpu()):
            raise SyncError(f"vLLM's {name} differs from the trainer's after the weight load")
