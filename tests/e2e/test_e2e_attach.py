"""Inference that outlives a run (issue 37), on CPU with the built-in server, through the
real commands (``grpo-tui serve``, ``grpo-tui run --inference-url``, ``grpo-tui check``):

- a kept server takes two runs in a row, each reset to the base at its start and leaving
  the base served at its end: the server's logprobs after each run are the base's to the
  bit, and the second run, started on a server left as a crashed run leaves it (other
  weights, an adapter, generation paused), samples its first groups at exactly its
  trainer's (base) weights; ``serve`` prints the URL and stops in order on
  Ctrl-C with exit 0;
- the external server killed mid-run: the run waits, the stall is named "inference at URL
  unreachable since ...", and once the server is back the trainer re-attaches by itself
  (no restart of its own) and the run ends with every step trained; the run never
  signals the server;
- the lease: a run that crashed holds the server until its lease expires, ``check`` names
  it meanwhile;
- bad input: each refusal of ``check`` (nothing answers, another model, a capability the
  mode needs, another run's lease, a mode that restarts inference), exit 2, nothing started.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_stack import (
    REPO,
    HeadlessCli,
    events,
    free_port,
    pids,
    quickstart_copy,
    run_id_of,
    tagged,
    trainer_steps,
    wait_until,
)
from peft import LoraConfig, get_peft_model

from grpo_trainer.models import build_tiny_model, load_model
from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.lease import LEASE_PATH
from grpo_trainer.serve.settings import InferenceSettings
from grpo_tui.plan.preflight import preflight
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan

LAG0_ATOL = 1e-4
"""float32 on both sides: weights that differ show as ~1e-2, rounding as ~1e-6."""
SERVED = re.compile(r"serving (http://\S+): attach")
RUN_DEADLINE = 240.0
TTL = 20.0
"""A crashed run's lease: its renewals (every third of it) leave a check time to ask."""


def scores(url: str) -> list[float]:
    """Logprobs of a fixed text under the served base (``echo``, nothing sampled)."""
    body = {"prompt": "7 7 7 3 1 4", "max_tokens": 0, "echo": True, "logprobs": 0}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["logprobs"]["token_logprobs"][1:]


