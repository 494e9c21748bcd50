"""Delta weight transfer (``sync/delta.py``) between two real processes over gloo.

Rank 0 trains a real tiny model (float32 masters, AdamW, a real loss) and sends its bf16
weights after every optimizer step; rank 1 holds a different copy and applies each sync.
After each one rank 1's tensors are sent back and compared bit for bit with rank 0's; the
first sync is dense, the later ones send the changed elements only; a receiver whose copy
drifted from the sender's last send is caught by the bucket checksums.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import join
from sync_helpers import free_port

from grpo_trainer.models import build_tiny_model, load_model
from grpo_trainer.ranks.group import shutdown_distributed
from grpo_trainer.sync.delta import BUCKET_BYTES, DeltaMismatch, DeltaSender, Entry, plan, receive
from grpo_trainer.sync.vllm_worker import SharedWeightsExtension

BUCKET = 6000  # bytes: several buckets, and the embedding (44 x 64 x 2 B) one of its own


def _sync_and_compare(rank: int, model, sender, layout, targets) -> dict:
    """One sync, then rank 1's tensors back to rank 0, compared bit for bit there."""
    send = lambda t: dist.broadcast(t, src=0)  # noqa: E731
    outcome: dict = {}
    if rank == 0:
        named = ((n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters())
        stats = sender.send(named, send)
        outcome |= {"changed": stats.changed_fraction, "dense": stats.dense_buckets}
        outcome |= {"buckets": stats.buckets, "bytes": stats.bytes_sent}
    else:
        try:
            outcome["written"] = receive(targets, send, layout, BUCKET)
        except DeltaMismatch as error:
            outcome["mismatch"] = str(error)
    equal = True
    for entry in layout:
        back = (
            dict(targets)[entry.name].clone()
            if rank == 1
            else torch.empty(entry.shape, dtype=torch.bfloat16)
        )
        dist.broadcast(back, src=1)
        if rank == 0:
            mine = model.get_parameter(entry.name).detach().to(torch.bfloat16)
            equal &= torch.equal(back.view(torch.int16), mine.view(torch.int16))
    outcome["bit_equal"] = equal
    return outcome


def _worker(rank: int, port: int, model_path: str, out: str) -> None:
    world = join(rank, port)
    torch.manual_seed(0)
    model = load_model(model_path, dtype="float32")
    layout = [Entry(n, tuple(p.shape), "bfloat16") for n, p in model.named_parameters()]
    sender = DeltaSender(layout, BUCKET) if rank == 0 else None
    targets = []
    if rank == 1:  # vLLM's side: its own bf16 tensors, different from the sender's
        targets = [
            (n, torch.randn(p.shape).to(torch.bfloat16)) for n, p in model.named_parameters()
        ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ids = torch.randint(5, 44, (4, 12), generator=torch.Generator().manual_seed(1))
    record = [_sync_and_compare(rank, model, sender, layout, targets)]
    for step in range(4):
        if rank == 0:
            optimizer.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
        if rank == 1 and step == 3:  # the receiver's copy drifts from the last send
            with torch.no_grad():
                targets[-1][1].view(-1)[0] += 1.0
        record.append(_sync_and_compare(rank, model, sender, layout, targets))
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    shutdown_distributed(world)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("delta") / "model")


def test_receiver_is_bit_identical_after_every_sync_and_later_syncs_send_changes_only(
    model_path: Path, tmp_path: Path
) -> None:
    mp.spawn(_worker, args=(free_port(), str(model_path), str(tmp_path)), nprocs=2)
    sent = json.loads((tmp_path / "rank0.json").read_text())
    got = json.loads((tmp_path / "rank1.json").read_text())
    assert [s["bit_equal"] for s in sent[:4]] == [True] * 4, sent
    assert sent[0]["dense"] == sent[0]["buckets"] > 3  # the first sync: every bucket whole
    assert sent[0]["changed"] == 1.0
    for later in sent[1:4]:  # an optimizer step changes some bf16 elements, not all
        assert 0 < later["changed"] < 1 and later["dense"] < later["buckets"]
        assert later["bytes"] < sent[0]["bytes"]
    assert all("mismatch" not in g for g in got[:4])
    assert "checksum" in got[4]["mismatch"] and "bucket" in got[4]["mismatch"]
    assert not sent[4]["bit_equal"]  # the drifted element stays wrong and is reported


def test_both_sides_cut_the_same_buckets() -> None:
    layout = [Entry("a", (10,), "bfloat16"), Entry("b", (3000,), "bfloat16"),
              Entry("c", (5,), "bfloat16"), Entry("d", (5,), "float32")]  # fmt: skip
    assert [[e.name for e in b] for b in plan(layout, 100)] == [["a"], ["b"], ["c"], ["d"]]
    assert [[e.name for e in b] for b in plan(layout, 10_000)] == [["a", "b", "c"], ["d"]]


class _GlooGroup:
    """vLLM's PyNccl communicator's ``broadcast`` over the test's gloo group."""

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        dist.broadcast(tensor, src=src)


class _Worker(SharedWeightsExtension):
    """The extension as vLLM mixes it in: ``model_runner.model`` and the transfer engine."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model_runner = type("Runner", (), {"model": model})()
        self.weight_transfer_engine = type("Engine", (), {"model_update_group": _GlooGroup()})()


def _extension_worker(rank: int, port: int, model_path: str, out: str) -> None:
    """Rank 0 sends two syncs (one optimizer step apart); rank 1 is vLLM's worker and takes
    them through ``grpo_receive_delta`` with the JSON the trainer posts."""
    world = join(rank, port)
    model = load_model(model_path, dtype="bfloat16" if rank == 1 else "float32")
    layout = [Entry(n, tuple(p.shape), "bfloat16") for n, p in model.named_parameters()]
    info = json.dumps(
        {
            "names": [e.name for e in layout],
            "shapes": [list(e.shape) for e in layout],
            "dtype_names": [e.dtype for e in layout],
            "bucket_bytes": BUCKET_BYTES,
        }
    )
    if rank == 1:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)  # vLLM holds other weights until the first sync
    sender, worker = DeltaSender(layout), _Worker(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)  # a few bf16 elements move
    ids = torch.randint(5, 44, (2, 9), generator=torch.Generator().manual_seed(0))
    written = []
    for _ in range(2):
        if rank == 0:
            named = ((n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters())
            sender.send(named, lambda t: dist.broadcast(t, src=0))
        else:
            written.append(worker.grpo_receive_delta(info))
        if rank == 0:
            optimizer.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
    final = {}
    for e in layout:  # rank 0's second send against what rank 1 holds now
        back = model.get_parameter(e.name).detach().to(torch.bfloat16).clone()
        dist.broadcast(back, src=1)
        if rank == 0:
            final[e.name] = bool(torch.equal(back.view(torch.int16),
                                             sender.last[e.name].view(torch.int16)))  # fmt: skip
    Path(out, f"ext{rank}.json").write_text(json.dumps({"written": written, "equal": final}))
    shutdown_distributed(world)


def test_worker_extension_applies_the_trainers_delta_bit_exact(
    model_path: Path, tmp_path: Path
) -> None:
    mp.spawn(_extension_worker, args=(free_port(), str(model_path), str(tmp_path)), nprocs=2)
    sent = json.loads((tmp_path / "ext0.json").read_text())
    got = json.loads((tmp_path / "ext1.json").read_text())
    assert sent["equal"] and all(sent["equal"].values())
    total = sum(p.numel() for p in load_model(model_path).parameters())
    assert got["written"][0] == total and 0 < got["written"][1] < total
