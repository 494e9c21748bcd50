"""Weight sync from FSDP2 shards on 2 CPU ranks (gloo): ``grpo_trainer.sync.sharded``.

vLLM's NCCL transfer cannot run here, so rank 0's transfer is a recorder with the same
four phases as ``VllmSharedSync`` (open, begin, send, end); everything else is real: the
sharded model, the per-parameter gathers on both ranks, rank 0's CPU mirror, and the
broadcast of rank 0's outcome. The NCCL path itself runs on GPUs in the lead's benchmark.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.multiprocessing as mp
from gloo_ranks import join
from torch import nn
from train_helpers import tiny_model

from grpo_trainer.models import load_model
from grpo_trainer.ranks.group import shutdown_distributed
from grpo_trainer.ranks.mirror import Consolidator
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.sync.client import SyncError
from grpo_trainer.sync.sharded import ShardedSync
from grpo_trainer.sync.vllm_shared import VllmSharedSync
from grpo_trainer.train.fsdp import shard_model


class RecordingTransfer(VllmSharedSync):
    """Rank 0's NCCL transfer, recorded instead of sent (no vLLM here)."""

    def __init__(self, context: SyncContext) -> None:
        super().__init__(context)
        self.calls: list[str] = []
        self.received: list[tuple[str, torch.Tensor]] = []
        self.fail_begin = False

    def open_transfer(self, model: nn.Module) -> None:
        self.calls.append("open")

    def begin_transfer(self, params: list[tuple[str, list[int], str]]) -> None:
        self.calls.append("begin")
        if self.fail_begin:
            raise SyncError("vLLM refused /start_weight_update")
        self.announced = params

    def send(self, named: Iterator[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named:  # lazily, as vLLM's packed sender consumes it
            self.received.append((name, tensor.clone()))

    def end_transfer(self) -> dict[str, float]:
        self.calls.append("end")
        return {"transfer": 0.5}


class RecordingSave(WeightSync):
    """Rank 0's save-based strategy (``none`` / LoRA modes), recording the mirror it gets."""

    mode = "none"

    def __init__(self, context: SyncContext) -> None:
        super().__init__(context)
        self.states: list[dict[str, torch.Tensor]] = []

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        self.states.append({k: v.clone() for k, v in model.state_dict().items()})
        return SyncResult(sync_time=0.25, policy_version=step)


def _worker(rank: int, port: int, model_path: str, out: str) -> None:
    world = join(rank, port)
    context = SyncContext("http://127.0.0.1:9", "policy", Path(out), "vllm")
    facts: dict[str, object] = {}
    try:
        model = load_model(model_path)
        consolidator = Consolidator(model, world, "float32")
        model = shard_model(model, world, dtype="float32")
        with torch.no_grad():  # a trained step's change, so the mirror must be refreshed
            for param in model.parameters():
                param.add_(0.5)

        transfer = RecordingTransfer(context) if world.is_main else None
        nccl = ShardedSync(
            context, mode="shared_vllm", inner=transfer, world=world,
            consolidator=consolidator, dtype=torch.float32,
        )  # fmt: skip
        nccl.attach(model)  # opens the group, sends the starting weights
        result = nccl.sync(model, 7)
        facts["nccl_result"] = [result.policy_version, result.phases]
        if transfer is not None:
            transfer.fail_begin = True
        try:
            nccl.sync(model, 8)
        except SyncError as exc:
            facts["failure"] = str(exc)

        saver = RecordingSave(context) if world.is_main else None
        save = ShardedSync(
            context, mode="none", inner=saver, world=world,
            consolidator=consolidator, dtype=torch.float32,
        )  # fmt: skip
        saved = save.sync(model, 9)
        facts["save_result"] = [saved.policy_version, saved.sync_time]
        if world.is_main:
            assert transfer is not None and saver is not None
            expected = {n: p + 0.5 for n, p in load_model(model_path).named_parameters()}
            facts["calls"] = transfer.calls
            facts["received"] = [name for name, _ in transfer.received]
            facts["expected"] = list(expected)
            facts["announced"] = [name for name, _, _ in transfer.announced]
            facts["nccl_equal"] = all(
                torch.equal(tensor, expected[name]) for name, tensor in transfer.received
            )
            state = saver.states[0]
            facts["mirror_equal"] = all(torch.equal(state[n], expected[n]) for n in expected)
    finally:
        shutdown_distributed(world)
    Path(out, f"rank{rank}.json").write_text(json.dumps(facts))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_sync_from_shards_gathers_every_parameter_and_shares_rank_0s_outcome(
    tmp_path: Path,
) -> None:
    model = tiny_model(tmp_path / "model")
    mp.spawn(_worker, args=(_free_port(), str(model), str(tmp_path)), nprocs=2)
    main, other = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    # shared_vllm: attach (open + a first send) and a sync, each a whole, ordered model
    assert main["calls"][:6] == ["open", "begin", "end", "begin", "end", "begin"]
    assert main["calls"][6] == "end"  # generation resumed after the refused update
    assert main["received"] == main["expected"] * 2 and main["announced"] == main["expected"]
    assert main["nccl_equal"]  # whole tensors, the trained values
    assert main["nccl_result"] == other["nccl_result"] == [7, {"transfer": 0.5}]
    # a refusal on rank 0 reaches rank 1 as an error too (no rank left in a collective)
    assert "start_weight_update" in main["failure"]
    assert "rank 0's weight sync failed" in other["failure"]
    # none / LoRA modes: rank 0's mirror holds the trained weights; same result everywhere
    assert main["mirror_equal"]
    assert main["save_result"] == other["save_result"] == [9, 0.25]
