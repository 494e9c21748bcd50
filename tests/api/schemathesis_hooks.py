"""Schemathesis hooks for the fuzz test (loaded through ``SCHEMATHESIS_HOOKS``).

``GET /batch`` long-polls up to ``wait`` seconds (60 at most) and holds a leased batch for
``lease`` seconds (up to max_lease_seconds): both are clamped so that a fuzz run stays
short and leases expire within it. Every other value goes through as generated.
"""

from __future__ import annotations

from typing import Any

import schemathesis

MAX_WAIT = 0.2
MAX_LEASE = 0.5


@schemathesis.hook
def map_query(context: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    if not query:
        return query
    for key, cap in (("wait", MAX_WAIT), ("lease", MAX_LEASE)):
        value = query.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > cap:
            query[key] = cap
    return query
