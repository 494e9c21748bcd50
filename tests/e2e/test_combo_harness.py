"""The walk harness itself, without a stack: walks drawn and replayed alike, the checks
catching what they name on run files written by hand, the shrinking keeping a failure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import combo_play
import pytest
from combo_checks import (
    lag0_off,
    lag0_transients,
    stalls_unnamed,
    steps_twice_or_skipped,
    unexplained_restarts,
)
from combo_play import Outcome, shrink
from combo_run import Done, RunFiles, Violation
from combo_walk import Action, Setup, Walk, draw

LAG0 = "alignment/diff_abs_mean_lag0"


def test_a_seed_draws_one_walk_and_its_text_replays_it() -> None:
    for seed in range(50):
        walk = draw(seed, 6)
        assert draw(seed, 6) == walk
        assert Walk.parse(str(walk)) == walk
    assert len({str(draw(seed, 6)) for seed in range(50)}) == 50


def test_a_walk_switches_to_another_mode_and_edits_lr_as_the_mode_takes_it() -> None:
    for seed in range(200):
        walk = draw(seed, 6)
        modes = walk.modes()
        for action, before in zip(walk.actions, modes, strict=False):
            if action.kind == "switch":
                assert action.target != before, walk
            if action.kind == "edit" and action.target in ("lr", "lora_lr"):
                lora = before in ("lora_only", "lora_restart")
                assert action.target == ("lora_lr" if lora else "lr"), walk


def test_a_hand_written_walk_is_checked() -> None:
    with pytest.raises(ValueError, match="unknown action"):
        Walk.parse("mode=none | jump:env")
    with pytest.raises(ValueError, match="not one of"):
        Walk.parse("mode=none | sigkill:model")
    with pytest.raises(ValueError, match="mode=fast"):
        Walk.parse("mode=fast | restart:trainer")


def test_dropping_a_switch_renames_the_lr_edits_after_it() -> None:
    walk = Walk.parse("mode=shared_vllm | switch:lora_only edit:lora_lr=0.002")
    assert str(walk.without(0, 1)) == "mode=shared_vllm ckpt=5 | edit:lr=0.002"


class Files:
    """A run directory written by hand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []

    def state(self, t: float, process: str, new: str, pid: int = 1, **extra: Any) -> None:
        self.events.append(
            {"type": "StateChanged", "t": t, "process": process, "new": new, "pid": pid, **extra}
        )

    def event(self, kind: str, t: float, **fields: Any) -> None:
        self.events.append({"type": kind, "t": t, **fields})

    def step(self, t: float, step: int, lag0: float | None = 1e-7) -> None:
        data: dict[str, float] = {"loss": 0.1}
        if lag0 is not None:
            data[LAG0] = lag0
        self.metrics.append({"process": "trainer", "t": t, "step": step, "data": data})

    def read(self) -> RunFiles:
        for name, records in (("events", self.events), ("metrics", self.metrics)):
            lines = "".join(json.dumps(r) + "\n" for r in records)
            (self.path / f"{name}.jsonl").write_text(lines)
        files = RunFiles(self.path)
        files.refresh()
        return files


def done(kind: str, target: str, t: float, before: int, after: int, **kw: Any) -> Done:
    d = Done(Action(kind, target, kw.pop("value", "")), kw.pop("mode", "shared_vllm"), t)
    d.ended, d.records_before, d.records_after = t + 1, before, after
    for key, value in kw.items():
        setattr(d, key, value)
    return d


