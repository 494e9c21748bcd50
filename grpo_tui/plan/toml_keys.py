"""Key paths in a profile's TOML text: how one is written (``format_key``:
``env[0].group_size``) and on which line it is defined (``KeyLines``), so that every problem
names the key and the line to fix."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

KeyPath = tuple[str | int, ...]
"""A key's place in the profile: table names, array indices, the key."""

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
