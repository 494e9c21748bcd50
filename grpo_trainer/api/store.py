"""The durable state of the rollout API: one SQLite database in WAL mode.

Everything a restart must find again lives here: the trainer's registration and step, the
registered environments, every queued group (as the JSON it is served as), the leased
batches and per-environment counters. Every change is committed before its answer goes
out, so a group answered ``{"status": "received"}`` survives ``kill -9``.

Queued groups are two rows: a small one in ``groups`` (position, origin, size, lease) that
batching scans and leases update, and the served JSON in ``payloads``. A group is consumed
when its ``groups`` row is deleted; its payload row is purged afterwards, off the latency
path (``purge``), and any payload left without a group is purged at startup.

Fsync policy (``synchronous``): ``full`` (default) fsyncs the WAL on every commit, so an
acknowledged group also survives power loss or a kernel crash. ``normal`` skips that fsync:
still safe against a killed or crashed API process (the WAL is in the OS page cache), but
the last transactions can vanish on power loss. ``benchmarks/api.py`` measures both.

The store is used from one thread at a time (``StoreRunner``'s worker), which makes every
state change atomic without locks.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from grpo_trainer.api.batching import EnvShare, Pending, form_batch

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS envs (
    env_id INTEGER PRIMARY KEY,
    desired_name TEXT NOT NULL,
    real_name TEXT NOT NULL,
    weight REAL NOT NULL,
    group_size INTEGER NOT NULL,
    max_token_length INTEGER NOT NULL,
    min_batch_allocation REAL,
    connected INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS groups (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    env_id INTEGER,
    size INTEGER NOT NULL,
    batch_id TEXT,
    queued_at REAL
);
CREATE TABLE IF NOT EXISTS payloads (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS groups_batch ON groups (batch_id);
CREATE TABLE IF NOT EXISTS leases (
    batch_id TEXT PRIMARY KEY,
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    env TEXT NOT NULL,
    name TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (env, name)
);
"""

NO_ENV = "none"
"""Counter label for groups posted without an ``env_id``."""


@dataclass(frozen=True)
class EnvRecord:
    """A registered environment, as stored."""

    env_id: int
    desired_name: str
    real_name: str
    weight: float
    group_size: int
    max_token_length: int
    min_batch_allocation: float | None
    connected: bool


@dataclass(frozen=True)
class Delivery:
    """A batch handed to the trainer: its groups' JSON and, when leased, its id."""

    payloads: list[bytes]
    batch_id: str | None


