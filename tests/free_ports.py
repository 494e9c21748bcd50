"""Free loopback ports for the servers tests start: one way, never one port twice.

``bind(("127.0.0.1", 0))`` then close gives a port nothing listens on now; the kernel may
hand the same one out again at once, so two servers of one profile (an API and its
inference server) could be given one port. CI met it. Ports given out by this process are
not given again.
"""

from __future__ import annotations

import socket

_given: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, not handed out before by this process."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _given:
            _given.add(port)
            return port
