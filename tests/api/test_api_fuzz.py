"""The rollout API under schemathesis (a kept OpenAPI fuzzer) on loopback, bounded for CI.

Every generated request against the API's own ``/openapi.json`` must get an answer the
schema declares (status, content type, body shape: no 5xx, no undeclared 400), bodies the
schema forbids must be refused, and afterwards the server is healthy and still holds the
groups it acknowledged before the fuzzing. ``positive_data_acceptance`` is left out: the
API refuses some schema-valid bodies on purpose, with a 4xx and the reason, for rules a
JSON Schema cannot state (per-token lists as long as their sequence, batch_size a multiple
of every group size, an env_id that was registered).

Run 1 fuzzes every operation but the consumers (``/reset_data``, ``/batch``,
``/batch/ack``), so the seeded groups must all come back afterwards; run 2 fuzzes the
consumers, with ``wait`` / ``lease`` clamped (``schemathesis_hooks.py``; the coverage
phase, whose boundary values skip the hooks, would long-poll 60 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from api_helpers import TRAINER, group, markers, start_run

TESTS = Path(__file__).resolve().parent
SEEDED = [901, 902, 903]


def fuzz(url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json"]
    return subprocess.run(
        [*command, "--checks", "all", "--exclude-checks", "positive_data_acceptance",
         "--max-examples", "8", "--seed", "18", "--request-timeout", "10",
         "--no-color", *args],
        capture_output=True, text=True, timeout=150, env=env, cwd=cwd,
    )  # fmt: skip


def test_schemathesis_finds_nothing_and_nothing_acknowledged_is_lost(
    start_api, tmp_path: Path
) -> None:
    server = start_api()
    with server.client() as client:
        start_run(client, batch_size=8)
        for marker in SEEDED:
            assert client.post("/scored_data", json=group(marker)).status_code == 200

    first = fuzz(
        server.url, tmp_path, "--exclude-path", "/reset_data", "--exclude-path", "/batch",
        "--exclude-path", "/batch/ack",
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]

    with server.client() as client:
        assert client.get("/health").status_code == 200
        # the fuzzed environments may reserve the whole batch (min_batch_allocation) and
        # never send a group: disconnect them all, so batches are cut from what is queued
        env_id = 1
        while client.post("/disconnect-env", json={"env_id": env_id}).status_code == 200:
            env_id += 1
        # batches are cut only when full: one seeded group (4 sequences) fills each
        assert client.post("/register", json={**TRAINER, "batch_size": 4}).status_code == 200
        served: list[int] = []
        while batch := client.get("/batch").json()["batch"]:
            served += markers(batch)
        assert set(SEEDED) <= set(served), f"acknowledged groups lost: {served}"

    # the coverage phase sends boundary values (wait=60) without the hooks: a long poll
    second = fuzz(
        server.url, tmp_path, "--include-path-regex", "^/batch", "--phases", "fuzzing,stateful"
    )
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr[-2000:]
    with server.client() as client:
        assert client.get("/health").status_code == 200
