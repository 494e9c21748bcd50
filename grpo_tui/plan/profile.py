"""Profiles: one TOML file describing a run, read with tomllib and validated with pydantic.

A profile has a ``[run]`` table (name, weight-sync mode, model, output directory,
``exit_with``, seed), role tables (``[api]``, ``[inference]``, ``[trainer]``, ``[[env]]``)
that ``grpo_tui.plan.roles`` expands into process specs, and ``[process.<name>]`` tables for any
other process, holding every ``ProcessSpec`` field. Every problem is reported as a
``Problem`` naming the file, the key path (``trainer.lr``, ``process.reward.depends_on.x``)
and the line, so that a person can fix all of them in one pass.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from grpo_trainer.serve.settings import Mode
from grpo_tui.supervisor.spec import ProcessSpec

ROLE_TABLES = ("api", "inference", "trainer", "env")
TOP_LEVEL_KEYS = ("run", *ROLE_TABLES, "process", "cluster")
PROBE_KINDS = ("http", "tcp", "exec", "log_line")

KeyPath = tuple[str | int, ...]


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

    @model_validator(mode="after")
    def _tiny_only_for_tiny(self) -> RunSettings:
        if "tiny" in self.model_fields_set and self.model != "tiny":
            raise ValueError(f'tiny shapes the model = "tiny" only, not {self.model!r}')
        return self

    @property
    def tiny_model(self) -> bool:
        """True when the run builds its own tiny model into ``RUN/model`` first."""
        return self.model == "tiny"


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def format_key(path: Iterable[str | int]) -> str:
    """``("env", 0, "group_size")`` -> ``env[0].group_size``; a key that is not a bare
    TOML key is quoted as TOML quotes it (``run." "``), so every key reads unambiguously."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        if not _BARE_KEY.match(part):
            part = "".join(
                c if c.isprintable() else _toml_escape(c)
                for c in json.dumps(part, ensure_ascii=False)
            )
        out += f".{part}" if out else part
    return out


def _toml_escape(char: str) -> str:
    r"""A character as a TOML string escape: what is not printable would break the line
    (``\x85`` and ``\u2028`` are line breaks to ``str.splitlines``)."""
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


_HEADER = re.compile(r"^\s*(\[\[?)\s*(.+?)\s*\]\]?\s*(#.*)?$")
_NAME = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_KEY = re.compile(rf"^\s*({_NAME}(?:\s*\.\s*{_NAME})*)\s*=")
_STRING = re.compile(r"""("(?:[^"\\]|\\.)*"|'[^']*')""")


def _split_dotted(key: str) -> list[str]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*'""", key)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


class KeyLines:
    """Maps key paths of a TOML text to the line that defines them (1-based).

    tomllib gives no positions for values, so this scans the text the way a reader does:
    table headers (with array-of-tables indices) and ``key = value`` lines, skipping the
    inside of multi-line arrays and strings.
    """

    def __init__(self, text: str) -> None:
        self._lines: dict[KeyPath, int] = {}
        counts: dict[tuple[str, ...], int] = {}
        table: KeyPath = ()
        depth = 0
        in_string: str | None = None
        for number, line in enumerate(text.splitlines(), start=1):
            if in_string is not None:
                if in_string in line:
                    in_string = None
                continue
            if depth == 0:
                table = self._visit(line, number, table, counts)
                if _HEADER.match(line):
                    continue
            for quote in ('"""', "'''"):
                if line.count(quote) % 2 == 1:
                    in_string = quote
            code = _STRING.sub('""', line).split("#", 1)[0]
            depth = max(0, depth + code.count("[") + code.count("{"))
            depth = max(0, depth - code.count("]") - code.count("}"))

    def _visit(
        self, line: str, number: int, table: KeyPath, counts: dict[tuple[str, ...], int]
    ) -> KeyPath:
        header = _HEADER.match(line)
        if header:
            names = tuple(_split_dotted(header.group(2)))
            if header.group(1) == "[[":
                index = counts.get(names, 0)
                counts[names] = index + 1
                path: KeyPath = (*names, index)
            else:
                path = names
            self._lines.setdefault(path, number)
            return path
        key = _KEY.match(line)
        if key:
            self._lines.setdefault((*table, *_split_dotted(key.group(1))), number)
        return table

    def line(self, path: KeyPath) -> int | None:
        """The line of ``path`` or of its nearest enclosing key that appears in the text."""
        for end in range(len(path), 0, -1):
            found = self._lines.get(tuple(path[:end]))
            if found is not None:
                return found
        return None


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


