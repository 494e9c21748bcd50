"""Wait, after the imports, for the supervisor to say that this process's dependencies are up.

A supervisor spawns a ``prestart`` process before its dependencies are ready, with
``GRPO_START_GATE=stdin``, so that its seconds of imports (torch, transformers) overlap
theirs; it writes ``start`` on the process's stdin once every dependency's condition holds.
Without the variable (run by hand, or by another supervisor) there is nothing to wait for.
"""

from __future__ import annotations

import os
import sys

GATE_ENV = "GRPO_START_GATE"
EXIT_GATE_CLOSED = 1


def wait_for_start() -> None:
    """Block until the supervisor opens the gate; exit 1 if it closes it instead (EOF: it
    stopped this start, or died). Children of this process do not inherit the gate."""
    if os.environ.pop(GATE_ENV, None) != "stdin":
        return
    line = sys.stdin.readline()
    if line.strip() != "start":
        print("start gate closed before it opened: not starting", file=sys.stderr, flush=True)
        sys.exit(EXIT_GATE_CLOSED)
