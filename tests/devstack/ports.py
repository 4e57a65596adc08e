"""Free loopback ports, and who really listens on one.

Every service of the tests binds ``127.0.0.1`` on a port nothing used a
moment ago: brokers already running on 1883/6379 belong to someone else and
are never touched.  A port check asks the kernel (through ``psutil``) which
process holds the listening socket, so a leftover process on a reused port
can never answer a readiness probe in place of the one just started.
"""

from __future__ import annotations

import socket

import psutil

__all__ = ["HOST", "free_port", "listens_on", "tcp_accepts"]

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago.

    The port is released before returning, so a race with another process is
    possible; services that fail to bind retry on a fresh port (see
    :meth:`Service.start`).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def listens_on(pid: int, port: int) -> bool:
    try:
        sockets = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    return any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets)


def tcp_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
