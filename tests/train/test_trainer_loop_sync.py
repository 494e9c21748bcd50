"""The loop drives a weight-sync strategy as the interface says, bounds staleness, and
stops gracefully on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from torch import nn
from train_helpers import (
    REPO,
    make_groups,
    tiny_model,
    trainer_command,
    trainer_env,
    write_groups,
)

from grpo_trainer.models import load_model, load_tokenizer
from grpo_trainer.records.timeline_reader import PHASE_NAMES
from grpo_trainer.sync.base import SyncContext, SyncResult, WeightSync
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.loop import SyncLagExceeded, Trainer
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.resume import resolve_resume
from grpo_trainer.train.sources import FileSource


class RecordingSync(WeightSync):
    """Records every call; fails the syncs of the steps in ``fail_steps``."""

    mode = "none"

    def __init__(self, fail_steps: set[int] = frozenset()) -> None:
        super().__init__(SyncContext("http://127.0.0.1:1", "policy", Path("."), "builtin"))
        self.calls: list[str] = []
        self.fail_steps = fail_steps

    def attach(self, model: nn.Module) -> nn.Module:
        self.calls.append("attach")
        return model

    def before_optimizer_step(self) -> None:
        self.calls.append("before")

    def after_optimizer_step(self) -> None:
        self.calls.append("after")

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        self.calls.append(f"sync{step}")
        if step in self.fail_steps:
            raise ConnectionError("inference server unreachable")
        return SyncResult(sync_time=0.01, policy_version=step)

    def close(self) -> None:
        self.calls.append("close")


class ListReporter(Reporter):
    def __init__(self) -> None:
        super().__init__(None, None)
        self.records: list[tuple[int, dict]] = []
        self.events: list[tuple[str, str]] = []

    def metrics(self, step: int, data: dict[str, float]) -> None:
        self.records.append((step, data))

    def event(self, level: str, message: str) -> None:
        self.events.append((level, message))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("loop")
    model = tiny_model(root / "model")
    data = write_groups(root / "groups.jsonl", make_groups(model, count=12, group_size=2, seed=2))
    return model, data


def make_trainer(setup, tmp_path: Path, strategy: WeightSync, **overrides) -> Trainer:
    model, data = setup
    config = TrainerConfig(
        model_name=str(model),
        batch_size=2,
        seq_len=64,
        save_path=str(tmp_path / "ckpt"),
        batches_file=str(data),
        checkpoint_interval=0,
        sync_retries=0,
        **overrides,
    )
    return Trainer(
        config,
        load_model(model),
        load_tokenizer(model),
        base=str(model),
        source=FileSource(data, config.step_batch_size, wait=1),
        reporter=ListReporter(),
        strategy=strategy,
    )


def test_strategy_calls_follow_the_interface(setup, tmp_path: Path) -> None:
    strategy = RecordingSync()
    trainer = make_trainer(setup, tmp_path, strategy, training_steps=4, sync_every=2)
    assert trainer.run() == 4
    step = ["before", "after"]
    assert strategy.calls == ["attach", *step, *step, "sync2", *step, *step, "sync4", "close"]
    records = trainer.reporter.records
    assert [r[1]["policy_version"] for r in records] == [0, 2, 2, 4]
    assert [("sync_time" in r[1]) for r in records] == [False, True, False, True]


def test_failing_sync_is_reported_and_bounded_by_max_sync_lag(setup, tmp_path: Path) -> None:
    strategy = RecordingSync(fail_steps={2, 3, 4, 5})
    trainer = make_trainer(
        setup, tmp_path, strategy, training_steps=6, sync_every=1, max_sync_lag=2
    )
    with pytest.raises(SyncLagExceeded, match="3 steps on stale weights"):
        trainer.run()
    assert trainer.step == 4
    warnings = [m for level, m in trainer.reporter.events if level == "warning"]
    assert len(warnings) == 3 and "inference server unreachable" in warnings[0]
    results = [
        (step, data.get("sync_time") is not None, data.get("sync/failed_attempts"))
        for step, data in trainer.reporter.records
    ]  # the structured result the dashboard's sync alert reads, not a warning's words
    assert results == [(1, True, None), (2, False, 1.0), (3, False, 1.0)]
    assert resolve_resume(tmp_path / "ckpt", "none").step == 4  # saved on the way out


def test_sigterm_finishes_the_step_checkpoints_and_exits_0(setup, tmp_path: Path) -> None:
    model, data = setup
    partial = write_groups(
        tmp_path / "partial.jsonl", [json.loads(line) for line in data.read_text().splitlines()[:2]]
    )
    metrics = tmp_path / "metrics.jsonl"
    command = trainer_command(
        model,
        tmp_path / "ckpt",
        partial,
        "--batch-size",
        "2",
        "--training-steps",
        "6",
        "--checkpoint-interval",
        "0",
        "--metrics-file",
        str(metrics),
    )
    proc = subprocess.Popen(
        command,
        env=trainer_env(),
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) == 2):
            assert proc.poll() is None and time.monotonic() < deadline, "no step 2"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)  # while it waits for step 3's data
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, out
    assert "trainer stopped at step 2 of 6" in out
    assert resolve_resume(tmp_path / "ckpt", "none").step == 2


class PhasedSync(RecordingSync):
    """A sync that reports vLLM's phases (``vllm_shared.py``): pause, start, transfer,
    finish, resume."""

    def sync(self, model: nn.Module, step: int) -> SyncResult:
        phases = {"pause": 0.01, "start": 0.02, "transfer": 0.2, "finish": 0.03, "resume": 0.04}
        return SyncResult(sync_time=0.35, policy_version=step, phases=phases)


def test_a_sync_is_split_into_its_phases_in_metrics_and_timeline(setup, tmp_path: Path) -> None:
    """``sync/split/<phase>_s``: pause, transfer (vLLM's start + transfer + the unnamed
    rest), finish, resume; the timeline lays them end to end in that order."""
    from grpo_trainer.records.timeline_reader import Timeline
    from grpo_trainer.train.recording import StepRecorder

    model, _ = setup
    run = tmp_path / "run"
    recorder = StepRecorder(run, "trainer", load_tokenizer(model).decode, max_mb=16, every=0)
    trainer = make_trainer(setup, tmp_path, PhasedSync(), training_steps=2, sync_every=1)
    trainer.recorder = recorder
    trainer.run()
    recorder.close()
    data = trainer.reporter.records[-1][1]
    split = {k: v for k, v in data.items() if k.startswith("sync/split/")}
    assert split == pytest.approx(
        {
            "sync/split/pause_s": 0.01,
            "sync/split/transfer_s": 0.27,
            "sync/split/finish_s": 0.03,
            "sync/split/resume_s": 0.04,
        }
    )
    assert list(split) == [f"sync/split/{p}_s" for p in ("pause", "transfer", "finish", "resume")]
    timeline = Timeline(run)
    timeline.poll()
    phase, start, end, step = timeline.lanes["trainer"].arrays()
    last = step == 2
    names = [PHASE_NAMES[p] for p in phase[last].tolist()]
    assert names[-4:] == ["pause", "transfer", "finish", "resume"]
    ends, starts = end[last][-4:], start[last][-4:]
    assert ends - starts == pytest.approx([0.01, 0.27, 0.03, 0.04])
    assert starts[1:] == pytest.approx(ends[:-1])  # end to end
