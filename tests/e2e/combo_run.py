"""One walk on one stack: ``grpo-tui run`` on a quickstart copy, driven as a person does.

The controls go through the supervisor's control socket (``docs/control-socket.md``,
found as ``grpo-tui attach`` finds it), the requests the dashboard's keys send from there:
``switch_mode``, ``restart``, ``stop``, ``start``, ``edit``. The faults come from outside,
as from a shell: SIGKILL of a process's leader, SIGSTOP and SIGCONT of an environment.
After each action the run is given a few steps (waited for on the trainer's step records,
bounded, never slept for), and ``combo_checks`` reads the run directory for what must hold
after any action. The walk ends with an ordered shutdown (SIGTERM to ``grpo-tui run``, as
Ctrl-C would).
"""

from __future__ import annotations

import json
import os
import signal
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from combo_walk import LORA_MODES, Action, Setup
from e2e_stack import QUICKSTART, HeadlessCli, free_port, quickstart_value, run_id_of

from grpo_trainer.control import ControlError, SupervisorLink
from grpo_trainer.train.resume import resolve_resume
from grpo_tui.attach import control_socket

STALL_AFTER = 5.0
"""The stall watchdog's threshold in a walk (30 s by default): an environment stopped for
8 s is a stall the watchdog must name."""
LAG0_ATOL = 1e-4
"""float32 on both sides: a weight-sync error shows as ~1e-2 and more, rounding ~1e-7."""
LAG0_WITHIN = {"lora_restart": 10}
"""Trainer steps after an action within which lag-0 alignment is back at float level: 6,
and 10 in ``lora_restart`` (it syncs, by restarting inference, every 4 steps)."""
LAG0_WITHIN_DEFAULT = 6
MIN_STEPS = {"lora_restart": 6}
"""Trainer steps a walk waits for after each action, at least: one sync and the steps
trained on what it served (3; 6 in ``lora_restart``, which syncs every 4 steps)."""
MIN_STEPS_DEFAULT = 3
SETTLE_S = 300.0
"""Longest wait for those steps (a loaded 2-core box: a lora_restart sync restart took 50 s)."""
ACTION_S = 300.0
"""Longest wait for a control's reply (a switch by restarts waits for both processes)."""
UP_S = 120.0
"""Longest wait for a process to be up before a fault can hit it."""
SHUTDOWN_S = 120.0
TRAINING_STEPS = 100_000
"""The walk ends the run; the run never ends by itself."""
SHUTDOWN_EXIT = 128 + signal.SIGTERM
POLL = 0.1
POLICIES = {
    "api": ("always", 0.5),
    "inference": ("always", 1.0),
    "trainer": ("on_failure", 1.0),
    "env": ("on_failure", 1.0),
}
"""The roles' own restart policies (``grpo_tui/plan/specs.py``) and their 5 restarts, with
the backoff at most 2 s and its count reset by 5 s up: a walk's kills come faster than the
crash loops those guard against; a real crash loop still gives up (and any restart that no
kill of the walk explains is reported by itself)."""


@dataclass(frozen=True)
class Violation:
    """An invariant broken, and how."""

    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


@dataclass
class Done:
    """An action as it happened."""

    action: Action
    mode: str
    """The mode in force after it."""
    started: float
    ended: float = 0.0
    records_before: int = 0
    """Trainer step records when it started."""
    records_after: int = 0
    """... and when it was done."""
    pid: int | None = None
    """The process a fault hit."""
    saved: int = 0
    """At a trainer kill: the step of the checkpoint it resumes from (0: none)."""


@dataclass(frozen=True)
class StepRecord:
    t: float
    step: int
    data: dict[str, Any]


class JsonLines:
    """A JSON-lines file read as it grows: complete lines only; undecodable ones kept."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.records: list[dict[str, Any]] = []
        self.bad: list[str] = []

    def refresh(self) -> list[dict[str, Any]]:
        """The records appended since the last call."""
        try:
            with self.path.open("rb") as stream:
                stream.seek(self.offset)
                chunk = stream.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        fresh = []
        for line in chunk[:end].splitlines():
            if not line.strip():
                continue
            try:
                fresh.append(json.loads(line))
            except ValueError:
                self.bad.append(line.decode(errors="replace")[:200])
        self.records += fresh
        return fresh


class RunFiles:
    """``events.jsonl`` and the trainer's step records of ``metrics.jsonl``, as they grow."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.event_lines = JsonLines(run_dir / "events.jsonl")
        self.metric_lines = JsonLines(run_dir / "metrics.jsonl")
        self.steps: list[StepRecord] = []

    def refresh(self) -> None:
        self.event_lines.refresh()
        for r in self.metric_lines.refresh():
            data = r.get("data") or {}
            if r.get("process") == "trainer" and r.get("step") is not None and "loss" in data:
                self.steps.append(StepRecord(float(r["t"]), int(r["step"]), data))

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.event_lines.records

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    def up(self, process: str) -> int | None:
        """The pid of ``process`` when its last state change made it ready (or running)."""
        last = None
        for event in self.of("StateChanged"):
            if event["process"] == process:
                last = event
        if last is None or last["new"] not in ("ready", "running"):
            return None
        return last.get("pid")


