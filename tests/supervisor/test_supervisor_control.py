"""The control socket: metrics, events and requests from a real child over a Unix socket."""

from __future__ import annotations

import json
import signal

from conftest import child, free_port, spec

from grpo_tui.supervisor.events import (
    MetricsRecord,
    Notice,
    ProbeResult,
    RequestReceived,
    ResourceSample,
    State,
    StateChanged,
)
from grpo_tui.supervisor.samplers import TokenRate, generation_tokens
from grpo_tui.supervisor.spec import TcpProbe


async def test_metrics_events_and_requests_round_trip(supervise) -> None:
    port = free_port()
    seen: list[tuple[str, dict]] = []

    def server(delay: str) -> object:
        return spec(
            "server",
            child("listener.py", "--port", port, "--delay", delay),
            role="inference",
            readiness=TcpProbe(port=port, period=0.05),
        )

    def respec(name: str, args: dict) -> object:
        seen.append((name, dict(args)))
        return server(str(args["delay"]))

    requests = [
        {"type": "request", "id": "s1", "action": "status"},
        {
            "type": "request",
            "id": "r1",
            "action": "restart",
            "role": "inference",
            "args": {"delay": 0.3},
        },
        {"type": "request", "id": "x1", "action": "explode"},
    ]
    reporter = spec(
        "reporter",
        child("reporter.py", *(json.dumps(r) for r in requests)),
        readiness={"kind": "log_line", "pattern": "reporter done"},
        depends_on={"server": {}},
    )
    h = supervise([server("0"), reporter], respec=respec)
    await h.until(lambda e: isinstance(e, Notice) and "hello from reporter" in e.message)
    await h.until(lambda e: isinstance(e, ResourceSample) and e.process == "server")
    await h.state("reporter", "ready", timeout=30)

    records = [e for e in h.events if isinstance(e, MetricsRecord) and e.process == "reporter"]
    assert [(r.step, r.data) for r in records] == [(1, {"loss": 0.5}), (2, {"loss": 0.25})]
    assert h.sup.metrics.series("loss")[-1][1:] == (2, 0.25)
    assert h.sup.metrics.latest()["loss"] == 0.25
    lines = (h.sup.run_dir / "metrics.jsonl").read_text().splitlines()
    assert sum('"process": "reporter"' in line for line in lines) == 2
    assert any(isinstance(e, Notice) and "bad record from reporter" in e.message for e in h.events)

    replies = {}
    for line in h.sup.recent_lines("reporter"):
        if line.startswith("reply "):
            reply = json.loads(line.removeprefix("reply "))
            replies[reply["id"]] = reply
    assert replies["s1"]["ok"] and replies["s1"]["result"]["processes"]["server"] == "ready"
    assert replies["r1"]["ok"] and replies["r1"]["result"]["state"] == "ready"
    changes = [e for e in h.events if isinstance(e, StateChanged) and e.process == "server"]
    readied = [(e.pid, e.incarnation) for e in changes if e.new == "ready"]
    assert [n for _, n in readied] == [1, 2], "each incarnation gets the next number"
    restarted = replies["r1"]["result"]
    assert (restarted["pid"], restarted["incarnation"]) == readied[1], (
        "the reply names the incarnation the restart started"
    )
    assert seen == [("server", {"delay": 0.3})]
    assert not replies["x1"]["ok"] and "unknown action" in replies["x1"]["error"]
    asked = [e for e in h.events if isinstance(e, RequestReceived)]
    assert [(e.process, e.action, e.target) for e in asked][:2] == [
        ("reporter", "status", None),
        ("reporter", "restart", "inference"),
    ]


def test_generation_tokens_are_summed_over_label_sets() -> None:
    text = (
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{model_name="a"} 100.0\n'
        'vllm:generation_tokens_total{model_name="b"} 20\n'
        "vllm:generation_tokens_total_created 5\n"
    )
    assert generation_tokens(text) == 120.0
    assert generation_tokens("other 1\n") is None
    rate = TokenRate()
    assert rate.update(10.0, 100.0) is None
    assert rate.update(12.0, 300.0) == 100.0
    assert rate.update(13.0, 5.0) is None  # counter reset: no negative rate


async def test_a_child_says_its_own_health(supervise) -> None:
    """A ``health`` record from a child, known by its pid: its health in ``status()`` and a
    ``ProbeResult`` of the check ``self``, without a state change; ok again when it says so."""
    worker = spec(
        "worker",
        child("health.py", "the queue is stuck"),
        readiness={"kind": "log_line", "pattern": "said failing"},
    )
    h = supervise([worker])
    await h.state("worker", "ready", timeout=30)
    said = await h.until(lambda e: isinstance(e, ProbeResult) and e.probe == "self")
    assert (said.process, said.ok, said.message) == ("worker", False, "the queue is stuck")
    status = h.sup.status()["worker"]
    assert (status.state, status.health) == (State.READY, "failing")
    assert status.failing == {"self": "the queue is stuck"}
    await h.sup.signal("worker", signal.SIGUSR1)
    await h.until(lambda e: isinstance(e, ProbeResult) and e.probe == "self" and e.ok)
    status = h.sup.status()["worker"]
    assert (status.state, status.health, status.failing) == (State.READY, "ok", {})
    assert [e.new for e in h.changes("worker")] == [State.STARTING, State.READY]
