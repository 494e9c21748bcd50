"""The rollout API's refusals, and the checks of posted bodies that need no database.

Every refusal is a ``Refused``: an HTTP status (4xx, or 503 when the queue database fails)
and the sentence the answer's ``detail`` carries. The app maps it to the response; the
service and these checks raise it without knowing about HTTP.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from grpo_trainer.api.schemas import ScoredData

MAX_REPORTED_ERRORS = 10


class Refused(Exception):
    """A request the API does not carry out, and why; nothing was changed."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def validation_detail(exc: ValidationError) -> str:
    """The first problems, with field paths, e.g. ``tokens.0.1: Input should be ...``."""
    errors = exc.errors(include_url=False)
    lines = []
    for error in errors[:MAX_REPORTED_ERRORS]:
        where = ".".join(str(part) for part in error["loc"]) or "body"
        lines.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    if len(errors) > MAX_REPORTED_ERRORS:
        lines.append(f"... and {len(errors) - MAX_REPORTED_ERRORS} more")
    return "; ".join(lines)


def parse(adapter: TypeAdapter[Any], body: bytes) -> Any:
    """Validate a JSON body: 400 when it is not JSON, 422 when it has the wrong shape."""
    if not body:
        raise Refused(400, "empty body: a JSON document is required")
    try:
        return adapter.validate_json(body)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise Refused(400, f"malformed JSON: {validation_detail(exc)}") from exc
        raise Refused(422, validation_detail(exc)) from exc


def refused_groups(body: bytes) -> tuple[int | None, int]:
    """``(env_id, groups)`` a refused body claims, for the dropped counter (best effort)."""
    try:
        value = json.loads(body)
    except ValueError:
        return None, 1
    count = len(value) if isinstance(value, list) else 1
    if isinstance(value, list):
        value = value[0] if value else None
    env_id = value.get("env_id") if isinstance(value, dict) else None
    return (env_id if isinstance(env_id, int) else None), max(count, 1)


def check_groups(
    groups: list[ScoredData], registration: dict[str, Any], known: set[int], max_group_size: int
) -> None:
    """422 for the first group the queue cannot take: an unregistered ``env_id``, more
    sequences than ``max_group_size`` or the trainer's batch, a sequence over the trainer's
    ``max_token_len``."""
    for index, group in enumerate(groups):
        where = f"group {index}: " if len(groups) > 1 else ""
        size = len(group.tokens)
        if group.env_id is not None and group.env_id not in known:
            raise Refused(
                422, f"{where}env_id {group.env_id} is not registered (POST /register-env)"
            )
        if size > max_group_size:
            raise Refused(422, f"{where}{size} sequences exceed max_group_size {max_group_size}")
        if size > registration["batch_size"]:
            raise Refused(
                422, f"{where}{size} sequences cannot fit a batch of {registration['batch_size']}"
            )
        longest = max(len(seq) for seq in group.tokens)
        if longest > registration["max_token_len"]:
            raise Refused(
                422,
                f"{where}a sequence has {longest} tokens, over max_token_len "
                f"{registration['max_token_len']}",
            )
