"""Profiles: one TOML file describing a run, read with tomllib and validated with pydantic.

A profile has a ``[run]`` table (name, weight-sync mode, model, output directory,
``exit_with``, seed), role tables (``[api]``, ``[inference]``, ``[trainer]``, ``[[env]]``)
that ``grpo_tui.plan.roles`` expands into process specs, and ``[process.<name>]`` tables for any
other process, holding every ``ProcessSpec`` field (checked in ``process_tables.py``).
Every problem is reported as a ``Problem`` naming the file, the key path (``trainer.lr``,
``process.reward.depends_on.x``) and the line (``toml_keys.py``), so that a person can fix
all of them in one pass.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from grpo_trainer.serve.settings import Mode
from grpo_tui.plan.toml_keys import KeyLines, KeyPath, format_key

ROLE_TABLES = ("api", "inference", "trainer", "env")
TOP_LEVEL_KEYS = ("run", *ROLE_TABLES, "process", "cluster")
PROBE_KINDS = ("http", "tcp", "exec", "log_line")

@dataclass(frozen=True)
class Problem:
    """One thing wrong with a profile: where it is and what to do about it."""

    file: str
    key: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class ProfileError(Exception):
    """A profile that cannot run; ``problems`` lists every reason found."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class TinyShape(BaseModel):
    """``[run.tiny]``: the shape of the model built with ``model = "tiny"`` (the builder's
    flags, ``python -m grpo_trainer.tiny_model build``). vLLM's attention kernels want
    ``hidden_size / num_heads`` of 64 or more (profiles/quickstart-gpu.toml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(64, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(128, ge=8)
    final_norm_weight: float = Field(6.0, gt=0)
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the saved weights (bfloat16: half the files)"
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyShape:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads")
        return self

    def flags(self) -> list[str]:
        """The builder's flags for the keys the profile set (none for the default shape)."""
        return [
            part
            for key, value in self.model_dump(exclude_defaults=True).items()
            for part in (f"--{key.replace('_', '-')}", str(value))
        ]


class RunSettings(BaseModel):
    """The ``[run]`` table: what this run is called, which mode and model it uses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("grpo", pattern=r"^[A-Za-z0-9_.-]+$")
    mode: Mode = "none"
    model: str = Field("tiny", min_length=1)
    tiny: TinyShape = Field(default_factory=TinyShape, description='shape for model = "tiny"')
    output_dir: str = "runs"
    exit_with: str | None = None
    seed: int = 0
    on_needed_failure: Literal["stop", "wait"] = Field(
        "stop",
        description="when a process the run needs failed for good (every environment, "
        "inference, the API): stop the run, or wait for someone to start it again",
    )
    stall_after: float = Field(
        30.0, gt=0, description="seconds without a trainer step before the stall is explained"
    )
    notify: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        min_length=1,
        description='a command, e.g. ["python", "post.py"], run when the run ends, a process '
        "fails for good, the run stalls or an alert starts, with the facts as JSON on its "
        "stdin (grpo_tui/notify.py)",
    )

    @model_validator(mode="after")
    def _tiny_only_for_tiny(self) -> RunSettings:
        if "tiny" in self.model_fields_set and self.model != "tiny":
            raise ValueError(f'tiny shapes the model = "tiny" only, not {self.model!r}')
        return self

    @property
    def tiny_model(self) -> bool:
        """True when the run builds its own tiny model into ``RUN/model`` first."""
        return self.model == "tiny"
_NAME = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_KEY = re.compile(rf"^\s*({_NAME}(?:\s*\.\s*{_NAME})*)\s*=")
@dataclass
class Profile:
    """A parsed profile: raw tables, the validated ``[run]`` table, and where keys are."""

    path: Path
    text: str
    data: dict[str, Any]
    run: RunSettings
    lines: KeyLines = field(repr=False)

    def problem(self, path: KeyPath, message: str) -> Problem:
        """A problem at ``path`` with its line looked up in the text."""
        return Problem(str(self.path), format_key(path), self.lines.line(path), message)

    def validation_problems(
        self, error: ValidationError, prefix: KeyPath, model: type[BaseModel] | None = None
    ) -> list[Problem]:
        """One problem per pydantic error, its location prefixed with the table's path."""
        return [
            self.problem((*prefix, *_clean_loc(detail["loc"])), _message(detail, model))
            for detail in error.errors()
        ]

    def table(self, name: str) -> Any:
        """The raw value of a top-level key (``None`` when absent)."""
        return self.data.get(name)

    def has_role(self, role: str) -> bool:
        """True when the profile names the role's table (an empty ``[api]`` counts)."""
        return role in self.data

    def resolved(self) -> dict[str, Any]:
        """The profile as it runs: the raw tables with ``[run]`` fully resolved."""
        run = self.run.model_dump(exclude_none=True)
        return {"run": run, **{k: v for k, v in self.data.items() if k != "run"}}


