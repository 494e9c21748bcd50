"""Which recorded groups to show: a filter the inspector and ``grpo-tui samples`` share.

Typed as space-separated conditions, e.g. ``kind=dropped env=gsm8k step=40..60 lag>=2
reward<0.5``: ``kind`` is ``trained`` or ``dropped``, ``env`` an environment name, and
``step``, ``lag`` and ``reward`` (the group's mean score) take ``=V``, ``=LO..HI`` (either
end may be left out), ``>=V``, ``<=V``, ``>V`` or ``<V``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np

from grpo_trainer.records.rollout_reader import RolloutIndex
from grpo_trainer.records.rollouts import KINDS, NO_LAG

FIELDS = ("kind", "env", "step", "lag", "reward")
RANGED = {"step": "step", "lag": "lag", "reward": "reward_mean"}
CONDITION = re.compile(r"^(?P<field>[a-z]+)(?P<op>>=|<=|=|>|<)(?P<value>.*)$")

Bounds = tuple[float, float]
ANY: Bounds = (-math.inf, math.inf)


@dataclass(frozen=True)
class GroupFilter:
    """Conditions on the index rows; an empty filter keeps every group."""

    kind: str | None = None
    env: str | None = None
    ranges: dict[str, Bounds] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"kind={self.kind}"] if self.kind else []
        parts += [f"env={self.env}"] if self.env else []
        for name, (low, high) in self.ranges.items():
            if low == high:
                parts.append(f"{name}={_num(low)}")
                continue
            shown_low = _num(low) if low > -math.inf else ""
            shown_high = _num(high) if high < math.inf else ""
            parts.append(f"{name}={shown_low}..{shown_high}")
        return " ".join(parts) or "all groups"

    def with_step(self, step: int | None) -> GroupFilter:
        ranges = dict(self.ranges)
        if step is None:
            ranges.pop("step", None)
        else:
            ranges["step"] = (step, step)
        return replace(self, ranges=ranges)


def _num(value: float) -> str:
    return f"{value:g}"


def _value(word: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{word!r}: {text!r} is not a number") from None


def parse_filter(text: str) -> GroupFilter:
    """A :class:`GroupFilter` from the typed conditions; ``ValueError`` names the bad one."""
    kind = env = None
    ranges: dict[str, Bounds] = {}
    for word in text.split():
        match = CONDITION.match(word)
        if match is None or match["field"] not in FIELDS:
            raise ValueError(
                f"{word!r}: expected FIELD=VALUE with FIELD one of {', '.join(FIELDS)} "
                "(step, lag, reward also take LO..HI, >=, <=, >, <)"
            )
        name, op, value = match["field"], match["op"], match["value"]
        if name == "kind":
            if op != "=" or value not in KINDS:
                raise ValueError(f"{word!r}: kind is {' or '.join(KINDS)}")
            kind = value
        elif name == "env":
            if op != "=" or not value:
                raise ValueError(f"{word!r}: env=NAME")
            env = value
        else:
            low, high = _bounds(word, name, op, value)
            old_low, old_high = ranges.get(name, ANY)
            ranges[name] = (max(low, old_low), min(high, old_high))
    return GroupFilter(kind=kind, env=env, ranges=ranges)


def _bounds(word: str, name: str, op: str, value: str) -> Bounds:
    if op == "=" and ".." in value:
        low, _, high = value.partition("..")
        return (
            _value(word, low) if low else -math.inf,
            _value(word, high) if high else math.inf,
        )
    number = _value(word, value)
    tiny = 1e-6 if name == "reward" else 1  # rewards are float32 in the index
    return {
        "=": (number, number),
        ">=": (number, math.inf),
        "<=": (-math.inf, number),
        ">": (number + tiny, math.inf),
        "<": (-math.inf, number - tiny),
    }[op]


def select(index: RolloutIndex, flt: GroupFilter) -> np.ndarray:
    """Row numbers of the groups that pass ``flt``, newest first."""
    rows = index.groups()
    whole = len(rows) == len(index)  # no rank parts: every row, in order

    def column(name: str) -> np.ndarray:
        values = index.rows[name]
        return values if whole else values[rows]

    keep = np.ones(len(rows), bool)
    if flt.kind is not None:
        keep &= column("kind") == KINDS.index(flt.kind)
    if flt.env is not None:
        code = index.envs.index(flt.env) if flt.env in index.envs else -1
        keep &= (index.env if whole else index.env[rows]) == code
    for name, (low, high) in flt.ranges.items():
        values = column(RANGED[name]).astype(float)
        keep &= (values >= low) & (values <= high)
        if name == "lag":
            keep &= values != NO_LAG
    chosen = rows[keep]
    order = np.argsort(-column("t")[keep], kind="stable")
    return chosen[order]
