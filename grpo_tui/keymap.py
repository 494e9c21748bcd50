"""The user's keymap: ``binding-id = "key"`` lines in ``~/.config/grpo-tui/keymap.toml``.

Every binding of the app and its screens has an id (Posting's habit); a keymap remaps keys
by id, and one naming an unknown id or not a key string is refused before anything starts.
No textual here: the ids known come from the caller (``grpo_tui.app.binding_ids``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Set
from pathlib import Path


def default_keymap_path() -> Path:
    """``$XDG_CONFIG_HOME/grpo-tui/keymap.toml`` (``~/.config`` without the variable)."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "grpo-tui" / "keymap.toml"


class KeymapError(ValueError):
    """The user's keymap file cannot be used (its path and the reason are in the message)."""


def read_keymap(path: Path, known: Set[str]) -> dict[str, str]:
    """``binding-id = "key"`` lines of a TOML file (optionally under ``[keymap]``).

    A missing file is an empty keymap; bad TOML, a non-string key or a binding id not in
    ``known`` raises :class:`KeymapError` naming the file and the id.
    """
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise KeymapError(f"{path}: {error}") from None
    table = data.get("keymap", data)
    problems = [
        f"{path}: {key}: unknown binding id (known: {', '.join(sorted(known))})"
        for key in table
        if key not in known
    ]
    problems += [
        f"{path}: {key}: expected a key name string"
        for key, v in table.items()
        if not isinstance(v, str)
    ]
    if problems:
        raise KeymapError("\n".join(problems))
    return dict(table)