class Store:
    """SQLite-backed queue and run state; ``path`` may be ``:memory:`` (not durable)."""

    def __init__(self, path: str, synchronous: Literal["full", "normal"] = "full") -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # Payloads are 0.1-1 MB: 64 KiB pages cut the overflow chains SQLite walks to write,
        # read and free them by 16x (purge 3x faster measured). Only applies to a new file.
        self.db.execute("PRAGMA page_size=65536")
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self.db.executescript(SCHEMA)
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(groups)")}
        if "queued_at" not in columns:  # a queue written before it was recorded
            self.db.execute("ALTER TABLE groups ADD COLUMN queued_at REAL")
        self.time_in_queue: float | None = None
        """Mean seconds the groups of the last batch handed out had waited (None: none yet,
        or queued by an API that did not record it)."""
        self.purge()

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One atomic change: committed (and, with ``full``, fsynced) before returning."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # ---- run state -------------------------------------------------------------------

    def meta(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def _set_meta(self, key: str, value: Any) -> None:
        self.db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )

    def registration(self) -> dict[str, Any] | None:
        return self.meta("registration")

    def current_step(self) -> int:
        return self.meta("current_step") or 0

    def started(self) -> bool:
        return bool(self.meta("started"))

    def served_version(self) -> int | None:
        """The trainer step whose weights inference serves (None: not reported)."""
        return self.meta("served_version")

    def served_model(self) -> str | None:
        """The name environments ask inference for the served weights (None: not reported)."""
        return self.meta("served_model")

    def served_incarnation(self) -> int | None:
        """The inference incarnation the trainer last pushed weights to (None: not reported)."""
        return self.meta("served_incarnation")

    def set_served_version(
        self, version: int, model: str | None = None, incarnation: int | None = None
    ) -> None:
        with self._transaction():
            self._set_meta("served_version", version)
            if model is not None:
                self._set_meta("served_model", model)
            if incarnation is not None:
                self._set_meta("served_incarnation", incarnation)

    def register_trainer(self, registration: dict[str, Any]) -> int:
        """Store the trainer's registration; its ``starting_step`` becomes the step, and the
        served version is unknown until the trainer reports it.

        A trainer that names itself (``trainer_id``) other than the one registered is its
        successor (a run has one trainer): the batches leased and never acknowledged went
        to a trainer that is gone, so they go back to the queue now, at their old places,
        instead of holding the queue's room until their lease runs out. Returns how many.
        The same trainer registering again (after an API restart) keeps its leases.
        """
        trainer_id = registration.get("trainer_id")
        before = (self.registration() or {}).get("trainer_id")
        successor = trainer_id is not None and trainer_id != before
        with self._transaction():
            self._set_meta("registration", registration)
            self._set_meta("current_step", registration["starting_step"])
            self._set_meta("served_version", None)
            if not successor:
                return 0
            leased = [row[0] for row in self.db.execute("SELECT batch_id FROM leases")]
            self._requeue(leased)
        return len(leased)

    def mark_started(self) -> None:
        if not self.started():
            with self._transaction():
                self._set_meta("started", True)

    def reset(self) -> int:
        """Forget everything (queue, envs, registration, step); returns groups dropped."""
        with self._transaction():
            dropped = self.db.execute("SELECT COUNT(*) FROM groups").fetchone()[0]
            for table in ("meta", "envs", "groups", "payloads", "leases", "counters"):
                self.db.execute(f"DELETE FROM {table}")
        self.time_in_queue = None
        return dropped

    # ---- environments ------------------------------------------------------------------

    def envs(self) -> list[EnvRecord]:
        rows = self.db.execute(
            "SELECT env_id, desired_name, real_name, weight, group_size, max_token_length, "
            "min_batch_allocation, connected FROM envs ORDER BY env_id"
        ).fetchall()
        return [EnvRecord(*row[:7], connected=bool(row[7])) for row in rows]

    def env(self, env_id: int) -> EnvRecord | None:
        return next((e for e in self.envs() if e.env_id == env_id), None)

    def add_env(
        self,
        desired_name: str,
        weight: float,
        group_size: int,
        max_token_length: int,
        min_batch_allocation: float | None,
    ) -> EnvRecord:
        with self._transaction():
            env_id, same_name = self.db.execute(
                "SELECT COUNT(*), SUM(desired_name = ?) FROM envs", (desired_name,)
            ).fetchone()
            record = EnvRecord(
                env_id=env_id,
                desired_name=desired_name,
                real_name=f"{desired_name}_{same_name or 0}",
                weight=weight,
                group_size=group_size,
                max_token_length=max_token_length,
                min_batch_allocation=min_batch_allocation,
                connected=True,
            )
            self.db.execute(
                "INSERT INTO envs VALUES (?, ?, ?, ?, ?, ?, ?, 1)",
                (
                    record.env_id,
                    record.desired_name,
                    record.real_name,
                    record.weight,
                    record.group_size,
                    record.max_token_length,
                    record.min_batch_allocation,
                ),
            )
        return record

    def disconnect_env(self, env_id: int) -> None:
        with self._transaction():
            self.db.execute("UPDATE envs SET connected = 0 WHERE env_id = ?", (env_id,))

    # ---- queue -------------------------------------------------------------------------

    def add_groups(self, groups: Iterable[tuple[int | None, int, bytes]]) -> int:
        """Queue ``(env_id, size, payload)`` groups in one transaction; returns the count."""
        rows = list(groups)
        per_env: dict[str, int] = {}
        for env_id, _, _ in rows:
            label = NO_ENV if env_id is None else str(env_id)
            per_env[label] = per_env.get(label, 0) + 1
        now = time.time()
        with self._transaction():
            for env_id, size, body in rows:
                seq = self.db.execute(
                    "INSERT INTO groups (env_id, size, queued_at) VALUES (?, ?, ?)",
                    (env_id, size, now),
                ).lastrowid
                self.db.execute("INSERT INTO payloads (seq, body) VALUES (?, ?)", (seq, body))
            self._bump("received", per_env)
        return len(rows)

    def count_dropped(self, env_id: int | None, groups: int) -> None:
        """Record groups refused at validation, for ``/metrics``."""
        with self._transaction():
            self._bump("dropped", {NO_ENV if env_id is None else str(env_id): groups})

    def _bump(self, name: str, per_env: dict[str, int]) -> None:
        self.db.executemany(
            "INSERT INTO counters (env, name, value) VALUES (?, ?, ?) "
            "ON CONFLICT(env, name) DO UPDATE SET value = value + excluded.value",
            [(env, name, n) for env, n in per_env.items()],
        )

    def counters(self) -> dict[tuple[str, str], int]:
        rows = self.db.execute("SELECT env, name, value FROM counters").fetchall()
        return {(env, name): value for env, name, value in rows}

    def pending(self) -> list[Pending]:
        """Queued groups not in a live batch, oldest first."""
        rows = self.db.execute(
            "SELECT seq, env_id, size FROM groups WHERE batch_id IS NULL ORDER BY seq"
        ).fetchall()
        return [Pending(*row) for row in rows]

    def leased_batches(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM leases").fetchone()[0]

    def expire_leases(self, now: float | None = None) -> int:
        """Put the groups of expired leases back in the queue, at their old positions."""
        now = time.time() if now is None else now
        expired = [
            row[0]
            for row in self.db.execute(
                "SELECT batch_id FROM leases WHERE expires <= ?", (now,)
            ).fetchall()
        ]
        if not expired:
            return 0
        with self._transaction():
            self._requeue(expired)
        return len(expired)

    def _requeue(self, batch_ids: Sequence[str]) -> None:
        """Put the groups of the leased batches ``batch_ids`` back in the queue at their old
        positions and end the leases (inside a transaction)."""
        for batch_id in batch_ids:
            self.db.execute("UPDATE groups SET batch_id = NULL WHERE batch_id = ?", (batch_id,))
            self.db.execute("DELETE FROM leases WHERE batch_id = ?", (batch_id,))

    def take_batch(self, batch_size: int, lease: float | None) -> Delivery | None:
        """Cut the next batch; plain delivery consumes it now, a lease holds it until ack.

        Plain delivery advances the step in the same transaction that removes the groups.
        """
        self.expire_leases()
        shares = [
            EnvShare(e.env_id, e.weight, e.min_batch_allocation, e.connected) for e in self.envs()
        ]
        picked = form_batch(self.pending(), batch_size, shares)
        if picked is None:
            return None
        seqs = [p.seq for p in picked]
        self._time_in_queue(seqs)
        batch_id = uuid.uuid4().hex
        with self._transaction():
            payloads = self._payloads(seqs)
            if lease is None:
                self._consume(seqs)
            else:
                self.db.executemany(
                    "UPDATE groups SET batch_id = ? WHERE seq = ?", [(batch_id, s) for s in seqs]
                )
                self.db.execute(
                    "INSERT INTO leases (batch_id, expires) VALUES (?, ?)",
                    (batch_id, time.time() + lease),
                )
        return Delivery(payloads=payloads, batch_id=None if lease is None else batch_id)

    def _time_in_queue(self, seqs: Sequence[int]) -> None:
        """Record how long the groups ``seqs`` waited, on their way out (a group whose lease
        expired counts from its first arrival)."""
        marks = ",".join("?" * len(seqs))
        queued = [
            row[0]
            for row in self.db.execute(
                f"SELECT queued_at FROM groups WHERE seq IN ({marks})", list(seqs)
            ).fetchall()
            if row[0] is not None
        ]
        if queued:
            self.time_in_queue = time.time() - sum(queued) / len(queued)

    def ack(self, batch_id: str) -> Literal["acked", "expired", "unknown"]:
        """Consume a leased batch: its groups are gone for good and the step advances."""
        row = self.db.execute(
            "SELECT expires FROM leases WHERE batch_id = ?", (batch_id,)
        ).fetchone()
        if row is None:
            return "unknown"
        if row[0] <= time.time():
            self.expire_leases()
            return "expired"
        seqs = [
            r[0]
            for r in self.db.execute(
                "SELECT seq FROM groups WHERE batch_id = ? ORDER BY seq", (batch_id,)
            ).fetchall()
        ]
        with self._transaction():
            self._consume(seqs)
            self.db.execute("DELETE FROM leases WHERE batch_id = ?", (batch_id,))
        return "acked"

    def _payloads(self, seqs: Sequence[int]) -> list[bytes]:
        marks = ",".join("?" * len(seqs))
        rows = self.db.execute(
            f"SELECT body FROM payloads WHERE seq IN ({marks}) ORDER BY seq", list(seqs)
        ).fetchall()
        return [row[0] for row in rows]

    def _consume(self, seqs: Sequence[int]) -> None:
        """Delete served groups, count them per env and advance the step (inside a txn)."""
        marks = ",".join("?" * len(seqs))
        per_env: dict[str, int] = {}
        for (env_id,) in self.db.execute(
            f"SELECT env_id FROM groups WHERE seq IN ({marks})", list(seqs)
        ).fetchall():
            label = NO_ENV if env_id is None else str(env_id)
            per_env[label] = per_env.get(label, 0) + 1
        self.db.execute(f"DELETE FROM groups WHERE seq IN ({marks})", list(seqs))
        self._bump("served", per_env)
        self._set_meta("current_step", self.current_step() + 1)

    def purge(self) -> int:
        """Delete payloads of consumed groups (kept out of the delivery transaction)."""
        with self._transaction():
            return self.db.execute(
                "DELETE FROM payloads WHERE seq NOT IN (SELECT seq FROM groups)"
            ).rowcount
