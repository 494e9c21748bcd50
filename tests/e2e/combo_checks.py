"""What must hold after any action of a walk, read from the run directory.

- ``events``: every line of ``events.jsonl`` parses;
- ``give-up``: no process failed for good, no need lost, the run still runs;
- ``crash-loop``: every restart the supervisor made on its own (a ``Restarting`` event)
  follows a SIGKILL of the walk to that process, one for one;
- ``steps``: every step trained once: each trainer continues from the step the last one
  reached, or, after a SIGKILL of the walk, from the checkpoint it had saved;
- ``lag0``: the lag-0 logprob difference (``alignment/diff_abs_mean_lag0``: sequences
  sampled at the weights being trained) is at float level within ``lag0_within`` steps of
  each action and stays there until the next;
- ``stall``: every gap between steps longer than ``stall_after`` has a ``Stalled`` event
  with a cause, and one the walk made by stopping an environment names it;
- at the end (``combo_play``): ``exit`` (the ordered shutdown ends every process cleanly),
  ``left-running`` (no process of the run lives on), ``queue`` (no group lost, no batch
  trained twice).
"""

from __future__ import annotations

import itertools
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from combo_run import (
    LAG0_ATOL,
    STALL_AFTER,
    Done,
    RunFiles,
    StepRecord,
    Violation,
    lag0_within,
)
from e2e_stack import quickstart_value

from grpo_trainer.train.resume import RESUMED

LAG0 = "alignment/diff_abs_mean_lag0"
STALL_SLACK = 2.5
"""The watchdog checks every second; a report may come that much after the threshold."""
GROUPS_PER_STEP = quickstart_value("trainer", "batch_size") // quickstart_value("env", "group_size")
NAMES_ENV = re.compile(r"\benv\b")
"""A cause that names the environment process (``env``), not "the environments"."""


def check(files: RunFiles, done: list[Done], alive: bool) -> list[Violation]:
    """Every invariant that can be checked while the run goes on."""
    files.refresh()
    found = events_parse(files)
    found += given_up(files, alive)
    found += unexplained_restarts(files, done)
    found += steps_twice_or_skipped(files, done)
    found += lag0_off(files, done)
    found += stalls_unnamed(files, done)
    return found


def events_parse(files: RunFiles) -> list[Violation]:
    return [
        Violation("events", f"events.jsonl line does not parse: {b}") for b in files.event_lines.bad
    ]


def given_up(files: RunFiles, alive: bool) -> list[Violation]:
    found = [
        Violation("give-up", f"{e['process']} failed for good: {e.get('reason')}")
        for e in files.of("StateChanged")
        if e["new"] == "failed"
    ]
    found += [
        Violation("give-up", f"{e['process']} lost its need {e['need']}: {e.get('failed')}")
        for e in files.of("NeedLost")
    ]
    if not alive:
        found.append(Violation("give-up", "the run ended before the walk did"))
    return found


def unexplained_restarts(files: RunFiles, done: list[Done]) -> list[Violation]:
    """Each ``Restarting`` matched, in time order, to an earlier SIGKILL of its process."""
    kills = {}
    for d in done:
        if d.action.kind == "sigkill":
            kills.setdefault(d.action.target, []).append(d.started)
    found = []
    for event in files.of("Restarting"):
        process, t = event["process"], float(event["t"])
        waiting = kills.get(process, [])
        if waiting and waiting[0] <= t and event["reason"] == "killed by SIGKILL":
            waiting.pop(0)
            continue
        found.append(
            Violation("crash-loop", f"{process} restarted on its own: {event['reason']!r}")
        )
    return found


@dataclass(frozen=True)
class TrainerLife:
    """One trainer process: when spawned, the step it resumed at (None: from the start)
    and its step records."""

    spawned: float
    resumed: int | None
    steps: list[int]


def trainer_lives(files: RunFiles) -> list[TrainerLife]:
    spawned = [
        float(e["t"])
        for e in files.of("StateChanged")
        if e["process"] == "trainer" and e["new"] == "starting"
    ]
    resumed = [
        (float(e["t"]), int(e["data"]["step"]))
        for e in files.of("Notice")
        if e.get("code") == RESUMED
    ]
    lives = []
    for start, end in itertools.pairwise([*spawned, float("inf")]):
        at = [step for t, step in resumed if start <= t < end]
        steps = [r.step for r in files.steps if start <= r.t < end]
        lives.append(TrainerLife(start, at[0] if at else None, steps))
    return lives