def test_a_trainer_that_goes_back_without_a_kill_trained_steps_twice(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.state(0, "trainer", "starting")
    for step in (1, 2, 3, 4):
        files.step(step, step)
    files.state(10, "trainer", "starting", pid=2)
    files.event("Notice", 11, level="info", message="trainer: resuming", code="resumed",
                data={"step": 2, "checkpoint": "c/step_2"})  # fmt: skip
    files.step(12, 3)
    graceful = [done("restart", "trainer", 9, 4, 4)]
    found = steps_twice_or_skipped(files.read(), graceful)
    assert [v.invariant for v in found] == ["steps"]
    assert "steps 3..4 trained twice" in found[0].detail
    killed = [done("sigkill", "trainer", 9, 4, 4, saved=2)]
    assert steps_twice_or_skipped(files.read(), killed) == []
    saved_later = [done("sigkill", "trainer", 9, 4, 4, saved=3)]
    assert "step 3 was saved" in steps_twice_or_skipped(files.read(), saved_later)[0].detail


def test_a_restart_no_kill_explains_is_a_crash_loop(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.event("Restarting", 5, process="api", attempt=1, delay=0.5, reason="killed by SIGKILL")
    files.event("Restarting", 7, process="trainer", attempt=1, delay=1, reason="exited with 1")
    read = files.read()
    kill = done("sigkill", "api", 4, 0, 0)
    assert [v.detail for v in unexplained_restarts(read, [kill])] == [
        "trainer restarted on its own: 'exited with 1'"
    ]
    assert len(unexplained_restarts(read, [])) == 2


def test_lag0_must_be_back_within_its_steps_and_stay(tmp_path: Path) -> None:
    files = Files(tmp_path)
    start = done("start", "shared_vllm", 0, 0, 2)
    restart = done("restart", "inference", 2.5, 2, 2)
    for step, value in enumerate([1e-7, 1e-7, 0.3, None, 0.2, 1e-7, None, 0.05], 1):
        files.step(step, step, value)
    found = lag0_off(files.read(), [start, restart])
    assert [v.detail for v in found] == [
        "after restart:inference (shared_vllm): no step at float level within 6 steps: "
        "3:0.3 4:- 5:0.2 6:1e-07 7:- 8:0.05"
    ]
    files.step(9, 9, 1e-7)
    assert lag0_off(files.read(), [start, restart]) == []
    assert lag0_transients(files.read(), [start, restart]) == [
        "after restart:inference (shared_vllm): 3:0.3 5:0.2 8:0.05"
    ]
    files.step(10, 10, 0.01)
    found = lag0_off(files.read(), [start, restart])
    assert found[0].detail.startswith("after restart:inference (shared_vllm): off 6 steps and")
    never = done("switch", "lora_only", 2.5, 2, 2, mode="lora_only")
    files.metrics = files.metrics[:2]
    for step in range(3, 9):
        files.step(step, step, None if step % 2 else 0.4)
    found = lag0_off(files.read(), [start, never])
    assert found[0].detail.endswith("within 6 steps: 3:- 4:0.4 5:- 6:0.4 7:- 8:0.4"), found


def test_a_long_gap_needs_a_stall_report_and_a_stopped_env_its_name(tmp_path: Path) -> None:
    files = Files(tmp_path)
    files.step(1, 1)
    files.step(20, 2)
    read = files.read()
    assert "19.0 s without a step" in stalls_unnamed(read, [])[0].detail
    files.event("Stalled", 8, process="trainer", seconds=6, step=1, causes=["the queue is empty"])
    read = files.read()
    assert stalls_unnamed(read, []) == []
    stop = done("sigstop", "env", 2, 1, 1, value="8", ended=10.0)
    assert "do not name env" in stalls_unnamed(read, [stop])[0].detail
    files.events[-1]["causes"] = ["env is stopped (SIGSTOP) since 6 s"]
    assert stalls_unnamed(files.read(), [stop]) == []


def test_shrinking_keeps_a_shortest_walk_that_still_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake ``play``: the walk fails when it restarts inference after any switch."""

    def fake_play(walk: Walk, workdir: Path, say: object = print) -> Outcome:
        switched = False
        for index, action in enumerate(walk.actions):
            switched |= action.kind == "switch"
            if switched and action.target == "inference":
                return Outcome(walk, [Violation("lag0", "off")], index, index + 1)
        return Outcome(walk)

    monkeypatch.setattr(combo_play, "play", fake_play)
    walk = Walk.parse(
        "mode=none | edit:beta=0.0 switch:lora_only sigkill:api edit:lora_lr=0.001 "
        "sigstop:env:2 restart:inference sigkill:env"
    )
    found = fake_play(walk, tmp_path)
    best, spent = shrink(found, tmp_path, budget=30, say=lambda _: None)
    assert str(best.walk) == "mode=none ckpt=5 | switch:lora_only restart:inference"
    assert best.invariants == {"lag0"}
    assert spent <= 12
    assert Setup("none") == best.walk.setup


def test_a_walk_in_a_folder_that_holds_a_run_starts_nothing_and_says_so(tmp_path: Path) -> None:
    """A replay in the folder of an earlier one once waited 300 s on the old run's files and
    blamed the trainer ('no the trainer'): the harness refuses, a ``harness`` failure."""
    (tmp_path / "runs" / "quickstart-20261129-092820").mkdir(parents=True)
    outcome = combo_play.play(Walk.parse("mode=none | wait:steps:4"), tmp_path, lambda _: None)
    assert outcome.invariants == {"harness"}
    assert "holds a run already" in outcome.violations[0].detail
    assert not (tmp_path / "profile.toml").exists()


def test_beta_from_zero_is_refused_by_design_only_in_a_full_weight_mode() -> None:
    """Seed 31 (``mode=none | edit:beta=0.0 stopstart:env:8 edit:beta=0.02``) stopped on the
    run's refusal: it is the run's rule (no KL reference model), so the walk expects it."""
    from combo_run import refused_by_design

    assert refused_by_design("beta", 0.02, "none", 0.0) is not None
    assert refused_by_design("beta", 0.02, "colocate", 0.0) is not None
    assert refused_by_design("beta", 0.02, "lora_only", 0.0) is None
    assert refused_by_design("beta", 0.02, "none", 0.04) is None
    assert refused_by_design("beta", 0.0, "none", 0.0) is None
    assert refused_by_design("temperature", 1.0, "none", 0.0) is None
