"""The multi-rank trainer on CPU (gloo): FSDP2 shards, batch split, stop, DCP checkpoints.

One real ``torchrun --standalone --nproc-per-node 2`` run of the trainer against the same
groups as a single-process run in this test's process (see the first test), and the
loss normalisation across ranks on its own.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from test_trainer_control_socket import SocketServer
from train_helpers import REPO, make_groups, tiny_model, trainer_env, write_groups

from grpo_trainer.models import load_model
from grpo_trainer.ranks.group import Dist, rank_slice
from grpo_trainer.records.rollout_reader import RolloutIndex
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.data import build_step_batch, parse_groups
from grpo_trainer.train.logprobs import chunked_token_logprobs
from grpo_trainer.train.loss import LossSettings, policy_loss
from grpo_trainer.train.session import run_session
from grpo_trainer.weight_dirs.layout import SHARDED_DIR

STEP_SEQUENCES = 8  # batch size 4 x 2 accumulation steps: one micro-batch per rank on 2 ranks


def _flags(model: Path, batches: Path, save: Path, metrics: Path, steps: int) -> list[str]:
    return [
        "--model-name", str(model),
        "--batches-file", str(batches),
        "--save-path", str(save),
        "--metrics-file", str(metrics),
        "--training-steps", str(steps),
        "--sync-every", "0",
        "--lr", "1e-3",
        "--loss-type", "dapo",
        "--batch-size", "4",
        "--gradient-accumulation-steps", "2",
        "--seq-len", "64",
        "--checkpoint-interval", "1",
        "--cpu-threads", "1",
    ]  # fmt: skip


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return math.isclose(a, b, rel_tol=rel)


def test_two_ranks_match_one_stop_together_and_resume_on_one(tmp_path: Path) -> None:
    """One real 2-rank run: steps 1-2 equal the single-process run's, only rank 0 reports,
    a SIGTERM to rank 1 alone stops both ranks after the same step with one checkpoint
    (the stop flag is reduced over ranks), and that DCP checkpoint resumes on one process
    exactly where the single-process run went."""
    model = tiny_model(tmp_path / "model")
    groups = make_groups(model, count=6, group_size=4, seed=1)
    batches = write_groups(tmp_path / "batches.jsonl", groups)
    growing = write_groups(tmp_path / "growing.jsonl", groups[:2])  # step 1 only, for now
    two = tmp_path / "two.jsonl"
    server = SocketServer(tmp_path / "control.sock")
    group: subprocess.Popen | None = None
    try:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2", "-m", "grpo_trainer.train",
            *_flags(model, growing, tmp_path / "two", two, steps=3),
            "--checkpoint-interval", "0",
        ]  # fmt: skip
        env = trainer_env(GRPO_TUI_SOCKET=str(server.path), GRPO_TUI_PROCESS="trainer")
        group = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 180
        while not (two.exists() and two.read_text().strip()):
            assert group.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        ranks = {
            int(child.environ()["RANK"]): child
            for child in psutil.Process(group.pid).children()
            if "RANK" in child.environ()
        }
        ranks[1].send_signal(signal.SIGTERM)
        write_groups(growing, groups[2:], mode="a")  # rank 0 can now lease step 2
        # the single-process run of the same steps, meanwhile, in this process
        one = tmp_path / "one.jsonl"
        flags = _flags(model, batches, tmp_path / "one", one, steps=3)
        assert run_session(TrainerConfig.from_argv(flags)) == 0
        output, _ = group.communicate(timeout=240)
        assert group.returncode == 0, output[-3000:]
        socket_steps = server.steps()
        connections = len(server.conns)
    finally:
        server.close()
        if group is not None and group.poll() is None:
            group.kill()
            group.wait()

    straight = {r["step"]: r["data"] for r in _records(one)}
    sharded = {r["step"]: r["data"] for r in _records(two)}
    assert sorted(sharded) == [1, 2]  # rank 0 alone writes metrics.jsonl; stopped after 2
    assert connections == 1 and socket_steps == [1, 2]  # only rank 0 connects
    for step in (1, 2):
        for key in ("loss", "grad_norm", "entropy", "mean_ratio"):
            assert _close(sharded[step][key], straight[step][key]), (step, key)
        assert {"gpu_memory_gb/rank0", "gpu_memory_gb/rank1"} <= set(sharded[step])
    # tokens/s counts the tokens of both ranks: the whole step's tokens
    whole = sum(len(seq) for g in groups[:2] for seq in g["tokens"])
    assert round(sharded[1]["tokens_per_s"] * sharded[1]["step_time"]) == whole

    # each rank recorded the groups it trained: every group of the two-rank run once, whole
    index = RolloutIndex(tmp_path)
    index.poll()
    session = index.rows["session"][index.writer == index.writers.index("trainer.rank1")][0]
    mine = [row for row in index.groups().tolist() if index.rows["session"][row] == session]
    assert sorted((int(index.rows["step"][r]), int(index.rows["rank"][r])) for r in mine) == [
        (1, 0), (1, 1), (2, 0), (2, 1)
    ]  # fmt: skip
    for row in mine:
        record = index.open(row)
        source = groups[(record.step - 1) * 2 + record.group]
        assert [c.tokens.tolist() for c in record.completions] == source["tokens"]

    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["step_2"]  # at the stop
    step_2 = tmp_path / "two" / "step_2"
    assert (step_2 / SHARDED_DIR).is_dir() and (step_2 / "model.safetensors").is_file()

    resumed = tmp_path / "resumed.jsonl"
    flags = _flags(model, batches, tmp_path / "two", resumed, steps=3)
    assert run_session(TrainerConfig.from_argv([*flags, "--resume", "auto"])) == 0
    (record,) = _records(resumed)
    assert record["step"] == 3
    for key in ("loss", "grad_norm", "entropy"):
        assert _close(record["data"][key], straight[3][key]), key


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_rank_shares_sum_to_the_whole_step(tmp_path: Path, loss_type: str) -> None:
    """Each rank's loss over its sequences, with the step's denominators, sums to the loss
    of the whole step, and so do the gradients (what FSDP2's reduction adds up)."""
    path = tiny_model(tmp_path / "model")
    groups = parse_groups(make_groups(path, count=2, group_size=4, seed=3))
    settings = LossSettings(loss_type=loss_type)
    model = load_model(path, dtype="float32").double()

    def loss_and_grads(share: slice) -> tuple[float, list[torch.Tensor]]:
        batch = build_step_batch(groups, micro_batch_size=2, seq_len=64, pad_id=0, share=share)
        model.zero_grad()
        total = 0.0
        for micro in batch.micro_batches:
            out = chunked_token_logprobs(
                model, micro.input_ids, micro.attention_mask, micro.temperatures.double()
            )
            loss = policy_loss(
                out.logprobs,
                micro.inference_logprobs.double() - 0.05,  # off-policy: ratio != 1
                micro.advantages.double(),
                micro.loss_mask.double(),
                settings,
                step_sequences=batch.sequences,
                step_tokens=batch.tokens,
                max_len=64,
            ).loss
            loss.backward()
            total += float(loss.detach())
        return total, [p.grad.clone() for p in model.parameters()]

    whole_loss, whole_grads = loss_and_grads(slice(None))
    ranks = [Dist(rank=r, world_size=2) for r in (0, 1)]
    shares = [loss_and_grads(rank_slice(STEP_SEQUENCES, rank)) for rank in ranks]
    assert shares[0][0] != 0 and shares[1][0] != 0
    assert math.isclose(shares[0][0] + shares[1][0], whole_loss, rel_tol=1e-12)
    for whole, a, b in zip(whole_grads, shares[0][1], shares[1][1], strict=True):
        torch.testing.assert_close(a + b, whole, rtol=1e-10, atol=1e-14)


def test_uneven_split_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="multiple of the trainer's GPU count"):
        rank_slice(6, Dist(rank=0, world_size=4))
