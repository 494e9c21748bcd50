"""Walks over the control surface: a seeded draw of a user's actions on a running stack.

A walk is a setup (the mode the run starts in, its checkpoint interval) and a sequence of
actions, each one thing a person does to a running quickstart: switch the weight-sync mode
(``m``), restart inference (``i``) or the trainer (``r``: it resumes from its
checkpoint), stop and start an environment (``x``, ``s``), edit lr, beta or temperature
live (``e``), let it train a few more steps (nothing pressed: where the next action falls
against checkpoints and syncs), or a fault from outside: SIGKILL a process, SIGSTOP an
environment for a while and SIGCONT it. ``draw`` makes one from a seed; ``str`` and
``Walk.parse`` write and read the one-line form a failure prints, for replay::

    mode=shared_vllm ckpt=5 | switch:lora_only restart:inference sigstop:env:8
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

MODES = ("none", "shared_vllm", "lora_only", "lora_restart", "colocate")
LORA_MODES = ("lora_only", "lora_restart")
KILL_TARGETS = ("api", "inference", "trainer", "env")
RESTART_TARGETS = ("inference", "trainer")
EDITS: dict[str, tuple[float, ...]] = {
    "lr": (5e-4, 1e-3, 2e-3),
    "beta": (0.0, 0.02, 0.08),
    "temperature": (0.7, 1.0, 1.3),
}
"""Values a live edit draws (all valid for the quickstart). ``lr`` is edited as
``lora_lr`` in the LoRA modes, as a person would: the run refuses ``lr`` there."""
PAUSES = (2, 8)
"""Seconds an environment stays SIGSTOPped or stopped: shorter than the walk's
``stall_after`` (5 s), and longer (a stall the watchdog must name)."""
WAITS = (4, 8)
"""Steps a ``wait`` lets the run train beyond what every action waits for."""
CHECKPOINT_INTERVALS = (3, 5, 10)
START_WEIGHTS = {"shared_vllm": 3, "none": 1, "lora_only": 1, "lora_restart": 1, "colocate": 1}
"""The quickstart's mode most often; the others too (``lora_restart`` restarts inference
every 4 steps, the slowest start)."""
RULES: dict[str, int] = {
    "switch": 3,
    "restart": 2,
    "sigkill": 2,
    "sigstop": 1,
    "edit": 2,
    "stopstart": 1,
    "wait": 1,
}
"""Each rule's weight in a draw; its target and value are drawn uniformly."""


@dataclass(frozen=True)
class Action:
    """One action: ``kind`` on ``target``, with ``value`` (a mode, seconds, an edit)."""

    kind: str
    target: str
    value: str = ""

    def __str__(self) -> str:
        if self.kind == "edit":
            return f"edit:{self.target}={self.value}"
        return ":".join(p for p in (self.kind, self.target, self.value) if p)

    @classmethod
    def parse(cls, token: str) -> Action:
        kind, _, rest = token.partition(":")
        if kind == "edit":
            key, _, value = rest.partition("=")
            action = cls(kind, key, value)
        else:
            target, _, value = rest.partition(":")
            action = cls(kind, target, value)
        action.check()
        return action

    def check(self) -> None:
        """Raise ``ValueError`` naming what is wrong with a hand-written action."""
        targets = {
            "switch": MODES,
            "restart": RESTART_TARGETS,
            "sigkill": KILL_TARGETS,
            "sigstop": ("env",),
            "stopstart": ("env",),
            "edit": (*EDITS, "lora_lr"),
            "wait": ("steps",),
        }
        if self.kind not in targets:
            raise ValueError(f"unknown action {self.kind!r}: one of {', '.join(targets)}")
        if self.target not in targets[self.kind]:
            raise ValueError(f"{self.kind}: {self.target!r} is not one of {targets[self.kind]}")
        if self.kind in ("sigstop", "stopstart", "edit", "wait"):
            float(self.value)

    @property
    def seconds(self) -> float:
        """How long a SIGSTOP or a stop lasts."""
        return float(self.value)


@dataclass(frozen=True)
class Setup:
    """How the walk's run starts."""

    mode: str = "shared_vllm"
    checkpoint_interval: int = 5

    def __str__(self) -> str:
        return f"mode={self.mode} ckpt={self.checkpoint_interval}"


@dataclass(frozen=True)
class Walk:
    """A setup and the actions taken, in order."""

    setup: Setup
    actions: tuple[Action, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        return f"{self.setup} | {' '.join(str(a) for a in self.actions)}"

    @classmethod
    def parse(cls, text: str) -> Walk:
        """The walk ``str`` wrote (``mode=M ckpt=N | action action ...``)."""
        head, _, tail = text.partition("|")
        keys = dict(part.split("=", 1) for part in head.split())
        mode = keys.get("mode", Setup.mode)
        if mode not in MODES:
            raise ValueError(f"mode={mode}: one of {', '.join(MODES)}")
        setup = Setup(mode, int(keys.get("ckpt", Setup.checkpoint_interval)))
        return cls(setup, tuple(Action.parse(t) for t in tail.split()))

    def modes(self) -> list[str]:
        """The mode in force after each action (the start mode first)."""
        modes = [self.setup.mode]
        for action in self.actions:
            modes.append(action.target if action.kind == "switch" else modes[-1])
        return modes

    def without(self, start: int, stop: int) -> Walk:
        """The walk less its actions ``start:stop`` (an edit of ``lr`` is renamed for the
        mode it now runs in)."""
        kept = self.actions[:start] + self.actions[stop:]
        return Walk(self.setup, tuple(_fit_edits(self.setup.mode, kept)))


def _fit_edits(mode: str, actions: tuple[Action, ...]) -> list[Action]:
    """``lr`` edits as the mode in force takes them (``lora_lr`` in the LoRA modes)."""
    fitted = []
    for action in actions:
        if action.kind == "edit" and action.target in ("lr", "lora_lr"):
            key = "lora_lr" if mode in LORA_MODES else "lr"
            action = Action("edit", key, action.value)
        fitted.append(action)
        if action.kind == "switch":
            mode = action.target
    return fitted


def draw(seed: int, length: int) -> Walk:
    """The walk of ``seed``: a start mode, a checkpoint interval and ``length`` actions.

    A switch goes to a mode other than the current one; everything else may follow
    anything (controls compose: any action is correct after any other)."""
    rng = random.Random(f"combos:{seed}")
    mode = rng.choices(list(START_WEIGHTS), weights=list(START_WEIGHTS.values()))[0]
    setup = Setup(mode, rng.choice(CHECKPOINT_INTERVALS))
    actions = []
    for _ in range(length):
        kind = rng.choices(list(RULES), weights=list(RULES.values()))[0]
        if kind == "switch":
            mode = rng.choice([m for m in MODES if m != mode])
            actions.append(Action(kind, mode))
        elif kind == "restart":
            actions.append(Action(kind, rng.choice(RESTART_TARGETS)))
        elif kind == "sigkill":
            actions.append(Action(kind, rng.choice(KILL_TARGETS)))
        elif kind in ("sigstop", "stopstart"):
            actions.append(Action(kind, "env", str(rng.choice(PAUSES))))
        elif kind == "wait":
            actions.append(Action(kind, "steps", str(rng.choice(WAITS))))
        else:
            key = rng.choice(list(EDITS))
            actions.append(Action(kind, key, repr(rng.choice(EDITS[key]))))
    return Walk(setup, tuple(_fit_edits(setup.mode, tuple(actions))))