def load_profile(path: Path | str, *, mode: str | None = None) -> Profile:
    """Read and check a profile's syntax, top-level keys and ``[run]`` table.

    ``mode`` overrides ``run.mode`` (the command line's ``--mode``). Role tables and
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


def validate_process_tables(
    profile: Profile, roles: Iterable[str]
) -> tuple[list[ProcessSpec], dict[str, KeyPath], list[Problem]]:
    """Validate every ``[process.<name>]`` table into a ``ProcessSpec`` (name from the key).

    Tables named after a role process (``[process.trainer]``) adjust that role's spec and
    are left to the role layer. Returns the specs, each one's key path in the profile, and
    the problems found.
    """
    specs: list[ProcessSpec] = []
    sources: dict[str, KeyPath] = {}
    problems: list[Problem] = []
    skip = set(roles)
    for name, table in (profile.table("process") or {}).items():
        where: KeyPath = ("process", name)
        if name in skip:
            continue
        if not isinstance(table, dict):
            problems.append(profile.problem(where, "must be a table"))
            continue
        if "name" in table:
            problems.append(profile.problem((*where, "name"), "the name comes from the key"))
            continue
        try:
            spec = ProcessSpec.model_validate({"name": name, **expand_depends_on(table)})
        except ValidationError as error:
            problems += profile.validation_problems(error, where, ProcessSpec)
            continue
        specs.append(spec)
        sources[name] = where
    return specs, sources, problems


def expand_depends_on(table: Mapping[str, Any]) -> dict[str, Any]:
    """Accept ``depends_on = ["a"]`` and ``depends_on = {a = "process_started"}``.

    Both read naturally in TOML; the spec wants ``{a = {condition = "..."}}``. A list means
    ``process_healthy`` for each name.
    """
    out = dict(table)
    depends = out.get("depends_on")
    if isinstance(depends, list) and all(isinstance(name, str) for name in depends):
        out["depends_on"] = {name: {} for name in depends}
    elif isinstance(depends, dict):
        out["depends_on"] = {
            name: {"condition": dep} if isinstance(dep, str) else dep
            for name, dep in depends.items()
        }
    return out


def check_graph(
    profile: Profile,
    specs: Sequence[ProcessSpec],
    sources: Mapping[str, KeyPath],
    names: Sequence[str],
) -> tuple[list[ProcessSpec], list[Problem]]:
    """Check dependencies and ports; return the specs in start order and the problems.

    Problems: a ``depends_on`` or ``needs`` naming no process, a dependency cycle, two
    processes configured on one port. ``names`` are all processes the profile defines
    (valid or not), so that one bad table does not make its dependents' references look
    wrong. The order is a topological order that keeps the profile's order among processes
    free to start together.
    """
    problems: list[Problem] = []
    known = ", ".join(names)
    for spec in specs:
        for dep in spec.depends_on:
            if dep not in names:
                problems.append(
                    profile.problem(
                        (*sources[spec.name], "depends_on", dep),
                        f"names no process (processes: {known})",
                    )
                )
        for index, need in enumerate(spec.needs):
            for name in need.any_of:
                if name not in names:
                    problems.append(
                        profile.problem(
                            (*sources[spec.name], "needs", index, "any_of"),
                            f"{name!r} names no process (processes: {known})",
                        )
                    )
    owners: dict[int, str] = {}
    for spec in specs:
        if spec.port is None:
            continue
        if spec.port in owners:
            other = owners[spec.port]
            problems.append(
                profile.problem(
                    (*sources[spec.name], "port"),
                    f"port {spec.port} is also used by {other} ({format_key(sources[other])})",
                )
            )
        else:
            owners[spec.port] = spec.name
    order, cycle = _topological(specs)
    if cycle:
        first, second = cycle[0], cycle[1]
        problems.append(
            profile.problem(
                (*sources[first], "depends_on", second),
                f"dependency cycle: {' -> '.join(cycle)}",
            )
        )
    return order, problems


def _topological(specs: Sequence[ProcessSpec]) -> tuple[list[ProcessSpec], list[str]]:
    """Kahn's order over known dependencies, and one cycle (as a closed path) if any."""
    names = {spec.name for spec in specs}
    waiting = {spec.name: {d for d in spec.depends_on if d in names} for spec in specs}
    order: list[ProcessSpec] = []
    remaining = list(specs)
    while remaining:
        free = [spec for spec in remaining if not waiting[spec.name]]
        if not free:
            return order, _find_cycle(waiting)
        for spec in free:
            order.append(spec)
            remaining.remove(spec)
            for deps in waiting.values():
                deps.discard(spec.name)
    return order, []


def _find_cycle(waiting: Mapping[str, set[str]]) -> list[str]:
    """Follow dependencies among the stuck processes until a name repeats."""
    start = next(name for name, deps in waiting.items() if deps)
    path = [start]
    while True:
        nxt = sorted(waiting[path[-1]])[0]
        if nxt in path:
            return [*path[path.index(nxt) :], nxt]
        path.append(nxt)