def steps_twice_or_skipped(files: RunFiles, done: list[Done]) -> list[Violation]:
    """Each trainer life goes on from where the last stopped: its steps follow one another
    from its resume point, which is the last step trained, or (after a SIGKILL of the walk
    since the last life's spawn) the checkpoint saved before the kill."""
    found: list[Violation] = []
    last = 0
    previous_spawn = 0.0
    for life in trainer_lives(files):
        if life.resumed is None and not life.steps:
            continue  # never got as far as its first step
        point = life.resumed or 0
        kills = [
            d
            for d in done
            if (d.action.kind, d.action.target) == ("sigkill", "trainer")
            and previous_spawn <= d.started < life.spawned
        ]
        if point > last:
            found.append(Violation("steps", f"a trainer resumed at step {point}, past step {last}"))
        elif point < last and not kills:
            found.append(
                Violation(
                    "steps",
                    f"steps {point + 1}..{last} trained twice: a trainer resumed at step "
                    f"{point} after step {last}, and the walk killed none",
                )
            )
        elif point < last and point < kills[-1].saved:
            found.append(
                Violation(
                    "steps",
                    f"a trainer resumed at step {point}, but step {kills[-1].saved} was "
                    "saved before it was killed",
                )
            )
        expected = list(range(point + 1, point + 1 + len(life.steps)))
        if life.steps != expected:
            found.append(Violation("steps", f"a trainer's steps {life.steps} are not {expected}"))
        last = life.steps[-1] if life.steps else point
        previous_spawn = life.spawned
    return found


def _windows(files: RunFiles, done: list[Done]) -> list[tuple[Done, list[StepRecord], int]]:
    """Per action: the steps from its start to the next action's, and how many of them may
    pass before lag-0 alignment must be at float level (those during the action and
    ``lag0_within`` more)."""
    records = files.steps
    windows = []
    for index, d in enumerate(done):
        end = done[index + 1].records_before if index + 1 < len(done) else len(records)
        limit = d.records_after - d.records_before + lag0_within(d.mode)
        windows.append((d, records[d.records_before : end], limit))
    return windows


def lag0_off(files: RunFiles, done: list[Done]) -> list[Violation]:
    """Per action: lag-0 alignment at float level within ``lag0_within`` steps of its end,
    and from there on until the next action: no step off after that many, and one at float
    level after the last off (checked once that many steps passed)."""
    found = []
    for d, window, limit in _windows(files, done):
        off = [i for i, r in enumerate(window) if _aligned(r) is False]
        late = [window[i] for i in off if i >= limit]
        after = off[-1] + 1 if off else 0
        back = any(_aligned(r) is True for r in window[after:])
        what = f"after {d.action} ({d.mode})"
        if late:
            found.append(
                Violation(
                    "lag0",
                    f"{what}: off {lag0_within(d.mode)} steps and more after it: "
                    f"{_lag0_values(late)} (the steps: {_lag0_values(window)})",
                )
            )
        elif not back and len(window) >= limit:
            found.append(
                Violation(
                    "lag0",
                    f"{what}: no step at float level within {lag0_within(d.mode)} steps: "
                    f"{_lag0_values(window)}",
                )
            )
    return found


def lag0_transients(files: RunFiles, done: list[Done]) -> list[str]:
    """Steps off before alignment came back within its steps: allowed, and told (a group
    sampled by other weights than its version's, for a step or two)."""
    told = []
    for d, window, limit in _windows(files, done):
        off = [r for r in window[:limit] if _aligned(r) is False]
        if off:
            told.append(f"after {d.action} ({d.mode}): {_lag0_values(off)}")
    return told