def walk_profile(path: Path, setup: Setup, output: Path) -> Path:
    """The quickstart with free ports, ``setup``, the walk's stall threshold and policies.

    ``max_batches_offpolicy = 0`` (synchronous: each batch sampled after the previous step
    was acknowledged): with 1, the quickstart's, a step in ``none`` or ``lora_only`` on
    this box never had a group sampled at the weights being trained (the queue always held
    the next batch), so lag-0 alignment, the proof that inference serves what is trained,
    could not be checked there.
    """
    profile = tomllib.loads(QUICKSTART.read_text())
    profile["run"].update(mode=setup.mode, output_dir=str(output), stall_after=STALL_AFTER)
    profile["api"].update(port=free_port(), max_batches_offpolicy=0)
    profile["inference"]["port"] = free_port()
    profile["trainer"].update(
        training_steps=TRAINING_STEPS, checkpoint_interval=setup.checkpoint_interval
    )
    profile["process"] = {
        name: {
            "restart": {
                "policy": policy,
                "backoff_base": base,
                "backoff_cap": 2.0,
                "reset_after": 5.0,
                "max_restarts": 5,
            }
        }
        for name, (policy, base) in POLICIES.items()
    }
    path.write_text(tomli_w.dumps(profile))
    return path


class Stopped(Exception):
    """The walk cannot go on: ``violation`` says why."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(str(violation))
        self.violation = violation


@dataclass
class ComboRun:
    """One stack driven by one walk (see the module docstring)."""

    setup: Setup
    workdir: Path
    say: Callable[[str], None] = print
    done: list[Done] = field(default_factory=list)
    run: HeadlessCli | None = None
    files: RunFiles | None = None
    link: SupervisorLink | None = None
    run_id: str = ""
    mode: str = ""
    beta: float = field(default_factory=lambda: float(quickstart_value("trainer", "beta")))
    """The KL coefficient in force (the quickstart's, then each edit applied)."""

    # ------------------------------------------------------------ life of the run

    def start(self) -> None:
        """Start ``grpo-tui run`` and wait for its first step."""
        self.mode = self.setup.mode
        self.workdir.mkdir(parents=True, exist_ok=True)
        output = self.workdir / "runs"
        if output.is_dir() and any(output.iterdir()):
            raise ValueError(f"{output} holds a run already: a walk needs a fresh folder")
        profile = walk_profile(self.workdir / "profile.toml", self.setup, output)
        self.run = HeadlessCli(profile, self.setup.mode, self.workdir / "console.log")
        run_dir = self._until(lambda: _only_dir(output), 60, "the run directory")
        self.files = RunFiles(run_dir)
        trainer = self._until(lambda: self.files_().up("trainer"), SETTLE_S, "the trainer")
        self.run_id = run_id_of(trainer)
        self._until(lambda: control_socket(run_dir).exists(), 30, "the control socket")
        self.link = SupervisorLink(str(control_socket(run_dir)), process="combos")
        start = Done(Action("start", self.setup.mode), self.mode, time.time())
        self.done.append(start)
        self._until(lambda: self.files_().steps, SETTLE_S, "the first step")
        start.ended = time.time()
        start.records_after = len(self.files_().steps)

    def finish(self) -> int:
        """Ordered shutdown, as Ctrl-C would: SIGTERM to ``grpo-tui run``; its exit code."""
        run = self.require_run()
        if run.alive:
            os.kill(run.popen.pid, signal.SIGTERM)
        try:
            code = run.wait(timeout=SHUTDOWN_S)
        except Exception as error:
            raise Stopped(Violation("exit", f"no exit {SHUTDOWN_S:.0f} s after SIGTERM")) from error
        self.files_().refresh()
        return code

    def close(self) -> None:
        """Whatever happened: the link closed, the run stopped (ours only)."""
        if self.link is not None:
            self.link.close()
        if self.run is not None:
            self.run.stop()

    # ----------------------------------------------------------------- actions

    def act(self, action: Action) -> None:
        """Take ``action`` and wait for its answer (a control's reply, a fault's end)."""
        files = self.files_()
        files.refresh()
        if action.kind == "switch":
            self.mode = action.target
        done = Done(action, self.mode, time.time(), records_before=len(files.steps))
        self.done.append(done)
        self.say(f"  {action}")
        if action.kind == "switch":
            self._ask("switch_mode", args={"mode": action.target})
        elif action.kind == "restart":
            self._ask("restart", action.target)
        elif action.kind == "edit":
            key = action.target
            if key == "lr" and self.mode in LORA_MODES:
                key = "lora_lr"  # what the mode trains with (the run refuses lr there)
            self._edit(action, key, float(action.value))
        elif action.kind == "stopstart":
            self._ask("stop", action.target)
            time.sleep(action.seconds)  # the stop itself, as long as the walk says
            self._ask("start", action.target)
        elif action.kind in ("sigkill", "sigstop"):
            self._fault(done)
        done.ended = time.time()
        files.refresh()
        done.records_after = len(files.steps)

    def _edit(self, action: Action, key: str, value: float) -> None:
        """An edit answered as the run must: applied, or refused with its reason where the
        run refuses it by design (``refused_by_design``), and then nothing changed."""
        assert self.link is not None
        expected = refused_by_design(key, value, self.mode, self.beta)
        try:
            answer = self.link.request("edit", None, {key: value}, timeout=ACTION_S)
        except ControlError as error:
            if expected is None or key not in error.reason:
                raise Stopped(Violation("control", f"{action}: {error.reason}")) from error
            self.say(f"  refused, as it must be ({expected}): {error.reason}")
            return
        if expected is not None:
            raise Stopped(Violation("control", f"{action}: applied, but {expected}: {answer}"))
        if key not in answer.get("values", {}):
            raise Stopped(Violation("control", f"{action}: edit answered {answer}"))
        if key == "beta":
            self.beta = value

    def _fault(self, done: Done) -> None:
        action = done.action
        pid = self._until(lambda: self._up_unhit(action.target), UP_S, f"{action.target} up")
        done.pid = pid
        if action.kind == "sigkill":
            if action.target == "trainer":
                point = resolve_resume(self.files_().run_dir / "checkpoints", self.mode)
                done.saved = 0 if point is None else point.step
            os.kill(pid, signal.SIGKILL)
            return
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(action.seconds)  # the fault itself: a process stopped this long
        finally:
            os.kill(pid, signal.SIGCONT)

    def _up_unhit(self, process: str) -> int | None:
        pid = self.files_().up(process)
        hit = {d.pid for d in self.done if d.action.kind == "sigkill"}
        return None if pid in hit else pid

    def _ask(
        self, action: str, process: str | None = None, args: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        assert self.link is not None
        try:
            return self.link.request(action, process, args, timeout=ACTION_S)
        except ControlError as error:
            what = " ".join(p for p in (action, process, json.dumps(args) if args else "") if p)
            raise Stopped(Violation("control", f"{what}: {error.reason}")) from error

    # ------------------------------------------------------------------- waits

    def settle(self, lag0_ok: Callable[[Done], bool]) -> None:
        """Wait for ``min_steps`` trainer steps after the last action (more after a
        ``wait``) and for ``lag0_ok`` (lag-0 alignment back at float level), until
        ``lag0_within`` steps have passed: then the checks say what is missing. Bounded by
        ``SETTLE_S``."""
        done = self.done[-1]
        least = min_steps(done.mode)
        if done.action.kind == "wait":
            least += int(done.action.value)
        within = max(least, lag0_within(done.mode))

        def settled() -> bool:
            after = len(self.files_().steps) - done.records_after
            return after >= within or (after >= least and lag0_ok(done))

        self._until(settled, SETTLE_S, f"{least} trainer steps after {done.action}")

    def _until(self, condition: Callable[[], Any], deadline_s: float, what: str) -> Any:
        """Poll ``condition`` (the run's files read first) until truthy; a run that ended or a
        timeout stops the walk."""
        deadline = time.monotonic() + deadline_s
        run = self.require_run()
        while True:
            if self.files is not None:
                self.files.refresh()
            value = condition()
            if value:
                return value
            if not run.alive:
                code = run.popen.returncode
                raise Stopped(Violation("give-up", f"the run exited {code} waiting for {what}"))
            if time.monotonic() > deadline:
                raise Stopped(Violation("progress", f"no {what} within {deadline_s:.0f} s"))
            time.sleep(POLL)

    # ---------------------------------------------------------------- plumbing

    def files_(self) -> RunFiles:
        assert self.files is not None, "the run has not started"
        return self.files

    def require_run(self) -> HeadlessCli:
        assert self.run is not None, "the run has not started"
        return self.run


def refused_by_design(key: str, value: float, mode: str, beta: float) -> str | None:
    """Why the run refuses this edit by design, or None: ``beta`` from 0 to more in a
    full-weight mode (the trainer loads its KL reference model only when it starts with
    beta > 0: ``grpo_tui/plan/overrides.py``; in the LoRA modes the reference is the base,
    the adapter disabled)."""
    if key == "beta" and value > 0 and beta == 0 and mode not in LORA_MODES:
        return f"beta 0 -> {value:g} in {mode} has no KL reference model"
    return None


def min_steps(mode: str) -> int:
    return MIN_STEPS.get(mode, MIN_STEPS_DEFAULT)


def lag0_within(mode: str) -> int:
    return LAG0_WITHIN.get(mode, LAG0_WITHIN_DEFAULT)


def _only_dir(output: Path) -> Path | None:
    found = sorted(output.iterdir()) if output.is_dir() else []
    return found[0] if len(found) == 1 else None