def _clean_loc(loc: tuple[str | int, ...]) -> KeyPath:
    """Drop pydantic's discriminator tags (``readiness.http.url`` -> ``readiness.url``)."""
    out: list[str | int] = []
    for i, part in enumerate(loc):
        after_probe = i > 0 and loc[i - 1] in ("readiness", "liveness")
        if after_probe and part in PROBE_KINDS:
            continue
        out.append(part)
    return tuple(out)


def _fields_at(model: type[BaseModel] | None, loc: Sequence[str | int]) -> list[str]:
    """Field names of the (sub)model at ``loc``; empty when it cannot be resolved."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        info = current.model_fields.get(str(part))
        if info is None:
            return []
        current = info.annotation
        if get_origin(current) is not None:
            models = [a for a in get_args(current) if isinstance(a, type)]
            current = models[0] if len(models) == 1 else None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _message(detail: ErrorDetails, model: type[BaseModel] | None) -> str:
    """A pydantic error in words a profile author reads without knowing pydantic."""
    kind = detail["type"]
    if kind == "extra_forbidden":
        key = str(detail["loc"][-1])
        known = _fields_at(model, detail["loc"][:-1])
        close = difflib.get_close_matches(key, known, n=1)
        if close:
            return f"unknown key (did you mean {close[0]!r}?)"
        return f"unknown key (known keys: {', '.join(known)})" if known else "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_not_found" or kind == "union_tag_invalid":
        return f"probe needs kind = one of {', '.join(PROBE_KINDS)}"
    message = str(detail["msg"])
    message = message.removeprefix("Value error, ")
    if "input" in detail and not isinstance(detail["input"], dict | list):
        message += f" (got {detail['input']!r})"
    return message


def _syntax_line(error: tomllib.TOMLDecodeError) -> int | None:
    found = re.search(r"at line (\d+)", str(error))
    return int(found.group(1)) if found else None


def load_profile(
    path: Path | str, *, mode: str | None = None, inference_url: str | None = None
) -> Profile:
    """Read and check a profile's syntax, top-level keys and ``[run]`` table.

    ``mode`` overrides ``run.mode`` (the command line's ``--mode``), ``inference_url`` sets
    ``inference.url`` (``--inference-url``: attach to a running server). Role tables and
    processes are checked when the role layer builds the plan. Raises ``ProfileError``.
    """
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError([Problem(name, "", None, "file not found")]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ProfileError([Problem(name, "", None, f"cannot read: {error}")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(error))
        raise ProfileError([Problem(name, "", _syntax_line(error), f"TOML: {message}")]) from None
    lines = KeyLines(text)
    problems: list[Problem] = []
    if inference_url is not None and isinstance(data.get("inference", {}), dict):
        data["inference"] = {**data.get("inference", {}), "url": inference_url}

    def at(key: KeyPath, message: str) -> Problem:
        return Problem(name, format_key(key), lines.line(key), message)

    for key in data:
        if key not in TOP_LEVEL_KEYS:
            close = difflib.get_close_matches(key, TOP_LEVEL_KEYS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(TOP_LEVEL_KEYS)}"
            problems.append(at((key,), f"unknown table ({hint})"))
    for key in ("run", "api", "inference", "trainer", "process", "cluster"):
        if key in data and not isinstance(data[key], dict):
            problems.append(at((key,), f"must be a table, got {type(data[key]).__name__}"))
    env = data.get("env")
    if env is not None and not (isinstance(env, list) and all(isinstance(e, dict) for e in env)):
        problems.append(at(("env",), "must be an array of tables ([[env]])"))
    run_table = data.get("run", {})
    if not isinstance(run_table, dict):
        run_table = {}
    if mode is not None:
        run_table = {**run_table, "mode": mode}
    run = RunSettings()
    try:
        run = RunSettings.model_validate(run_table)
    except ValidationError as error:
        for detail in error.errors():
            loc = ("run", *detail["loc"])
            message = _message(detail, RunSettings)
            if mode is not None and detail["loc"] == ("mode",):
                message += " [from --mode]"
            problems.append(at(loc, message))
    if problems:
        raise ProfileError(problems)
    return Profile(path=path, text=text, data=data, run=run, lines=lines)