def lag0_settled(files: RunFiles, d: Done) -> bool:
    """True once a step after ``d`` has lag-0 alignment at float level, and no step since
    its start was off after it."""
    window = files.steps[d.records_before :]
    off = [i for i, r in enumerate(window) if _aligned(r) is False]
    after = max(off[-1] + 1 if off else 0, d.records_after - d.records_before)
    return any(_aligned(r) is True for r in window[after:])


def _aligned(record: StepRecord) -> bool | None:
    value = record.data.get(LAG0)
    return None if value is None else abs(value) < LAG0_ATOL


def _lag0_values(records: list[StepRecord]) -> str:
    shown = [f"{r.step}:{r.data[LAG0]:.2g}" if LAG0 in r.data else f"{r.step}:-" for r in records]
    return " ".join(shown) or "(no step)"


def stalls_unnamed(files: RunFiles, done: list[Done]) -> list[Violation]:
    """Each gap between steps over the threshold has a ``Stalled`` event with causes in it;
    a stall the walk made by stopping an environment (SIGSTOP, or a stop) names it."""
    stalls = [(float(e["t"]), list(e["causes"])) for e in files.of("Stalled")]
    times = sorted(r.t for r in files.steps)
    found = []
    for before, after in itertools.pairwise(times):
        if after - before <= STALL_AFTER + STALL_SLACK:
            continue
        told = [causes for t, causes in stalls if before + STALL_AFTER - 0.5 <= t <= after]
        if not told or not all(told):
            found.append(
                Violation("stall", f"{after - before:.1f} s without a step, reported: {told}")
            )
    for d in done:
        if d.action.kind not in ("sigstop", "stopstart") or not d.ended:
            continue
        if d.action.seconds < STALL_AFTER + STALL_SLACK:
            continue
        told = [
            c for t, causes in stalls if d.started <= t <= d.ended + STALL_SLACK for c in causes
        ]
        if told and not any(NAMES_ENV.search(c) for c in told):
            found.append(
                Violation("stall", f"{d.action}: the stall's causes do not name env: {told}")
            )
    return found


def queue_lost_or_twice(run_dir: Path, files: RunFiles, done: list[Done]) -> list[Violation]:
    """After the run: every group the API acknowledged was trained once or is still
    queued; each step record consumed one batch (a trainer killed may have acknowledged
    one it never reported)."""
    with sqlite3.connect(f"file:{run_dir / 'rollouts.db'}?mode=ro", uri=True) as db:
        counters = dict(db.execute("SELECT name, SUM(value) FROM counters GROUP BY name"))
        queued = int(db.execute("SELECT COUNT(*) FROM groups").fetchone()[0])
    received, served = int(counters.get("received", 0)), int(counters.get("served", 0))
    found = []
    if received != served + queued:
        found.append(
            Violation(
                "queue", f"groups lost: received {received}, served {served}, queued {queued}"
            )
        )
    acked, part = divmod(served, GROUPS_PER_STEP)
    reported = len(files.steps)
    kills = sum(1 for d in done if (d.action.kind, d.action.target) == ("sigkill", "trainer"))
    if part or not reported <= acked <= reported + kills:
        found.append(
            Violation(
                "queue",
                f"{served} groups served ({GROUPS_PER_STEP} a step) for {reported} steps "
                f"and {kills} trainer kills: a batch trained twice, in part, or never acked",
            )
        )
    return found


def exit_unclean(files: RunFiles, code: int, expected: int) -> list[Violation]:
    """The ordered shutdown's exit code, and every process's last state: stopped (the
    one-shot model completed), exit 0; inference may be SIGKILLed, its stop grace being 3 s
    by design (``docs/inference.md``: its HTTP server waits on in-flight requests)."""
    found = []
    if code != expected:
        found.append(Violation("exit", f"grpo-tui run exited {code} after SIGTERM, not {expected}"))
    last = {}
    for event in files.of("StateChanged"):
        last[event["process"]] = event
    for process, event in last.items():
        exit_code = event.get("exit_code")
        killed_ok = process == "inference" and exit_code == -9
        if event["new"] not in ("stopped", "completed") or not (
            exit_code in (0, None) or killed_ok
        ):
            found.append(
                Violation(
                    "exit",
                    f"{process} ended {event['new']} (exit {exit_code}): {event.get('reason')}",
                )
            )
    return found
