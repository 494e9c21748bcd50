"""Wait, after the imports, for the supervisor to say that this process's dependencies are up.

A supervisor spawns a ``prestart`` process before its dependencies are ready, with
``GRPO_START_GATE=stdin``, so that its seconds of imports (torch, transformers, vLLM)
overlap theirs; it writes ``start`` on the process's stdin once every dependency's
condition holds. Without the variable (run by hand, or by another supervisor) there is
nothing to wait for.

A *standby* (a process the supervisor keeps spawned and gated for the next incarnation of
a server, so that a restart skips the imports) may be handed the command it is to run:
``start ["python", "-m", "module", "arg", ...]``, a JSON list. Its interpreter and module
must be its own; the arguments after them replace the ones it was started with.
"""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

GATE_ENV = "GRPO_START_GATE"
EXIT_GATE_CLOSED = 1
EXIT_BAD_COMMAND = 2


def wait_for_start() -> None:
    """Block until the supervisor opens the gate; exit 1 if it closes it instead (EOF: it
    stopped this start, or died). Children of this process do not inherit the gate. A
    command handed through the gate is refused (exit 2): only standbys take one."""
    if wait_for_command() is not None:
        _refuse("this program takes no new command at its start gate (it is no standby)")


def wait_for_command() -> list[str] | None:
    """``wait_for_start`` for a standby: the arguments (``sys.argv[1:]``) of the command the
    supervisor handed through the gate, or None when it handed none (run as started)."""
    if os.environ.pop(GATE_ENV, None) != "stdin":
        return None
    line = sys.stdin.readline()
    word, _, rest = line.strip().partition(" ")
    if word != "start":
        print("start gate closed before it opened: not starting", file=sys.stderr, flush=True)
        sys.exit(EXIT_GATE_CLOSED)
    if not rest:
        return None
    try:
        command = json.loads(rest)
    except json.JSONDecodeError as error:
        _refuse(f"the command at the start gate is not JSON: {error}")
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        _refuse(f"the command at the start gate must be a list of strings, got {rest[:200]}")
    own = launch_prefix()
    if command[: len(own)] != own:
        _refuse(f"a standby started as {own} cannot run {command[: len(own) + 2]}")
    return command[len(own) :]


def launch_prefix() -> list[str]:
    """How this process was started, up to its arguments: ``[python, -m, module]`` (or
    ``[python, script]``), from ``sys.orig_argv`` less ``sys.argv[1:]``."""
    return sys.orig_argv[: len(sys.orig_argv) - len(sys.argv) + 1]


def _refuse(reason: str) -> NoReturn:
    print(f"error: {reason}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_COMMAND)
