"""Bad input gets a 4xx that says why, the queue stays as it was, the server stays healthy."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_helpers import TRAINER, ApiServer, env_registration, group, start_run

from grpo_trainer.api.__main__ import parse_settings


def _queue(api: httpx.Client) -> tuple[int, int]:
    status = api.get("/status").json()
    return status["queue_size"], status["current_step"]


def _refused(answer: httpx.Response, status: int, *words: str) -> None:
    assert answer.status_code == status, answer.text
    detail = json.dumps(answer.json()["detail"])
    for word in words:
        assert word in detail, f"{word!r} not in {detail}"


@pytest.fixture
def running(api: httpx.Client) -> httpx.Client:
    """A registered run with one group queued, so that 'untouched' is checkable."""
    start_run(api)
    assert api.post("/scored_data", json=group(1)).json() == {"status": "received"}
    return api


def _bad_groups() -> dict[str, tuple[Any, tuple[str, ...]]]:
    good = group(2)
    return {
        "tokens not ints": ({**good, "tokens": [["a", "b", "c", "d"]] * 4}, ("tokens",)),
        "scores not numbers": ({**good, "scores": ["high"] * 4}, ("scores",)),
        "env_id as string": ({**good, "env_id": "0"}, ("env_id",)),
        "masks length": ({**good, "masks": [[1, 2]] * 4}, ("masks[0]", "tokens[0]")),
        "scores count": ({**good, "scores": [1.0]}, ("scores has 1 entries",)),
        "logprobs length": (
            {**good, "inference_logprobs": [[0.0]] * 4},
            ("inference_logprobs[0]",),
        ),
        "no sequences": ({**good, "tokens": [], "masks": [], "scores": []}, ("tokens",)),
        "empty sequence": (
            {**good, "tokens": [[]] * 4, "masks": [[]] * 4, "inference_logprobs": None},
            ("tokens[0] is empty",),
        ),
        "missing masks": ({k: v for k, v in good.items() if k != "masks"}, ("masks",)),
        "message without role": (
            {**good, "messages": [[{"content": "x"}]] * 4},
            ("role",),
        ),
        "unknown env_id": ({**good, "env_id": 99}, ("env_id 99",)),
        "group larger than a batch": (group(3, size=12), ("cannot fit a batch of 8",)),
        "sequence over max_token_len": (
            {**good, "tokens": [[1] * 40] * 4, "masks": [[1] * 40] * 4, "inference_logprobs": None},
            ("max_token_len 32",),
        ),
    }


@pytest.mark.parametrize("case", sorted(_bad_groups()))
def test_bad_group_is_refused_with_reason_and_nothing_queued(running: httpx.Client, case: str):
    body, words = _bad_groups()[case]
    before = _queue(running)
    _refused(running.post("/scored_data", json=body), 422, *words)
    _refused(running.post("/scored_data_list", json=[group(5), body]), 422, *words)
    assert _queue(running) == before
    assert running.get("/health").status_code == 200


def test_non_finite_score_is_refused(running: httpx.Client) -> None:
    body = json.dumps(group(2)).replace("[0.0, 1.0, 0.0, 1.0]", "[NaN, 1.0, 0.0, 1.0]")
    headers = {"Content-Type": "application/json"}
    answer = running.post("/scored_data", content=body, headers=headers)
    assert answer.status_code in (400, 422) and "scores" in answer.text
    assert _queue(running) == (1, 0)


def test_many_errors_are_summarised(running: httpx.Client) -> None:
    body = {**group(2), "tokens": [["x"] * 4] * 4}
    detail = running.post("/scored_data", json=body).json()["detail"]
    assert detail.count("tokens.") == 10 and detail.endswith("... and 6 more")


def test_malformed_json_is_refused(running: httpx.Client) -> None:
    headers = {"Content-Type": "application/json"}
    _refused(running.post("/scored_data", content=b'{"tokens": [[1,', headers=headers), 400, "JSON")
    _refused(running.post("/scored_data_list", content=b"nope", headers=headers), 400, "JSON")
    _refused(running.post("/scored_data", content=b"", headers=headers), 400, "empty body")
    answer = running.post("/register", content=b"{bad", headers=headers)
    assert answer.status_code == 422 and "json" in answer.text.lower()
    assert _queue(running) == (1, 0)


def test_wrong_types_on_control_endpoints(running: httpx.Client) -> None:
    _refused(running.post("/register", json={**TRAINER, "batch_size": "eight"}), 422, "batch_size")
    _refused(running.post("/register", json={**TRAINER, "batch_size": 0}), 422, "batch_size")
    _refused(
        running.post("/register-env", json={**env_registration(), "weight": "heavy"}), 422, "weight"
    )
    _refused(
        running.post("/register-env", json=env_registration(min_batch_allocation=2)),
        422,
        "min_batch_allocation",
    )
    _refused(running.post("/disconnect-env", json={"env_id": "zero"}), 422, "env_id")
    _refused(running.post("/batch/ack", json={}), 422, "batch_id")
    for bad in ({}, {"version": -1}, {"version": "3"}, {"version": 2.5}):
        _refused(running.post("/served-version", json=bad), 422, "version")
    assert running.get("/info").json() == {"batch_size": 8, "max_token_len": 32}
    assert _queue(running) == (1, 0)


def test_unknown_env_id_on_env_endpoints(running: httpx.Client) -> None:
    _refused(running.get("/status-env", params={"env_id": 7}), 404, "env_id 7")
    _refused(running.request("GET", "/status-env", json={"env_id": 7}), 404, "env_id 7")
    _refused(running.post("/disconnect-env", json={"env_id": 7}), 404, "env_id 7")
    _refused(running.post("/batch/ack", json={"batch_id": "nope"}), 404, "nope")


def test_bad_leases(running: httpx.Client) -> None:
    _refused(running.get("/batch", params={"lease": -1}), 422, "lease")
    refused = running.get("/batch", params={"lease": 10**9})  # over max_lease_seconds
    _refused(refused, 422, "lease", "less than or equal to 3600")
    _refused(running.get("/batch", params={"lease": "soon"}), 422, "lease")
    assert _queue(running) == (1, 0)


def test_min_allocations_over_one_are_refused(running: httpx.Client) -> None:
    ok = running.post("/register-env", json=env_registration("a", min_batch_allocation=0.75))
    assert ok.json()["status"] == "success"
    _refused(
        running.post("/register-env", json=env_registration("b", min_batch_allocation=0.5)),
        422,
        "exceeds 1",
    )


def test_requests_before_register(api: httpx.Client) -> None:
    _refused(api.post("/scored_data", json=group(1, env_id=None)), 409, "POST /register")
    _refused(api.get("/batch"), 409, "POST /register")
    assert api.post("/register-env", json=env_registration()).json() == {
        "status": "wait for trainer to start"
    }
    assert api.get("/status").json()["queue_size"] == 0


def test_gzip_bomb_and_bad_gzip(running: httpx.Client) -> None:
    bomb = gzip.compress(b"[" + b" " * 50_000_000 + b"]", compresslevel=9)
    assert len(bomb) < 100_000
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    _refused(running.post("/scored_data", content=bomb, headers=headers), 413, "inflates")
    _refused(running.post("/scored_data", content=b"not gzip", headers=headers), 400, "gzip")
    truncated = gzip.compress(json.dumps(group(2)).encode())[:-20]
    _refused(running.post("/scored_data", content=truncated, headers=headers), 400, "gzip")
    _refused(
        running.post("/scored_data", content=b"{}", headers={"Content-Encoding": "br"}),
        415,
        "br",
    )
    assert _queue(running) == (1, 0)
    assert running.get("/health").status_code == 200


def test_huge_bodies(running: httpx.Client) -> None:
    huge = group(2, size=4)
    huge["padding"] = "x" * 300_000
    _refused(running.post("/scored_data", json=huge), 413, "200000")

    def chunks():
        for _ in range(40):
            yield b" " * 10_000

    streamed = running.post("/scored_data", content=chunks())
    _refused(streamed, 413, "over the limit")
    assert _queue(running) == (1, 0)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A server with a token and one allowed browser origin."""
    root = tmp_path_factory.mktemp("guarded")
    flags = ["--token", "s3cret", "--cors-origin", "http://dash.local"]
    server = ApiServer(root / "rollouts.db", root / "api.log", flags).start()
    yield server
    server.kill(signal.SIGTERM)


