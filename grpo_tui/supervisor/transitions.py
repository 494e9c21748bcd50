"""The table of a process life's state changes: every change is checked against it.

A process life (``lifecycle.ProcessLife``) has one state value (``events.State``) and
changes it only through ``ProcessRecord.transition``, which looks the pair up in ``EDGES``
and raises ``TransitionError`` naming the pair for one that is not there. Each edge says
what it is, in the words of ``docs/supervisor.md``, whose table is this one
(``markdown_table``; a test compares the two).

Four edges come from an operation: a start asked for (an ended state -> PENDING), a stop
asked for (a live or waiting state -> STOPPING), a kill asked for (the same, or a stop
under way, -> KILLING) and, when no life task runs, its end (STOPPING or KILLING ->
STOPPED). Every other edge is the life task's own, which looks at the state after each of
its waits: a stop or kill asked while it waited is what it acts on first.
"""

from __future__ import annotations

from grpo_tui.supervisor.events import State

EDGES: dict[State, dict[State, str]] = {
    State.PENDING: {
        State.STARTING: "spawned (or its standby adopted); a start gate or readiness probe ahead",
        State.RUNNING: "spawned; nothing to wait for",
        State.BACKOFF: "could not spawn, an error that may pass (out of memory or processes)",
        State.FAILED: "a dependency failed for good, its port is held, it cannot spawn",
        State.STOPPING: "stop asked before it was spawned",
        State.KILLING: "kill asked before it was spawned (one in flight: SIGKILLed as it comes)",
    },
    State.STARTING: {
        State.RUNNING: "start gate opened; no readiness probe",
        State.READY: "readiness probe passed",
        State.BACKOFF: "exited before it was ready: restart",
        State.COMPLETED: "exited 0 before it was ready; not restarted (policy)",
        State.FAILED: "exited before it was ready, no restart left; a dependency failed",
        State.STOPPING: "stop asked",
        State.KILLING: "kill asked",
    },
    State.RUNNING: {
        State.UNHEALTHY: "a liveness or progress probe failed: stopped to restart",
        State.BACKOFF: "exited: restart",
        State.COMPLETED: "exited 0; not restarted (policy)",
        State.FAILED: "exited, no restart left",
        State.STOPPING: "stop asked",
        State.KILLING: "kill asked",
    },
    State.READY: {
        State.UNHEALTHY: "a liveness or progress probe failed: stopped to restart",
        State.BACKOFF: "exited: restart",
        State.COMPLETED: "exited 0; not restarted (policy)",
        State.FAILED: "exited, no restart left",
        State.STOPPING: "stop asked",
        State.KILLING: "kill asked",
    },
    State.UNHEALTHY: {
        State.BACKOFF: "stopped after its probe failed: restart",
        State.FAILED: "stopped after its probe failed, no restart left",
        State.STOPPING: "stop asked while it is stopped to restart",
        State.KILLING: "kill asked while it is stopped to restart",
    },
    State.BACKOFF: {
        State.STARTING: "respawned (or its standby adopted); a start gate or readiness probe ahead",
        State.RUNNING: "respawned; nothing to wait for",
        State.BACKOFF: "could not spawn again, an error that may pass: restart later",
        State.FAILED: "no restart left, its port is held, or it cannot spawn",
        State.STOPPING: "stop asked during the backoff",
        State.KILLING: "kill asked during the backoff",
    },
    State.STOPPING: {
        State.STOPPED: "its process (if one ran) is gone",
        State.KILLING: "kill asked while it stops: the stop cut short",
    },
    State.KILLING: {
        State.STOPPED: "its process (if one ran) is gone",
    },
    State.STOPPED: {State.PENDING: "start asked"},
    State.COMPLETED: {State.PENDING: "start asked"},
    State.FAILED: {State.PENDING: "start asked"},
}
"""``EDGES[old][new]``: what the change means; a pair not here is not a change a life makes."""

ENDED = frozenset({State.COMPLETED, State.STOPPED, State.FAILED})
"""States a life ends in: only a start asked for leaves them."""
ALIVE = frozenset({State.STARTING, State.RUNNING, State.READY, State.UNHEALTHY})
"""States in which its process runs."""
STOPPING = frozenset({State.STOPPING, State.KILLING})
"""A stop (KILLING: a kill) was asked and the life has not ended yet."""


class TransitionError(RuntimeError):
    """A change the table does not have (a bug in the life's code, not a runtime fault)."""

    def __init__(self, process: str, old: State, new: State) -> None:
        super().__init__(f"{process}: {old} -> {new} is not a transition of the life's table")
        self.old = old
        self.new = new


def check(process: str, old: State, new: State) -> str:
    """What the change ``old -> new`` means; ``TransitionError`` if it is not in the table."""
    meaning = EDGES[old].get(new)
    if meaning is None:
        raise TransitionError(process, old, new)
    return meaning


def markdown_table() -> str:
    """The table as ``docs/supervisor.md`` shows it: one row per edge, in state order."""
    lines = ["| from | to | when |", "|---|---|---|"]
    for old, edges in EDGES.items():
        lines += [f"| {old} | {new} | {meaning} |" for new, meaning in edges.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
