"""Port preflight: refuse to start a process whose port is already held, and say by whom."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class PortHolder:
    """Who listens on a port; ``pid`` is None when the holder belongs to another user."""

    port: int
    pid: int | None
    cmdline: str

    def describe(self) -> str:
        if self.pid is None:
            return f"port {self.port} is in use (holder not visible: another user's process)"
        return f"port {self.port} is in use by pid {self.pid} ({self.cmdline})"


def find_port_holder(port: int) -> PortHolder | None:
    """The process listening on TCP ``port`` (any address), or None when the port is free."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        connections = []
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return PortHolder(port, conn.pid, _cmdline(conn.pid))
    if _bind_fails(port):
        return PortHolder(port, None, "")
    return None


def _cmdline(pid: int | None) -> str:
    if pid is None:
        return ""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return "?"


def _bind_fails(port: int) -> bool:
    """Catch holders that ``net_connections`` cannot see (other network namespaces, races)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False