def test_token_is_required_on_every_request(guarded: ApiServer) -> None:
    with guarded.client() as anonymous:
        _refused(anonymous.get("/status"), 401, "Bearer")
        _refused(anonymous.post("/register", json=TRAINER), 401, "Bearer")
        assert anonymous.get("/health").status_code == 200
    with guarded.client(headers={"Authorization": "Bearer wrong"}) as wrong:
        _refused(wrong.get("/info"), 401, "wrong")
    with guarded.client(headers={"Authorization": "Bearer s3cret"}) as holder:
        assert holder.post("/register", json=TRAINER).status_code == 200
        assert holder.get("/info").json()["batch_size"] == 8


def test_cors_only_for_listed_origins(guarded: ApiServer) -> None:
    with guarded.client(headers={"Authorization": "Bearer s3cret"}) as client:
        listed = client.get("/status", headers={"Origin": "http://dash.local"})
        other = client.get("/status", headers={"Origin": "http://evil.example"})
    assert listed.headers["access-control-allow-origin"] == "http://dash.local"
    assert "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--max-body-bytes", "10"], "max_body_bytes"),
        (["--cors-origin", "*"], "cors_origins"),
        (["--port", "http"], "--port"),
        (["--synchronous", "sometimes"], "--synchronous"),
    ],
)
def test_bad_settings_exit_2_naming_the_key(
    capsys: pytest.CaptureFixture[str], flags: list[str], key: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--db", ":memory:", *flags])
    assert exited.value.code == 2
    assert key in capsys.readouterr().err


def test_open_host_without_token_refuses_to_start(tmp_path) -> None:
    db = str(tmp_path / "q.db")
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_trainer.api", "--host", "0.0.0.0", "--db", db],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert "host" in proc.stderr and "token" in proc.stderr
    assert not (tmp_path / "q.db").exists()


def test_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_API_TOKEN", "from-env")
    settings = parse_settings(["--host", "10.0.0.5", "--db", ":memory:"])
    assert settings.token is not None and settings.token.get_secret_value() == "from-env"
    assert "from-env" not in settings.argv()
