"""Mode ``shared_vllm`` on vLLM: zero-copy on the same GPU, NCCL transfer across GPUs.

Same GPU (the trainer's device UUID equals vLLM's): the worker extension exports CUDA
IPC handles of vLLM's parameters; the trainer's parameters become views of them (fused
qkv / gate_up split into HF names), so ``optimizer.step()`` writes vLLM's weights. Generation
is paused (``wait``) around the step; a sync resets the prefix cache.

Other GPUs: vLLM's native weight transfer (``/init_weight_transfer_engine`` once, then per
sync ``/start_weight_update``, ``/update_weights`` while the trainer broadcasts over NCCL,
``/finish_weight_update``), with generation paused during the transfer. Where every vLLM
worker holds whole tensors (TP 1), the trainer sends them in vLLM's own layout (fused
``qkv_proj``/``gate_up_proj``, padded vocabulary; ``vllm_names.kernel_tensors``) and vLLM
copies each straight into its parameter; otherwise in checkpoint format, which vLLM's
weight loaders shard and fuse (a layer-by-layer reload, several times slower). The receive
runs through the worker extension (``grpo_update_weights``: vLLM's own receive under
``no_grad``), and the direct copy is tried once on one small tensor before it is trusted:
one broadcast cannot leave the trainer blocked if vLLM's side fails. With ``delta`` (the
trainer's ``weight_transfer_delta``) and vLLM's layout known, each sync sends only the
elements that changed since the last one (``sync/delta.py``; received and checksummed by
the worker extension's ``grpo_receive_delta``), on the same NCCL group.
Needs ``VLLM_SERVER_DEV_MODE=1`` and the worker extension: ``inference_command`` sets both.
Tensor parallel size 1 for the zero-copy path.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from grpo_trainer.control import SupervisorLink, report_event
from grpo_trainer.sync.base import SyncContext, SyncResult
from grpo_trainer.sync.client import SyncError, base_model_name
from grpo_trainer.sync.cuda_ipc import map_server_weights, same_gpu, share_parameters
from grpo_trainer.sync.delta import BUCKET_BYTES, DeltaSender, Entry, SendStats
from grpo_trainer.sync.shared import PausedUpdateSync
from grpo_trainer.sync.vllm_names import hf_parts, kernel_tensors

TRANSFER_ADDRESS_ENV = "GRPO_WEIGHT_TRANSFER_ADDRESS"
"""Address vLLM's workers reach the trainer at for the NCCL group (the trainer is its rank
0): 127.0.0.1 on one host; on a cluster the role layer sets the trainer node's address."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VllmSharedSync(PausedUpdateSync):
    """Picks zero-copy CUDA IPC or NCCL transfer at ``attach`` from where the trainer runs."""

    def __init__(self, context: SyncContext, *, link: SupervisorLink | None = None) -> None:
        super().__init__(context)
        self.link = link
        """The trainer's supervisor link: where a fallback is reported (None: log only)."""
        self.zero_copy = False
        self._group: Any = None
        self._layout: list[tuple[str, list[int], str]] | None = None
        self._receiver: threading.Thread | None = None
        self._failure: list[BaseException] = []
        self._phases: dict[str, float] = {}
        self._started = 0.0
        self._delta: DeltaSender | None = None
        self.last_send: SendStats | None = None
        """What the last delta sync sent (elements changed, bytes): for benchmarks."""
        # The fixed costs of an NCCL sync, as switches (benchmarks/nccl_sync.py measures each;
        # the defaults are what every run has used).
        self.pause_mode = "wait"
        """vLLM's ``/pause`` mode: ``wait`` (in-flight requests finish first), ``keep``
        (frozen, continued after the resume, as TRL's async trainer does) or ``abort``."""
        self.reset_after_resume = True
        """``/reset_prefix_cache`` after ``/resume``: ``/pause`` clears the caches already."""
        self.packed_buffer_bytes: int | None = None
        """vLLM's packed NCCL broadcast buffer for a full sync (None: vLLM's default)."""
        self.delta_bucket_bytes = BUCKET_BYTES

    @property
    def shares_weights(self) -> bool:
        return self.zero_copy

    def attach(self, model: nn.Module) -> nn.Module:
        """Share vLLM's weights on the same GPU, else open the NCCL transfer group."""
        if hasattr(model, "peft_config"):
            raise SyncError("shared_vllm trains the full model; got a peft (LoRA) model")
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise SyncError("shared_vllm on vLLM needs the trainer on a CUDA device")
        self.served_model = base_model_name(self.client)
        self.zero_copy = same_gpu(self.client, model)
        if self.zero_copy:
            views = map_server_weights(self.client, model)
            self.before_optimizer_step()
            try:
                share_parameters(model, views)
            finally:
                self.after_optimizer_step()
            self.client.post("/reset_prefix_cache")
        else:
            self._init_nccl(device)
            self._layout = self._kernel_layout(model)
            self._start_delta()
            self.sync(model, 0)
        return model

    def _start_delta(self) -> None:
        """The delta sender over vLLM's layout, when asked for and the layout is known."""
        if not self.context.delta:
            return
        if self._layout is None:
            report_event(
                self.link,
                "warning",
                "weight_transfer_delta needs vLLM's own layout (tensor parallel 1 and a "
                "working direct copy); every sync sends every weight instead",
            )
            return
        entries = [Entry(name, tuple(shape), dtype) for name, shape, dtype in self._layout]
        self._delta = DeltaSender(entries, self.delta_bucket_bytes)

    def _kernel_layout(self, model: nn.Module) -> list[tuple[str, list[int], str]] | None:
        """vLLM's parameter layout when every worker holds whole tensors ``model`` can fill.

        None (send in checkpoint format) when workers differ (tensor parallel shards) or
        the trainer's parameters do not build vLLM's exactly (checked on the meta device).
        """
        answer = self.client.post("/collective_rpc", json={"method": "grpo_weight_layout"})
        layouts = answer.json().get("results", [])
        if not layouts or any(layout != layouts[0] for layout in layouts):
            return None
        layout = [
            (str(name), [int(d) for d in shape], str(dtype)) for name, shape, dtype in layouts[0]
        ]
        shapes = (
            (name, torch.empty(p.shape, dtype=p.dtype, device="meta"))
            for name, p in model.named_parameters()
        )
        try:
            for _ in kernel_tensors(shapes, layout):
                pass
        except ValueError:
            return None
        return layout if self._direct_copy_works(layout, next(model.parameters()).device) else None

    def _direct_copy_works(
        self, layout: list[tuple[str, list[int], str]], device: torch.device
    ) -> bool:
        """Send vLLM's smallest unfused parameter back to it, in its own layout, once.

        The values come from vLLM itself, so the probe changes nothing it serves. A failure
        is a warning in the trainer's log and the run's events (naming it), and the run
        sends in checkpoint format instead.
        """
        name, shape, dtype = min(
            (entry for entry in layout if hf_parts(entry[0]) == [entry[0]]),
            key=lambda entry: math.prod(entry[1]),
        )
        answer = self.client.post(
            "/collective_rpc", json={"method": "grpo_parameter_values", "args": [name]}
        )
        values = torch.tensor(answer.json()["results"][0], dtype=getattr(torch, dtype))
        chosen, self._layout = self._layout, [(name, shape, dtype)]
        try:
            self.begin_transfer(self._layout)
            self.send(iter([(name, values.to(device).reshape(shape))]))
            self.end_transfer()
            return True
        except Exception as exc:  # any failure of vLLM's side means: do not use this path
            report_event(
                self.link,
                "warning",
                f"vLLM's direct-copy weight update failed ({exc}); every sync sends the "
                "weights in checkpoint format instead (vLLM reloads them layer by layer, slower)",
            )
            return False
        finally:
            self._layout = chosen

    def _init_nccl(self, device: torch.device) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        world = int(self.client.get("/get_world_size").json()["world_size"])
        info = {
            "master_address": os.environ.get(TRANSFER_ADDRESS_ENV, "127.0.0.1"),
            "master_port": _free_port(),
            "rank_offset": 1,
            "world_size": world + 1,
        }
        failure: list[BaseException] = []

        def server_side() -> None:
            try:
                self.client.post("/init_weight_transfer_engine", json={"init_info": info})
            except BaseException as error:
                failure.append(error)

        worker = threading.Thread(target=server_side, daemon=True)
        worker.start()
        with torch.cuda.device(device):
            self._group = NCCLWeightTransferEngine.trainer_init(info)
        worker.join()
        if failure:
            raise SyncError(f"vLLM did not join the NCCL group: {failure[0]}")

    def before_optimizer_step(self) -> None:
        """Pause only when the trainer writes vLLM's memory directly."""
        if self.zero_copy:
            super().before_optimizer_step()

    def after_optimizer_step(self) -> None:
        """Resume after a zero-copy step."""
        if self.zero_copy:
            super().after_optimizer_step()

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        """Zero-copy: reset the prefix cache. NCCL: broadcast every parameter to vLLM."""
        if self.zero_copy:
            return super().sync(model, step)
        start = time.perf_counter()
        params = [
            (name, list(p.shape), str(p.dtype).removeprefix("torch."))
            for name, p in model.named_parameters()
        ]
        try:
            self.begin_transfer(params)
            with torch.no_grad():
                self.send(iter(model.named_parameters()))
        finally:
            phases = self.end_transfer()
        return SyncResult(sync_time=time.perf_counter() - start, policy_version=step, phases=phases)

    def open_transfer(self, model: nn.Module) -> None:
        """Open the NCCL group to vLLM on other GPUs (a sharded trainer: on rank 0 only)."""
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise SyncError("shared_vllm on vLLM needs the trainer on a CUDA device")
        if same_gpu(self.client, model):
            raise SyncError(
                "shared_vllm with a multi-GPU trainer needs vLLM off rank 0's GPU (NCCL weight "
                "transfer): zero-copy sharing needs the whole model on one trainer GPU"
            )
        self.served_model = base_model_name(self.client)
        self._init_nccl(device)
        self._layout = self._kernel_layout(model)
        self._start_delta()

    def begin_transfer(self, params: list[tuple[str, list[int], str]]) -> None:
        """Pause generation, open a weight update, and have vLLM receive in the background.

        ``params`` is the trainer's ``(name, shape, dtype)`` per parameter, in order (sent
        as is, in checkpoint format, unless vLLM's own layout is known). Always follow with
        ``end_transfer``, which resumes generation.
        """
        layout = self._layout if self._layout is not None else params
        update_info = {
            "names": [name for name, _, _ in layout],
            "dtype_names": [dtype for _, _, dtype in layout],
            "shapes": [shape for _, shape, _ in layout],
            "packed": True,
        }

        method = "grpo_update_weights"
        if self.packed_buffer_bytes is not None:
            update_info["packed_buffer_size_bytes"] = self.packed_buffer_bytes
        if self._delta is not None:
            method = "grpo_receive_delta"
            update_info = {**update_info, "bucket_bytes": self.delta_bucket_bytes}

        def server_side() -> None:
            try:
                self.client.post(
                    "/collective_rpc",
                    json={"method": method, "args": [json.dumps(update_info)]},
                )
            except BaseException as error:
                self._failure.append(error)

        self._started = time.perf_counter()
        self._phases = {}
        self._failure = []
        self.client.post("/pause", mode=self.pause_mode)
        self._lap("pause")
        if self._delta is None:  # vLLM's own receive; the delta writes vLLM's tensors itself
            self.client.post(
                "/start_weight_update", json={"is_checkpoint_format": self._layout is None}
            )
        self._lap("start")
        self._receiver = threading.Thread(target=server_side, daemon=True)
        self._receiver.start()

    def send(self, named: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Broadcast the trainer's HF-named tensors over NCCL, in vLLM's layout when known.

        ``named`` is consumed lazily (a sharded trainer gathers one parameter at a time).
        """
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        stream = kernel_tensors(named, self._layout) if self._layout is not None else named
        if self._delta is not None:
            group = self._group
            self.last_send = self._delta.send(stream, lambda t: group.broadcast(t, src=0))
            return
        args: dict[str, Any] = {"group": self._group, "packed": True}
        if self.packed_buffer_bytes is not None:
            args["packed_buffer_size_bytes"] = self.packed_buffer_bytes
        NCCLWeightTransferEngine.trainer_send_weights(stream, args)

    def end_transfer(self) -> dict[str, float]:
        """Wait until vLLM loaded what was sent, finish the update, resume generation.

        Returns the seconds per phase (pause, start, transfer, finish, resume).
        """
        try:
            if self._receiver is not None:
                self._receiver.join()
                self._lap("transfer")
                if self._failure:
                    raise SyncError(f"vLLM /update_weights failed: {self._failure[0]}")
                if self._delta is None:
                    self.client.post("/finish_weight_update")
                self._lap("finish")
        finally:
            self._receiver = None
            self.client.post("/resume")
        if self.reset_after_resume:
            self.client.post("/reset_prefix_cache")
        self._lap("resume")
        return dict(self._phases)

    def _lap(self, phase: str) -> None:
        elapsed = time.perf_counter() - self._started
        self._phases[phase] = elapsed - sum(self._phases.values())
