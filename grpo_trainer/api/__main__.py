"""``python -m grpo_trainer.api``: serve the rollout API (flags mirror ``ApiSettings``).

Exits 2 with the offending key when the settings are invalid (for example a non-loopback
``--host`` without ``--token`` / ``GRPO_API_TOKEN``), before opening anything.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from grpo_trainer.api.app import create_app
from grpo_trainer.api.runner import StoreRunner
from grpo_trainer.api.settings import MEMORY_DB, TOKEN_ENV, ApiSettings
from grpo_trainer.api.store import Store
from grpo_trainer.stop_signal import exit_zero_on_stop


def parse_settings(argv: list[str] | None = None) -> ApiSettings:
    """Flags -> validated settings; argparse exits 2 on unknown flags or bad numbers."""
    defaults = ApiSettings()
    parser = argparse.ArgumentParser(
        prog="python -m grpo_trainer.api",
        description="Rollout API: Atropos-compatible, durable queue of scored rollout groups.",
    )
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument(
        "--db", required=True, help=f"SQLite queue file in the run dir, or {MEMORY_DB}"
    )
    parser.add_argument("--token", default=None, help=f"bearer token (or env {TOKEN_ENV})")
    parser.add_argument("--max-batches-offpolicy", type=int, default=defaults.max_batches_offpolicy)
    parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    parser.add_argument("--max-group-size", type=int, default=defaults.max_group_size)
    parser.add_argument("--max-lease-seconds", type=float, default=defaults.max_lease_seconds)
    parser.add_argument("--synchronous", choices=["full", "normal"], default=defaults.synchronous)
    parser.add_argument("--cors-origin", action="append", default=[], dest="cors_origins")
    args = parser.parse_args(argv)
    values = vars(args)
    values["token"] = values["token"] or os.environ.get(TOKEN_ENV) or None
    try:
        return ApiSettings(**values)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            key = ".".join(str(p) for p in error["loc"]) or "settings"
            print(f"grpo_trainer.api: invalid {key}: {error['msg']}", file=sys.stderr)
        raise SystemExit(2) from exc


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    exit_zero_on_stop()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    db = str(settings.db)
    if db != MEMORY_DB:
        Path(db).parent.mkdir(parents=True, exist_ok=True)
    store = Store(db, settings.synchronous)
    logging.getLogger("grpo_trainer.api").info(
        "queue %s: %d groups pending, step %d, synchronous=%s",
        db,
        len(store.pending()),
        store.current_step(),
        settings.synchronous,
    )
    runner = StoreRunner(store)
    app = create_app(settings, runner)
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", access_log=False)
    finally:
        runner.close()


if __name__ == "__main__":
    main()
