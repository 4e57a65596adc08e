"""A network namespace for the subscribers, joined to the host by a veth pair.

The broker, the publisher's WebSocket gateway and the simulator listen on the
host end's address; the subscribers run inside the namespace
(``ip netns exec``) and reach them only over the veth.  :meth:`Link.cut`
installs a ``blackhole`` qdisc on both ends' egress (``netem loss 100%``
does the same but this machine's kernel has no ``sch_netem``): packets vanish
silently, with no RST or FIN, so each side holds a half-open connection that
only MQTT keepalive, WebSocket pings or the heartbeat timeout can expose.
:meth:`Link.restore` removes the qdiscs; TCP retransmission then resumes
whatever connection is still open.

Needs root (``ip netns``, ``tc``).  Everything is deleted in ``finally``,
including after a failed setup.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .stack import StackOptions

_CURRENT: Link | None = None


@dataclass(frozen=True)
class Link:
    namespace: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str

    def _qdisc(self, action: str, *rule: str) -> None:
        run("tc", "qdisc", action, "dev", self.host_if, "root", *rule)
        run("ip", "netns", "exec", self.namespace, "tc", "qdisc", action, "dev", self.ns_if,
            "root", *rule)  # fmt: skip

    def cut(self) -> None:
        self._qdisc("add", "blackhole")

    def restore(self) -> None:
        self._qdisc("del")


def run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")


def current() -> Link | None:
    """The link of the :func:`isolated` block in progress, for the partition scenario."""
    return _CURRENT


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    try:
        run("ip", "netns", "list")
        run("tc", "-V")
    except (OSError, RuntimeError) as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def isolated(workdir: Path) -> Iterator[StackOptions]:
    """Make the namespace and veth pair; yield stack options that use them."""
    global _CURRENT
    tag = f"{os.getpid() % 100000}"
    subnet = 200 + os.getpid() % 50
    link = Link(
        namespace=f"rsn-chaos-{tag}",
        host_if=f"rsc{tag}h",
        ns_if=f"rsc{tag}s",
        host_ip=f"10.231.{subnet}.1",
        ns_ip=f"10.231.{subnet}.2",
    )
    try:
        run("ip", "netns", "add", link.namespace)
        run("ip", "link", "add", link.host_if, "type", "veth", "peer", "name", link.ns_if)
        run("ip", "link", "set", link.ns_if, "netns", link.namespace)
        run("ip", "addr", "add", f"{link.host_ip}/24", "dev", link.host_if)
        run("ip", "link", "set", link.host_if, "up")
        inside = ("ip", "netns", "exec", link.namespace)
        run(*inside, "ip", "addr", "add", f"{link.ns_ip}/24", "dev", link.ns_if)
        run(*inside, "ip", "link", "set", link.ns_if, "up")
        run(*inside, "ip", "link", "set", "lo", "up")
        _CURRENT = link
        yield StackOptions(
            host=link.host_ip,
            subscriber_wrapper=list(inside),
            # Publisher heartbeats come every second: 5 s without one is a dead link.
            subscriber_args=["--heartbeat-timeout", "5"],
        )
    finally:
        _CURRENT = None
        with contextlib.suppress(RuntimeError, OSError):
            run("ip", "link", "del", link.host_if)  # deletes its peer too
        with contextlib.suppress(RuntimeError, OSError):
            run("ip", "netns", "del", link.namespace)
