"""The supervisor's own measurements, every couple of seconds, through ``samplers.py``.

CPU / RSS of each running process tree, GPU memory where NVML works, and from every ready
process with a ``metrics_url`` its generated tokens/s (``<name>/tokens_per_s``) and the
rollout API's gauges (``<name>/queue_groups``, ``time_in_queue_s``, ``served_version``,
``served_incarnation``: ``samplers.GAUGES``).
Samples go out as events and as one metrics record of ``"process": "supervisor"``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx

from grpo_tui.supervisor.events import MetricsRecord
from grpo_tui.supervisor.journal import Journal
from grpo_tui.supervisor.record import ProcessRecord
from grpo_tui.supervisor.samplers import Samplers, Scrape

SAMPLE_INTERVAL = 2.0


def instance(life: ProcessRecord) -> int:
    """What tells one server instance from the next: its pid, or for an external one (no
    pid of ours) its incarnation, negated so that it never equals a pid."""
    pid = life.child.pid if life.child is not None else None
    return pid if pid is not None else -life.incarnation


async def sample_forever(
    lives: Mapping[str, ProcessRecord],
    client: asyncio.Future[httpx.AsyncClient],
    journal: Journal,
) -> None:
    """Sample every ``SAMPLE_INTERVAL`` seconds until cancelled."""
    samplers = Samplers(await asyncio.shield(client))
    while True:
        running = {
            name: life.child
            for name, life in lives.items()
            if life.child is not None and life.running and life.child.pid is not None
        }
        scrape = {
            name: Scrape(life.spec.metrics_url, instance(life), life.ready_at)
            for name, life in lives.items()
            if life.spec.metrics_url and life.ready and life.child is not None
        }
        events, values = await samplers.sample(running, scrape)
        for event in events:
            journal.publish(event)
        if values:
            journal.record_metrics(MetricsRecord(process="supervisor", step=None, data=values))
        await asyncio.sleep(SAMPLE_INTERVAL)