def dirty(url: str, tmp_path: Path) -> None:
    """Leave the server as a run that crashed mid-step would: other weights served, an
    adapter loaded, generation paused."""
    other = build_tiny_model(tmp_path / "other-weights", seed=7)
    adapter = tmp_path / "adapter"
    get_peft_model(load_model(other), LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(
        adapter
    )
    with httpx.Client(base_url=url, timeout=60) as http:
        rpc = {"method": "grpo_reload_weights", "kwargs": {"weights_path": str(other)}}
        assert http.post("/collective_rpc", json=rpc).status_code == 200
        load = {"lora_name": "left-behind", "lora_path": str(adapter)}
        assert http.post("/v1/load_lora_adapter", json=load).status_code == 200
        assert http.post("/pause", params={"mode": "keep"}).status_code == 200


def holder(url: str) -> str | None:
    return httpx.get(f"{url}{LEASE_PATH}", timeout=10).json()["holder"]


def attached_run(
    cli: list[HeadlessCli], profile: Path, mode: str, url: str, run_dir: Path
) -> HeadlessCli:
    """``grpo-tui run PROFILE --mode M --inference-url URL --run-dir RUN``."""
    extra = ["--inference-url", url, "--run-dir", str(run_dir)]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run = HeadlessCli(profile, mode, run_dir.with_suffix(".log"), extra=extra)
    cli.append(run)
    return run


def lag0(run_dir: Path) -> dict[int, float]:
    """Each step's mean |logprob difference| between sampler and trainer over its groups
    sampled at the weights being trained (lag 0)."""
    return {
        step: data["alignment/diff_abs_mean_lag0"]
        for step, data in trainer_steps(run_dir)
        if "alignment/diff_abs_mean_lag0" in data
    }


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_kept_server_takes_two_runs_in_a_row_each_from_the_base(
    tmp_path: Path, cli: list[HeadlessCli]
) -> None:
    profile = quickstart_copy(
        tmp_path,
        mode="shared_vllm",
        overrides={"trainer": {"training_steps": 2, "checkpoint_interval": 100, "lr": 5e-3}},
    )
    serving = HeadlessCli(profile, "shared_vllm", tmp_path / "serve.log", command="serve")
    cli.append(serving)

    def said_url() -> str | None:
        serving.check_alive()
        found = SERVED.search(serving.text())
        return found.group(1) if found else None

    url = wait_until(said_url, RUN_DEADLINE, "serve to say its URL")
    assert f"grpo-tui run {profile} --inference-url {url}" in serving.text()
    (serve_dir,) = (tmp_path / "runs").iterdir()
    serve_run = run_id_of(pids(serve_dir, "inference")[0])
    base = scores(url)

    first = tmp_path / "runs" / "first"  # none, lora_only here; shared_vllm in the kill test
    assert attached_run(cli, profile, "none", url, first).wait(RUN_DEADLINE) == 0
    trained = lag0(first)
    assert trained and all(v < LAG0_ATOL for v in trained.values()), trained
    assert scores(url) == base, "the first run left its weights served"
    assert holder(url) is None, "the first run kept its lease"

    dirty(url, tmp_path)  # as a run that crashed would leave it: no detach ran
    second = tmp_path / "runs" / "second"  # another mode on the same server
    assert attached_run(cli, profile, "lora_only", url, second).wait(RUN_DEADLINE) == 0
    started = lag0(second)
    assert 1 in started, started
    print(f"lag-0 |logprob difference|: first run {trained}, second run {started}")
    assert all(v < LAG0_ATOL for v in started.values()), "the second run began off the base"
    assert scores(url) == base
    assert holder(url) is None
    for run_dir in (first, second):
        log = (run_dir / "logs" / "inference.log").read_text()
        assert f"grpo-attach: attached to {url} (lease taken; reset: " in log, log
        assert f"grpo-attach: detached from {url}, serving the base" in log, log
        assert pids(run_dir, "inference") == [], "an external server has no pid of the run's"

    os.killpg(serving.popen.pid, signal.SIGINT)  # Ctrl-C
    assert serving.wait(timeout=60) == 0, serving.text()[-3000:]
    assert tagged(serve_run) == [], "serve left its server running"
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=2)


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A built-in server started by the test (not by any run), as a user keeps one: the
    quickstart's tiny model, sleep mode and shared weights, no LoRA."""
    root = tmp_path_factory.mktemp("kept")
    model = build_tiny_model(root / "model", seed=0)
    settings = InferenceSettings(port=free_port(), enable_lora=False)
    launch = inference_command(
        settings, mode="shared_vllm", model=str(model), shared_dir=str(root / "shared")
    )
    server = ServerProcess(launch, settings.base_url, root / "server.log")
    server.start()
    yield server
    server.stop()


