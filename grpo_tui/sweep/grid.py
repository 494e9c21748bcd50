"""Sweep cells from ``--set KEY=V1,V2,...`` options: the grid (or zipped list) and its checks.

A value is read as a TOML value (``1e-4``, ``0``, ``true``, ``"text"``, ``[1, 2]``) and as
a bare string otherwise (``--set run.mode=none,lora_only``). A key is a dotted path into
the profile (``trainer.lr``, ``inference.dtype``, ``env[0].group_size``); ``env.KEY`` sets
the key in every ``[[env]]`` table. Every cell's profile is checked exactly as ``grpo-tui
check`` checks a profile, and a problem caused by an override names the ``--set`` option.
"""

from __future__ import annotations

import copy
import itertools
import re
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from grpo_tui.plan.profile import Problem, Profile, ProfileError, load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.plan.toml_keys import KeyPath

_PART = re.compile(r"([A-Za-z0-9_-]+)((?:\[\d+\])*)")
_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
QUOTES = "\"'"


@dataclass(frozen=True)
class Axis:
    """One ``--set`` option: a key path and the values it takes (with their text)."""

    key: str
    values: tuple[Any, ...]
    texts: tuple[str, ...]


@dataclass(frozen=True)
class Cell:
    """One run of the sweep: its id (also its run directory's name) and its overrides."""

    id: str
    overrides: dict[str, Any]


def _split_values(text: str) -> list[str]:
    """Split on commas outside brackets, braces and quotes (``[1,2],[3]`` is two values)."""
    parts: list[str] = []
    depth, quote, current = 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    parts.append(current)
    return [part.strip() for part in parts]


def parse_value(text: str) -> Any:
    """A TOML value, or the text itself when it is not one (a bare word)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_set(option: str) -> Axis:
    """``trainer.lr=1e-4,3e-4`` -> an :class:`Axis`; raises ``ValueError`` saying what is wrong."""
    key, sep, values = option.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--set {option!r}: expected KEY=VALUE[,VALUE...]")
    key_path(key)
    texts = _split_values(values)
    if any(not text for text in texts):
        raise ValueError(f"--set {option!r}: empty value")
    return Axis(key, tuple(parse_value(t) for t in texts), tuple(texts))


def key_path(key: str) -> KeyPath:
    """``env[0].group_size`` -> ``("env", 0, "group_size")``; ``ValueError`` if malformed."""
    path: list[str | int] = []
    for part in key.split("."):
        found = _PART.fullmatch(part)
        if found is None:
            raise ValueError(f"--set {key}: {part!r} is not a key name (letters, digits, _ -)")
        path.append(found.group(1))
        path += [int(i) for i in re.findall(r"\d+", found.group(2))]
    return tuple(path)


def expand(axes: Sequence[Axis], *, zipped: bool) -> list[Cell]:
    """Every combination of the axes' values (or the i-th value of each, ``zipped``)."""
    if not axes:
        raise ValueError("a sweep needs at least one --set KEY=V1,V2,...")
    keys = [axis.key for axis in axes]
    if len(set(keys)) != len(keys):
        raise ValueError(f"--set names a key twice: {', '.join(sorted(keys))}")
    if zipped:
        lengths = {len(axis.values) for axis in axes}
        if len(lengths) != 1:
            counts = ", ".join(f"{a.key}: {len(a.values)}" for a in axes)
            raise ValueError(f"--zip needs as many values for every key ({counts})")
        combos = list(zip(*(range(len(a.values)) for a in axes), strict=True))
    else:
        combos = list(itertools.product(*(range(len(a.values)) for a in axes)))
    width = len(str(len(combos) - 1))
    cells = []
    for number, combo in enumerate(combos):
        label = "-".join(
            _ID_CHARS.sub("_", f"{axis.key.rsplit('.', 1)[-1]}{axis.texts[i].strip(QUOTES)}")
            for axis, i in zip(axes, combo, strict=True)
        )
        overrides = {axis.key: axis.values[i] for axis, i in zip(axes, combo, strict=True)}
        cells.append(Cell(f"{number:0{width}d}-{label}", overrides))
    return cells


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of the profile's tables with each override set (tables made as needed)."""
    out = copy.deepcopy(dict(data))
    for key, value in overrides.items():
        path = key_path(key)
        if path[0] == "env" and len(path) > 1 and isinstance(path[1], str):
            for table in out.get("env") or [{}]:
                _set(table, path[1:], value, key)
            out.setdefault("env", [{}])
        else:
            _set(out, path, value, key)
    return out


def _set(table: Any, path: KeyPath, value: Any, key: str) -> None:
    for part in path[:-1]:
        if isinstance(part, int):
            if not isinstance(table, list) or part >= len(table):
                raise ValueError(f"--set {key}: no [{part}] here (the profile has fewer tables)")
            table = table[part]
        else:
            if not isinstance(table, dict):
                raise ValueError(f"--set {key}: {part!r} is inside a value, not a table")
            table = table.setdefault(part, {})
    last = path[-1]
    if isinstance(last, int) or not isinstance(table, dict):
        raise ValueError(f"--set {key}: must name a key inside a table")
    table[last] = value


def write_profile(path: Path, data: Mapping[str, Any], header: str = "") -> None:
    """Write profile tables as TOML (``header`` lines first, as comments)."""
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(comments + tomli_w.dumps(dict(data)), encoding="utf-8")


def _caused_by(problem_key: str, override: str) -> bool:
    return (
        problem_key == override
        or problem_key.startswith((f"{override}.", f"{override}["))
        or override.startswith((f"{problem_key}.", f"{problem_key}["))
        or (
            override.startswith("env.")
            and problem_key.startswith("env[")
            and problem_key.split(".", 1)[-1] == override.split(".", 1)[-1]
        )
    )


def check_cells(profile: Profile, cells: Sequence[Cell]) -> None:
    """Check the base profile and every cell's profile; raise ``ProfileError`` with all problems.

    A cell's problem is reported against the ``--set`` option that caused it (once, however
    many cells share it); the base profile's own problems name its file and line as usual.
    """
    build_plan(profile, run_dir=Path(tempfile.gettempdir()) / "grpo-tui-sweep-check")
    problems: dict[tuple[str, str], Problem] = {}
    with tempfile.TemporaryDirectory(prefix="grpo-tui-sweep-") as tmp:
        for cell in cells:
            path = Path(tmp) / f"{cell.id}.toml"
            try:
                write_profile(path, apply_overrides(profile.data, cell.overrides))
                build_plan(load_profile(path), run_dir=Path(tmp) / cell.id)
            except ValueError as error:
                _add(problems, Problem("--set", "", None, str(error)))
            except ProfileError as error:
                for problem in error.problems:
                    _add(problems, _attribute(problem, cell, profile))
    if problems:
        raise ProfileError(list(problems.values()))


def _attribute(problem: Problem, cell: Cell, profile: Profile) -> Problem:
    for key, value in cell.overrides.items():
        if _caused_by(problem.key, key):
            where = f"--set {key}={tomli_w.dumps({'v': value})[4:].strip()}"
            return Problem(where, problem.key, None, problem.message)
    return Problem(str(profile.path), problem.key, None, problem.message)


def _add(problems: dict[tuple[str, str], Problem], problem: Problem) -> None:
    problems.setdefault((problem.key, problem.message), problem)


def describe(cell: Cell) -> str:
    """``trainer.lr=0.0001 trainer.beta=0`` for tables and logs."""
    return " ".join(f"{key}={value}" for key, value in cell.overrides.items())
