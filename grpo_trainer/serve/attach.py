"""Attaching a run to a server it does not own, and letting it go (issue 37).

``python -m grpo_trainer.serve.attach attach|detach URL --holder ID --base MODEL`` is what
the supervisor runs for a run with ``[inference] url`` (``grpo_tui/supervisor/external.py``):

- ``attach``, at each start of the external process (and each time the server is back
  after a loss): wait for ``/health`` (a few seconds), take or renew the run's lease, and
  at the run's first attach reset the server to the run's base (:func:`reset_to_base`);
  the last line it prints (``ATTACHED``) is the supervisor's readiness;
- ``detach``, once, at the run's end: reset the server to the base again and let the lease
  go; a server another run holds by then is left alone.

The reset: generation resumed and woken (a run that crashed may have left it paused or
asleep), every adapter unloaded, the base's weights reloaded in place, the prefix cache
reset: a run starts, and leaves the server, on the base whatever the run before it trained.
The lease routes are ``serve/lease.py``'s.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

import httpx

from grpo_trainer.run_notices import INFERENCE_FILE, run_dir
from grpo_trainer.serve.external import (
    PROBE_TIMEOUT,
    RELOAD_METHOD,
    ServerFacts,
    Unreachable,
    describe,
    get,
    held_by,
    json_of,
)
from grpo_trainer.serve.lease import DEFAULT_TTL, LEASE_PATH
from grpo_trainer.serve.settings import inference_headers

ATTACHED = "grpo-attach: attached to"
"""The line the attach command prints last: the supervisor's readiness for the server."""
STOPPED = 143
"""The commands' exit status when stopped by a signal (128 + SIGTERM)."""
RELOAD_TIMEOUT = 600.0
"""Seconds a reload of the base may take (a large model from disk)."""


class LeaseHeld(RuntimeError):
    """Another run holds the server's lease; the message names it."""


# ------------------------------------------------------------------------------ lease


def take_lease(http: httpx.Client, holder: str, label: str, ttl: float = DEFAULT_TTL) -> None:
    """Take or renew the lease; ``LeaseHeld`` naming the holder when another run has it,
    ``Unreachable`` when the server does not answer (or keeps no lease)."""
    try:
        answer = http.post(LEASE_PATH, json={"holder": holder, "label": label, "ttl": ttl})
    except httpx.HTTPError as error:
        raise Unreachable(f"{type(error).__name__}: {error}") from None
    if answer.status_code == 409:
        raise LeaseHeld(f"another run holds the server: {held_by(answer.json())}")
    if answer.status_code != 200:
        raise Unreachable(f"POST {LEASE_PATH} answered {answer.status_code}: {answer.text[:200]}")


def release_lease(http: httpx.Client, holder: str) -> None:
    """Let the lease go (nothing when another holds it or the server is gone)."""
    try:
        http.delete(LEASE_PATH, params={"holder": holder})
    except httpx.HTTPError:
        return


# ------------------------------------------------------------------------------ reset


def _post(http: httpx.Client, path: str, what: str, **kwargs: Any) -> httpx.Response:
    try:
        answer = http.post(path, **kwargs)
    except httpx.HTTPError as error:
        raise Unreachable(f"{what}: {type(error).__name__}: {error}") from None
    if answer.status_code >= 400:
        said = f"{answer.status_code}: {answer.text[:300]}"
        raise RuntimeError(f"{what}: POST {path} answered {said}")
    return answer


def reset_to_base(http: httpx.Client, facts: ServerFacts, base: str) -> list[str]:
    """Serve ``base`` as a fresh server would: generation resumed and awake (a run that
    crashed may have left it paused or asleep), every adapter unloaded, the base's weights
    reloaded in place, the prefix cache reset. Returns what was done, in order; raises
    ``Unreachable`` or ``RuntimeError`` naming the step that failed."""
    done: list[str] = []
    if facts.backend == "sglang":
        for name in facts.adapters:
            _post(http, "/unload_lora_adapter", f"unload {name}", json={"lora_name": name})
            done.append(f"adapter {name} unloaded")
        started = time.perf_counter()
        body = {"model_path": base, "flush_cache": True}
        route = "/update_weights_from_disk"
        _post(http, route, "reload the base", json=body, timeout=RELOAD_TIMEOUT)
        done.append(f"base {base} reloaded in {time.perf_counter() - started:.2f} s, cache flushed")
        return done
    if json_of(get(http, "/is_sleeping")).get("is_sleeping"):
        _post(http, "/wake_up", "wake up")
        done.append("woken up")
    if json_of(get(http, "/is_paused")).get("is_paused"):
        _post(http, "/resume", "resume")
        done.append("generation resumed")
    for name in facts.adapters:
        _post(http, "/v1/unload_lora_adapter", f"unload {name}", json={"lora_name": name})
        done.append(f"adapter {name} unloaded")
    started = time.perf_counter()
    _post(http, "/pause", "pause", params={"mode": "wait"})
    try:
        body = {"method": RELOAD_METHOD, "kwargs": {"weights_path": base}}
        _post(http, "/collective_rpc", "reload the base", json=body, timeout=RELOAD_TIMEOUT)
    finally:
        _post(http, "/resume", "resume")
    done.append(f"base {base} reloaded in place in {time.perf_counter() - started:.2f} s")
    _post(http, "/reset_prefix_cache", "reset the prefix cache")
    done.append("prefix cache reset")
    return done


