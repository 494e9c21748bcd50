"""Inference is healthy only if it generates (issue 35 item 6): the plan's progress probe on
the real built-in server, under a real supervisor. A server whose engine is frozen (paused
with ``keep``, as a trainer that dies between its pause and resume of a weight update
leaves it: running requests freeze between decode steps, none is admitted) answers
``/health`` and generates nothing: it is named, with what the probe saw, and restarted. A
server that generates passes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import free_port

from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.supervisor.events import ProbeResult, Restarting, State
from grpo_tui.supervisor.spec import HttpProbe, ProcessSpec

QUICKSTART = Path(__file__).resolve().parents[2] / "profiles" / "quickstart.toml"


def quickstart_servers(tmp_path: Path) -> tuple[ProcessSpec, ProcessSpec]:
    """The quickstart's tiny-model build and built-in server, as its plan makes them (on
    free ports), the server's probes at test speed: asked for a token after 1 s idle,
    within 2 s, twice; ``/health`` every 0.2 s."""
    text = QUICKSTART.read_text().replace("port = 9001", f"port = {free_port()}")
    profile = tmp_path / "quickstart.toml"
    profile.write_text(text.replace("port = 8000", f"port = {free_port()}"))
    specs = {s.name: s for s in build_plan(load_profile(profile), tmp_path / "run").specs}
    inference = specs["inference"]
    assert inference.progress is not None, "the plan turns the generation probe on"
    assert inference.progress.body["max_tokens"] == 1
    assert isinstance(inference.liveness, HttpProbe)
    fast = {"idle_after": 1.0, "period": 0.2, "timeout": 2.0, "failure_threshold": 2}
    liveness = inference.liveness.model_copy(update={"initial_delay": 0, "period": 0.2})
    inference = inference.model_copy(
        update={"progress": inference.progress.model_copy(update=fast), "liveness": liveness}
    )
    return specs["model"], inference


@pytest.mark.parametrize("mode", ["none", "shared_vllm", "lora_only", "lora_restart", "colocate"])
def test_the_plan_asks_inference_for_a_token_in_every_mode_but_colocate(tmp_path, mode) -> None:
    """``colocate``'s engine sleeps by design while the trainer steps: no progress probe;
    the LoRA modes serve the base under another name, which the probe asks for."""
    plan = build_plan(load_profile(QUICKSTART, mode=mode), tmp_path / "run")
    probe = next(s for s in plan.specs if s.name == "inference").progress
    if mode == "colocate":
        assert probe is None
        return
    assert probe is not None
    base = "policy-base" if mode.startswith("lora") else "policy"
    assert probe.body == {"model": base, "prompt": [0], "max_tokens": 1, "temperature": 0.0}
    assert probe.url.endswith("/v1/completions") and probe.metrics_url.endswith("/metrics")
    assert "vllm:request_success_total" in probe.counters
    assert probe.bearer_env is None  # a local run: no token


@pytest.mark.timeout(240)
async def test_a_server_whose_engine_is_frozen_is_named_and_restarted(supervise, tmp_path) -> None:
    model, inference = quickstart_servers(tmp_path)
    h = supervise([model, inference])
    await h.state("inference", State.READY, timeout=120)
    base = inference.progress.url.removesuffix("/v1/completions")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        answer = await client.post("/v1/completions", json=inference.progress.body)
        assert answer.status_code == 200, answer.text
        passed = await h.until(
            lambda e: isinstance(e, ProbeResult) and e.probe == "progress" and e.ok
        )
        assert passed.message == "asked for work after 1 s idle, it answered HTTP 200"
        first = h.sup.status()["inference"].pid
        frozen = await client.post("/pause", params={"mode": "keep"})
        assert frozen.status_code == 200, frozen.text
        restarting = await h.until(lambda e: isinstance(e, Restarting), timeout=60)
        assert restarting.process == "inference"
        assert restarting.reason.startswith("progress probe failed: no request completed for ")
        assert restarting.reason.endswith("; asked for work, it timed out after 2 s")
        unhealthy = [c for c in h.changes("inference") if c.new == State.UNHEALTHY]
        assert [c.reason for c in unhealthy] == [restarting.reason]
        liveness = [e for e in h.events if isinstance(e, ProbeResult) and e.probe == "liveness"]
        assert liveness and all(e.ok for e in liveness), "its /health answered throughout"
        await h.until(
            lambda e: (
                h.sup.status()["inference"].state == State.READY
                and h.sup.status()["inference"].pid != first
            ),
            timeout=120,
        )
        again = await client.post("/v1/completions", json=inference.progress.body)
        assert again.status_code == 200, "the restarted server generates"
    assert h.sup.status()["inference"].restarts == 1
