"""The rollout and timeline records: format round trip, bounded segments, incremental and
partial reads, the background writer's drops and failures, filters, rank parts."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from grpo_trainer.records.background import BackgroundWriter
from grpo_trainer.records.query import parse_filter, select
from grpo_trainer.records.rollout_reader import RecordGone, RolloutIndex
from grpo_trainer.records.rollout_writer import RolloutWriter
from grpo_trainer.records.rollouts import INDEX_DTYPE, NO_LAG, GroupParts, decode, encode, k3
from grpo_trainer.records.segments import list_segments
from grpo_trainer.records.timeline import SpanRecorder, merge, sync_split
from grpo_trainer.records.timeline_reader import IDLE, Timeline


def parts(
    step: int,
    group: int = 0,
    *,
    kind: str = "trained",
    env: str = "toy",
    scores: tuple[float, ...] = (0.0, 1.0),
    lag: int | None = 1,
    prompt: int = 3,
    completion: int = 4,
    rank: int = 0,
    sequence_ids: list[int] | None = None,
    group_scores: list[float] | None = None,
    t: float | None = None,
) -> GroupParts:
    """A group of ``len(scores)`` sequences: ``prompt`` untrained tokens then ``completion``."""
    n = len(scores)
    length = prompt + completion
    rng = np.random.default_rng(step * 100 + group)
    trained = np.tile(np.r_[np.zeros(prompt, bool), np.ones(completion, bool)], n)
    inference = np.where(trained, -rng.random(n * length), np.nan).astype(np.float32)
    arrays = {
        "tokens": np.arange(n * length, dtype=np.int32) % 7,
        "trained": trained,
        "inference_logprobs": inference,
    }
    if kind == "trained":
        arrays["trainer_logprobs"] = (inference + 0.1).astype(np.float32)
        arrays["entropy"] = np.where(trained, 1.5, np.nan).astype(np.float32)
        arrays["ratio"] = np.where(trained, math.exp(0.1), np.nan).astype(np.float32)
    return GroupParts(
        kind=kind,
        step=step,
        group=group,
        env=env,
        env_id=3,
        version=None if lag is None else step - 1 - lag,
        lag=lag,
        t=time.time() if t is None else t,
        scores=list(scores),
        advantages=[float(s - np.mean(scores)) for s in scores],
        lengths=[length] * n,
        arrays=arrays,
        prompt_text="abc",
        texts=[f"completion {i}" for i in range(n)],
        pieces={i: chr(ord("a") + i) for i in range(7)},
        rank=rank,
        sequence_ids=sequence_ids,
        group_scores=group_scores,
    )


def write_all(run_dir: Path, stem: str, groups: list[GroupParts], max_mb: float = 8.0) -> None:
    background = BackgroundWriter(stem)
    writer = RolloutWriter(run_dir, stem, max_mb=max_mb, background=background)
    assert writer.add(lambda: groups)
    background.close()
    writer.close()


def test_a_record_round_trips_and_its_index_row_summarises_it(tmp_path: Path) -> None:
    group = parts(7, scores=(0.0, 0.5, 1.0), lag=2)
    data, row = encode(group, env_code=4)
    assert row.dtype == INDEX_DTYPE and row["length"][0] == len(data)
    assert (row["step"][0], row["lag"][0], row["env"][0], row["sequences"][0]) == (7, 2, 4, 3)
    assert row["reward_mean"][0] == pytest.approx(0.5) and row["reward_max"][0] == 1.0
    assert row["length_mean"][0] == 4
    assert row["mismatch_kl"][0] == pytest.approx(float(k3(np.array([0.1]))[0]), rel=1e-4)
    header, arrays = decode(data)
    assert header["scores"] == [0.0, 0.5, 1.0] and header["texts"][2] == "completion 2"
    for name, array in group.arrays.items():
        np.testing.assert_array_equal(arrays[name], array.astype(arrays[name].dtype))
    write_all(tmp_path, "trainer", [group])
    index = RolloutIndex(tmp_path)
    assert index.poll() == 1
    record = index.open(0)
    assert (record.step, record.kind, record.env, record.lag, record.version) == (
        7,
        "trained",
        "toy",
        2,
        4,
    )
    assert record.prompt_tokens.tolist() == [0, 1, 2]
    assert record.prompt_text == "abc" and record.piece(3) == "d" and record.piece(99) == "<99>"
    first = record.completions[0]
    assert first.start == 3 and first.length == 4
    assert first.mean("abs_delta") == pytest.approx(0.1, abs=1e-6)
    assert first.mean("entropy") == pytest.approx(1.5)
    assert math.isnan(first.delta()[0])  # a prompt position


def test_k3_is_the_kl_estimator_schulman_gives() -> None:
    delta = np.array([0.0, 0.1, -0.3])
    np.testing.assert_allclose(k3(delta), np.exp(delta) - 1 - delta)
    assert k3(delta)[0] == 0 and (k3(delta) >= 0).all()


def test_segments_keep_the_newest_and_a_purged_group_says_so(tmp_path: Path) -> None:
    background = BackgroundWriter("trainer")
    writer = RolloutWriter(tmp_path, "trainer", max_mb=0.004, background=background)  # 1 KB
    index = RolloutIndex(tmp_path)
    for step in range(1, 41):
        writer.add(lambda step=step: [parts(step)])
        if step == 5:
            assert background.flush()
            index.poll()
            oldest = 0
    background.close()
    writer.close()
    segments = list_segments(tmp_path / "rollouts", "data")["trainer"]
    assert len(segments) == 4 and segments[0] > 0  # oldest deleted, four kept
    size = sum(p.stat().st_size for p in (tmp_path / "rollouts").glob("trainer.*.data"))
    assert size <= 4 * (1024 + len(encode(parts(1), 0)[0]))  # a segment ends past its cap by
    # less than one record
    with pytest.raises(RecordGone):
        index.open(oldest)  # deleted since that poll
    index.poll()
    assert index.rows["step"].max() == 40
    assert index.rows["step"].min() > 1  # the old ones are forgotten
    assert index.open(int(np.argmax(index.rows["step"]))).step == 40


def test_a_half_written_index_row_waits_for_the_rest(tmp_path: Path) -> None:
    write_all(tmp_path, "trainer", [parts(1)])
    index_file = next((tmp_path / "rollouts").glob("*.index"))
    data_file = next((tmp_path / "rollouts").glob("*.data"))
    data, row = encode(parts(2), 0)
    row["offset"] = data_file.stat().st_size
    with data_file.open("ab") as handle:
        handle.write(data)
    raw = row.tobytes()
    with index_file.open("ab") as handle:
        handle.write(raw[:10])
    index = RolloutIndex(tmp_path)
    assert index.poll() == 1
    with index_file.open("ab") as handle:
        handle.write(raw[10:])
    assert index.poll() == 1
    assert index.open(1).step == 2


def test_rank_parts_open_as_one_group_and_list_once(tmp_path: Path) -> None:
    scores = [0.0, 1.0, 0.5, 0.25]
    write_all(
        tmp_path,
        "trainer",
        [parts(3, 0, scores=(0.0, 1.0), sequence_ids=[0, 1], group_scores=scores)],
    )
    write_all(
        tmp_path,
        "trainer.rank1",
        [parts(3, 0, scores=(0.5, 0.25), rank=1, sequence_ids=[2, 3], group_scores=scores)],
    )
    index = RolloutIndex(tmp_path)
    index.poll()
    assert len(index) == 2 and len(index.groups()) == 1
    record = index.open(1)
    assert [c.index for c in record.completions] == [0, 1, 2, 3]
    assert record.scores == scores
    assert index.rows["reward_mean"][0] == pytest.approx(np.mean(scores))


def test_filters_select_by_kind_env_step_lag_reward_newest_first(tmp_path: Path) -> None:
    groups = [
        parts(
            s,
            g,
            env="toy" if g % 2 else "gsm8k",
            scores=(0.0, s / 10),
            lag=s % 3,
            t=1000.0 + s * 10 + g,
        )
        for s in range(1, 6)
        for g in range(2)
    ]
    groups.append(parts(6, 0, kind="dropped", scores=(0.0, 0.0), lag=None, t=2000.0))
    write_all(tmp_path, "trainer", groups)
    index = RolloutIndex(tmp_path)
    index.poll()

    def steps(text: str) -> list[tuple[int, int]]:
        rows = select(index, parse_filter(text))
        return list(
            zip(index.rows["step"][rows].tolist(), index.rows["group"][rows].tolist(), strict=True)
        )

    assert steps("")[0] == (6, 0) and len(steps("")) == 11
    assert steps("kind=dropped") == [(6, 0)]
    assert steps("env=toy step=2..3") == [(3, 1), (2, 1)]
    assert steps("lag>=2 kind=trained") == [(5, 1), (5, 0), (2, 1), (2, 0)]
    assert steps("reward>0.1 reward<0.25") == [(4, 1), (4, 0), (3, 1), (3, 0)]
    assert steps("env=nope") == []
    assert parse_filter("step=4..").describe() == "step=4.."
    for bad, words in [
        ("foo=1", "FIELD one of"),
        ("lag>=x", "not a number"),
        ("kind=odd", "trained or dropped"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_filter(bad)
    assert NO_LAG not in index.rows["lag"][select(index, parse_filter("lag<=10"))]


def test_background_writer_drops_when_full_and_stops_on_a_failure() -> None:
    errors: list[str] = []
    gate = threading.Event()
    writer = BackgroundWriter("t", on_error=errors.append, queue_jobs=2)
    assert writer.submit(gate.wait)  # the thread blocks here
    time.sleep(0.05)
    assert writer.submit(lambda: None) and writer.submit(lambda: None)
    assert not writer.submit(lambda: None)
    assert writer.dropped == 1
    gate.set()
    assert writer.flush()

    def fail() -> None:
        raise OSError("No space left on device")

    ran: list[int] = []
    writer.submit(fail)
    writer.submit(lambda: ran.append(1))
    assert writer.flush()
    assert errors == ["recording t stopped: OSError: No space left on device"] and ran == []
    assert not writer.submit(lambda: None)
    writer.close(timeout=1)


def test_timeline_lines_merge_overlaps_and_break_a_step_down(tmp_path: Path) -> None:
    assert merge([("generate", 0, 2), ("generate", 1, 3), ("room", 2, 4), ("generate", 5, 6)]) == [
        ("generate", 0, 3),
        ("room", 2, 4),
        ("generate", 5, 6),
    ]
    background = BackgroundWriter("t")
    trainer = SpanRecorder(tmp_path, "trainer", "trainer", background)
    env = SpanRecorder(tmp_path, "env", "env", background)
    for step in (1, 2):
        base = 100.0 * step
        trainer.add("wait", base, base + 6)
        trainer.add("forward_backward", base + 6, base + 9)
        trainer.add("optimizer", base + 9, base + 10)
        trainer.flush(step)
        env.add("generate", base - 1, base + 4)
        env.add("generate", base + 2, base + 5)
        env.flush(step, merged=True)
    background.close()
    timeline = Timeline(tmp_path)
    assert timeline.poll() == 4
    assert list(timeline.lanes) == ["trainer", "env"]
    assert timeline.steps() == [1, 2] and timeline.step_window(2) == (200.0, 210.0)
    spent = timeline.breakdown(*timeline.step_window(2))
    assert spent["trainer"] == {"wait": 6.0, "forward_backward": 3.0, "optimizer": 1.0, IDLE: 0.0}
    assert spent["env"] == {"generate": 5.0, IDLE: 5.0}  # merged: 199-205, clipped to 200-205
    line = json.loads((tmp_path / "timeline" / "env.000000.jsonl").read_text().splitlines()[0])
    assert line["spans"] == [["generate", 99.0, 105.0]]
    partial = tmp_path / "timeline" / "trainer.000000.jsonl"
    with partial.open("a") as handle:
        handle.write('{"step": 3, "role": "trainer", "spans": [["wait", 300')
    assert timeline.poll() == 0
    with partial.open("a") as handle:
        handle.write(", 301]]}\n")
    assert timeline.poll() == 1 and timeline.steps() == [1, 2, 3]


def test_a_sync_split_names_pause_transfer_finish_resume_in_order() -> None:
    """vLLM's phases (``vllm_shared.py``), a save and a load (``none``), a wake and a push
    (``colocate``), and nothing named: the rest of the sync is its transfer."""
    vllm = {"pause": 0.1, "start": 0.05, "transfer": 1.0, "finish": 0.2, "resume": 0.1}
    assert sync_split(1.5, vllm) == pytest.approx(
        {"pause": 0.1, "transfer": 1.1, "finish": 0.2, "resume": 0.1}
    )
    assert list(sync_split(1.5, vllm)) == ["pause", "transfer", "finish", "resume"]
    assert sync_split(2.0, {"save": 0.5, "load": 1.5}) == {"transfer": 2.0}
    assert list(sync_split(1.0, {"wake": 0.4, "push": 0.5})) == ["wake", "transfer"]
    assert sync_split(0.25, {}) == {"transfer": 0.25}
    assert sync_split(0.0, {}) == {}


def test_a_breakdown_adds_up_to_its_window_when_phases_overlap(tmp_path: Path) -> None:
    """An environment generating while it waits for room (the two overlap) gave
    "generation 88% queue full 27% idle 0%": each instant now counts once, for the first
    phase in PHASES order that covers it."""
    background = BackgroundWriter("t")
    trainer = SpanRecorder(tmp_path, "trainer", "trainer", background)
    env = SpanRecorder(tmp_path, "env", "env", background)
    trainer.add("wait", 0.0, 10.0)
    trainer.flush(1)
    for phase, start, end in (("generate", 0, 8), ("room", 2, 5), ("room", 7, 9.5)):
        env.add(phase, start, end)
    env.flush(1, merged=True)
    background.close()
    timeline = Timeline(tmp_path)
    timeline.poll()
    spent = timeline.breakdown(0.0, 10.0)["env"]
    assert spent == pytest.approx({"generate": 8.0, "room": 1.5, IDLE: 0.5})
    assert sum(spent.values()) == pytest.approx(10.0)