def kill_server(server: ServerProcess) -> None:
    """SIGKILL the kept server (its own session, started by the test)."""
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()
    server.process = None


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_external_server_killed_and_back_the_run_waits_and_reattaches(
    tmp_path: Path, cli: list[HeadlessCli], kept: ServerProcess
) -> None:
    url = kept.base_url
    steps = 8
    profile = quickstart_copy(
        tmp_path,
        mode="shared_vllm",
        overrides={
            "run": {"stall_after": 3},
            "trainer": {"training_steps": steps, "checkpoint_interval": 100},
        },
    )
    run_dir = tmp_path / "runs" / "attached"
    run = attached_run(cli, profile, "shared_vllm", url, run_dir)

    def step() -> int:
        run.check_alive()
        found = trainer_steps(run_dir)
        return found[-1][0] if found else 0

    wait_until(lambda: step() >= 3, RUN_DEADLINE, "step 3")
    (trainer,) = pids(run_dir, "trainer")
    server_pid = kept.process.pid if kept.process else None
    kill_server(kept)

    def named_stall() -> str | None:
        run.check_alive()
        causes = [c for e in events(run_dir, "Stalled") for c in e["causes"]]
        return next((c for c in causes if f"inference at {url} unreachable since" in c), None)

    cause = wait_until(named_stall, 60, "the stall named after the unreachable server")
    assert "the run waits and attaches again when it answers" in cause
    kept.start()  # back, on the same port and shared weights
    assert run.wait(timeout=RUN_DEADLINE) == 0, run.text()[-4000:]

    assert pids(run_dir, "trainer") == [trainer], "the trainer restarted"
    assert [s for s, _ in trainer_steps(run_dir)] == list(range(1, steps + 1))
    notices = [e["message"] for e in events(run_dir, "Notice")]
    assert any(re.search(r"inference restarted \(incarnation 2\): weight path", m) for m in notices)
    after = {s: v for s, v in lag0(run_dir).items() if s > 3}
    assert after and all(v < LAG0_ATOL for v in after.values()), after
    assert kept.process is not None and kept.process.poll() is None, "the run stopped the server"
    assert server_pid != kept.process.pid
    assert holder(url) is None


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_crashed_runs_lease_expires_and_check_names_it_meanwhile(
    tmp_path: Path, cli: list[HeadlessCli], kept: ServerProcess
) -> None:
    url = kept.base_url
    profile = quickstart_copy(
        tmp_path, mode="none", overrides={"inference": {"url": url, "lease_ttl": TTL}}
    )
    run_dir = tmp_path / "runs" / "crashes"
    run = attached_run(cli, profile, "none", url, run_dir)
    wait_until(lambda: run.check_alive() or holder(url), RUN_DEADLINE, "the run's lease")
    os.kill(run.popen.pid, signal.SIGKILL)  # the supervisor crashes: nothing renews the lease
    run.popen.wait()
    assert holder(url) == f"{os.uname().nodename}:{run_dir}"
    # check's own preflight, in-process: a `grpo-tui check` subprocess took longer than
    # the lease's TTL to start on a loaded 2-core box (the lease expired before it asked)
    plan = build_plan(load_profile(profile))
    (refused,) = [p.message for p in preflight(plan) if p.key == "inference.url"]
    assert f"another run holds it: run crashes on {os.uname().nodename}" in refused
    wait_until(lambda: holder(url) is None, TTL + 5, "the crashed run's lease to expire")
    assert [p.message for p in preflight(plan) if p.key == "inference.url"] == []
    assert kept.process is not None and kept.process.poll() is None


def check(profile: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``grpo-tui check PROFILE [EXTRA]``, its output (both streams) as text."""
    return subprocess.run(
        [sys.executable, "-m", "grpo_tui", "check", str(profile), *extra],
        capture_output=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(300)
def test_check_refuses_each_bad_attach_naming_it(tmp_path: Path, kept: ServerProcess) -> None:
    url = kept.base_url

    def problems(mode: str, **tables: dict) -> list[str]:
        overrides = {**tables, "inference": {"url": url, **tables.get("inference", {})}}
        plan = build_plan(load_profile(quickstart_copy(tmp_path, mode=mode, overrides=overrides)))
        return [p.message for p in preflight(plan) if p.key == "inference.url"]

    assert problems("shared_vllm") == []
    assert problems("colocate") == []
    (lora,) = problems("lora_only")
    assert "mode lora_only loads adapters at runtime: it has no LoRA" in lora
    (name,) = problems("none", inference={"served_model_name": "other"})
    assert f"the server at {url}: it serves policy, not 'other'" in name
    (shape,) = problems("none", run={"tiny": {"hidden_size": 128, "num_heads": 4}})
    assert "its model has another shape: hidden_size 64 (profile: 128)" in shape
    (backend,) = problems("none", inference={"backend": "vllm"})
    assert "it is a builtin server, the profile says backend = 'vllm'" in backend

    httpx.post(f"{url}{LEASE_PATH}", json={"holder": "h:/r", "label": "run r", "ttl": 60})
    try:
        (held,) = problems("none")
        assert "another run holds it: run r (holder h:/r" in held
    finally:
        httpx.delete(f"{url}{LEASE_PATH}", params={"holder": "h:/r"})

    profile = quickstart_copy(tmp_path, mode="lora_restart", overrides={})
    offline = check(profile, tmp_path, "--profile-only", "--inference-url", url)
    assert offline.returncode == 2, offline.stdout
    assert "mode lora_restart needs an inference server this run owns" in offline.stdout
    nobody = f"http://127.0.0.1:{free_port()}"
    answer = check(profile, tmp_path, "--mode", "none", "--inference-url", nobody)
    assert answer.returncode == 2, answer.stdout
    assert f"inference.url: no inference server answers at {nobody}" in answer.stdout
    assert "nothing was started" in answer.stdout
    assert not (tmp_path / "runs").exists()