# -------------------------------------------------------------------------- commands


def _say(message: str) -> None:
    print(message, flush=True)


def wait_healthy(http: httpx.Client, url: str, seconds: float) -> None:
    """Until ``/health`` answers 200, at most ``seconds``; ``Unreachable`` after."""
    deadline, told = time.monotonic() + seconds, False
    last = ""
    while True:
        try:
            answer = http.get("/health", timeout=2.0)
            if answer.status_code == 200:
                return
            last = f"/health answered {answer.status_code}"
        except httpx.HTTPError as error:
            last = f"{type(error).__name__}: {error}"
        if time.monotonic() >= deadline:
            raise Unreachable(last)
        if not told:
            _say(f"waiting for inference at {url} ({last})")
            told = True
        time.sleep(0.25)


def _stop_raises() -> None:
    """SIGTERM and SIGINT end the command through ``SystemExit(143)``: ``finally`` blocks
    run (a reset stopped halfway still resumes generation), and the exit says it was
    stopped."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: sys.exit(STOPPED))


def attach(args: argparse.Namespace) -> int:
    """Attach a run to the server: wait for it, take the lease, and at the run's first
    attach reset it to the base (later attaches, after the server came back, leave the
    weights to the trainer, which pushes its own: a reset then would overwrite the
    trainer's weights where they are shared with the server)."""
    url = args.url.rstrip("/")
    with httpx.Client(base_url=url, headers=inference_headers(), timeout=PROBE_TIMEOUT) as http:
        try:
            wait_healthy(http, url, args.wait)
            take_lease(http, args.holder, args.label, args.ttl)
            folder = run_dir()
            first = folder is None or not (folder / INFERENCE_FILE).exists()
            what = "lease renewed"
            if first:
                facts = describe(url, headers=inference_headers())
                done = reset_to_base(http, facts, args.base)
                what = f"lease taken; reset: {'; '.join(done)}"
        except Unreachable as error:
            print(f"inference at {url} unreachable: {error}", file=sys.stderr, flush=True)
            return 1
        except LeaseHeld as error:
            print(f"cannot attach to {url}: {error}", file=sys.stderr, flush=True)
            return 3
        except RuntimeError as error:
            print(f"cannot reset {url} to the base: {error}", file=sys.stderr, flush=True)
            return 4
    _say(f"{ATTACHED} {url} ({what})")
    return 0


def detach(args: argparse.Namespace) -> int:
    """At the run's end: leave the server serving the base, then let the lease go. A
    server another run holds now is left alone."""
    url = args.url.rstrip("/")
    with httpx.Client(base_url=url, headers=inference_headers(), timeout=PROBE_TIMEOUT) as http:
        try:
            facts = describe(url, headers=inference_headers())
            holder = (facts.lease or {}).get("holder")
            if holder not in (None, args.holder):
                _say(f"grpo-attach: {url} is another run's now ({held_by(facts.lease or {})})")
                return 0
            done = reset_to_base(http, facts, args.base)
        except (Unreachable, RuntimeError) as error:
            print(f"could not reset {url} to the base: {error}", file=sys.stderr, flush=True)
            release_lease(http, args.holder)
            return 1
        release_lease(http, args.holder)
    _say(f"grpo-attach: detached from {url}, serving the base ({'; '.join(done)}); lease let go")
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m grpo_trainer.serve.attach")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("attach", "detach"):
        command = sub.add_parser(name)
        command.add_argument("url")
        command.add_argument("--holder", required=True, help="the run's lease holder id")
        command.add_argument("--base", required=True, help="the run's base model (path or id)")
        if name == "attach":
            command.add_argument("--label", default="")
            command.add_argument("--ttl", type=float, default=DEFAULT_TTL)
            command.add_argument(
                "--wait", type=float, default=10.0, help="seconds to wait for /health"
            )
    args = parser.parse_args(argv)
    _stop_raises()
    sys.exit(attach(args) if args.command == "attach" else detach(args))


if __name__ == "__main__":
    main()
