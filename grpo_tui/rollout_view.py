"""A recorded group as text: what the inspector draws and ``grpo-tui samples`` prints.

Rich renderables and plain dicts only (no textual), so the inspector screen and the command
line show the same thing. A completion's tokens can be coloured by one :data:`MEASURES`:
the trainer-vs-inference logprob difference, the entropy, the importance ratio, or the
inference logprob (the only one a dropped group has).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from rich.console import Group as RichGroup
from rich.console import RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text

from grpo_trainer.records.rollouts import NO_LAG, Completion, GroupRecord

MEASURES: dict[str, str] = {
    "delta": "Δlogp trainer-inference",
    "entropy": "entropy",
    "ratio": "importance ratio",
    "logp": "inference logprob",
}
"""Colour measure -> legend. ``delta``, ``entropy`` and ``ratio`` need the trainer's
numbers (trained groups); ``logp`` every group has."""
SCALES = {"delta": 0.5, "entropy": 2.0, "ratio": math.log(2.0), "logp": 5.0}
"""The magnitude at which a token's colour is full (|Δ| 0.5, entropy 2 nats, ratio 2x or
0.5x, logprob -5)."""
POSITIVE, NEGATIVE = (220, 60, 60), (60, 110, 230)


def _number(value: float | None, fmt: str = "{:.3f}") -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else fmt.format(value)
    )


def lag_text(lag: int | None) -> str:
    return "-" if lag is None or lag == NO_LAG else str(lag)


def measure_values(completion: Completion, measure: str) -> np.ndarray | None:
    """Per position, the signed amount to colour by (NaN: uncoloured); None: not recorded."""
    values = completion.values
    if measure == "delta":
        return completion.delta()
    if measure == "ratio":
        ratio = values.get("ratio")
        return None if ratio is None else np.log(ratio)
    if measure == "entropy":
        return values.get("entropy")
    return values.get("inference_logprobs")


def token_style(value: float, measure: str) -> Style:
    """Background for one token: red positive / blue negative, stronger with magnitude
    (entropy and logprob use one hue: high entropy, low logprob stand out)."""
    if math.isnan(value):
        return Style()
    strength = min(1.0, abs(value) / SCALES[measure])
    if measure == "logp":
        strength = min(1.0, -value / SCALES[measure])
    hue = POSITIVE if measure in ("entropy", "logp") or value > 0 else NEGATIVE
    base = (30, 30, 30)
    r, g, b = (int(c0 + (c1 - c0) * strength) for c0, c1 in zip(base, hue, strict=True))
    return Style(bgcolor=f"rgb({r},{g},{b})", color="white")


def completion_tokens(record: GroupRecord, completion: Completion, measure: str) -> Text:
    """The completion token by token, each on a background for ``measure``; the prompt is
    left out. A measure the group lacks falls back to the inference logprob."""
    values = measure_values(completion, measure)
    if values is None:
        measure, values = "logp", measure_values(completion, "logp")
    text = Text()
    for position in range(completion.start, len(completion.tokens)):
        piece = record.piece(int(completion.tokens[position])) or "∅"
        value = float(values[position]) if values is not None else math.nan
        text.append(piece.replace("\n", "⏎\n"), token_style(value, measure))
    return text


def legend(measure: str, record: GroupRecord) -> Text:
    """One line: what the colours mean (and when the group lacks the measure)."""
    has_trainer = any("trainer_logprobs" in c.values for c in record.completions)
    if measure != "logp" and not has_trainer:
        return Text(
            f"{MEASURES[measure]} needs the trainer's logprobs (a dropped group has none): "
            "coloured by inference logprob",
            style="italic dim",
        )
    scale = SCALES[measure]
    text = Text(f"{MEASURES[measure]}: ")
    if measure in ("delta", "ratio"):
        low = f"-{scale:g}" if measure == "delta" else "0.5x"
        high = f"+{scale:g}" if measure == "delta" else "2x"
        text.append(f" {low} ", token_style(-scale, measure))
        text.append(" 0 " if measure == "delta" else " 1x ", Style())
        text.append(f" {high} ", token_style(scale, measure))
    else:
        text.append(" 0 ", Style())
        edge = f"{scale:g} nats" if measure == "entropy" else f"-{scale:g}"
        text.append(f" {edge} ", token_style(scale if measure == "entropy" else -scale, measure))
    return text


def group_title(record: GroupRecord) -> Text:
    """``step 12 · trained · toy · version 11 · lag 1 · reward 0.38 [0-1]``."""
    scores = record.scores
    kind_style = "bold green" if record.kind == "trained" else "bold yellow"
    return Text.assemble(
        (f"step {record.step}", "bold"),
        " · ",
        (record.kind, kind_style),
        f" · {record.env or '-'} · version {_number(record.version, '{}')}"
        f" · lag {lag_text(record.lag)} · reward {np.mean(scores):.3f}"
        f" [{min(scores):.3g}..{max(scores):.3g}]",
    )


def completions_table(record: GroupRecord, selected: int | None = None) -> Table:
    """One row per completion: score, advantage, length, mean |Δlogp|, entropy and ratio
    (version and lag are the group's: in its title), the selected one highlighted."""
    table = Table(box=None, padding=(0, 1), expand=True, show_edge=False)
    for name, width in (("#", 2), ("score", 5), ("adv", 5), ("len", 4), ("|Δ|", 5)):
        table.add_column(name, justify="right", no_wrap=True, min_width=width)
    table.add_column("ent", justify="right", no_wrap=True, min_width=4)
    table.add_column("ratio", justify="right", no_wrap=True, min_width=5)
    table.add_column("text", no_wrap=True, overflow="ellipsis", ratio=1)
    for i, c in enumerate(record.completions):
        table.add_row(
            str(c.index),
            f"{c.score:.3g}",
            _number(c.advantage, "{:+.2f}"),
            str(c.length),
            _number(c.mean("abs_delta"), "{:.3f}"),
            _number(c.mean("entropy"), "{:.2f}"),
            _number(c.mean("ratio"), "{:.3f}"),
            Text(c.text.replace("\n", "⏎"), overflow="ellipsis", no_wrap=True),
            style="reverse" if i == selected else "",
        )
    return table


def group_renderable(record: GroupRecord, measure: str = "delta") -> RenderableType:
    """The whole group as ``grpo-tui samples`` prints it: title, prompt, completions table,
    and every completion's tokens coloured by ``measure``."""
    parts: list[RenderableType] = [
        group_title(record),
        Text.assemble(("prompt: ", "dim"), record.prompt_text),
        completions_table(record),
    ]
    for c in record.completions:
        parts.append(Text(f"#{c.index} tokens", style="dim"))
        parts.append(completion_tokens(record, c, measure))
    parts.append(legend(measure, record))
    return RichGroup(*parts)


def _floats(array: np.ndarray | None) -> list[float | None] | None:
    if array is None:
        return None
    return [None if math.isnan(v) else round(float(v), 6) for v in array.tolist()]


def group_json(record: GroupRecord) -> dict[str, Any]:
    """Everything recorded of a group as JSON-ready data (NaN as null)."""
    return {
        "kind": record.kind,
        "step": record.step,
        "group": record.group,
        "env": record.env,
        "env_id": record.env_id,
        "policy_version": record.version,
        "lag": record.lag,
        "t": record.t,
        "prompt": record.prompt_text,
        "prompt_tokens": record.prompt_tokens.tolist(),
        "completions": [
            {
                "index": c.index,
                "score": c.score,
                "advantage": c.advantage,
                "text": c.text,
                "length": c.length,
                "tokens": c.tokens[c.start :].tolist(),
                "pieces": [record.piece(t) for t in c.tokens[c.start :].tolist()],
                "trained": c.trained[c.start :].tolist(),
                **{name: _floats(array[c.start :]) for name, array in c.values.items()},
                "mean_abs_delta": _floats(np.array([c.mean("abs_delta")]))[0],  # type: ignore[index]
                "mismatch_kl": _floats(np.array([c.mean("mismatch_kl")]))[0],  # type: ignore[index]
            }
            for c in record.completions
        ],
    }
