"""What ``rsnotify publish`` prints once it runs: where it listens, what to advertise.

Operators (and the acceptance tests) read these lines from standard output:
the ports actually bound (``--ws 127.0.0.1:0`` picks one) and, for each
collection, the markup to put into its Capability List when the publisher
does not write it there itself (``--write-hubs``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..discovery.channels import CHANNEL_REL
from .advertisement import Advertisement

PREFIX = "rsnotify publish:"


def running_lines(
    advertisement: Advertisement,
    capability_lists: Mapping[str, str],
    *,
    metrics_port: int | None = None,
) -> list[str]:
    """The lines printed at start-up; ``capability_lists``: collection id -> its URL."""
    config = advertisement.config
    parts = [f"{len(capability_lists)} collection(s)"]
    if advertisement.ws_port is not None and config.ws is not None:
        host = config.ws.rpartition(":")[0] or "127.0.0.1"
        parts.append(f"ws://{host}:{advertisement.ws_port}/")
    if advertisement.hub is not None:
        parts.append(f"websub {advertisement.hub.url}")
    if metrics_port is not None:
        parts.append(f"metrics http://{config.metrics_host}:{metrics_port}/metrics")
    lines = [f"{PREFIX} running: {'; '.join(parts)}"]
    for cid, capability_list in capability_lists.items():
        lines.append(f"{PREFIX} collection {cid} {capability_list}")
        for href in advertisement.hub_links(cid):
            lines.append(f'{PREFIX}   advertise <rs:ln rel="{CHANNEL_REL}" href="{href}"/>')
        websub = advertisement.websub(cid) or advertisement.planned_websub(cid)
        channels = [
            ("change-notification", websub),
            ("framework-notification", advertisement.framework(cid)),
        ]
        for capability, channel in channels:
            if channel is not None:
                lines.append(
                    f"{PREFIX}   advertise <url><loc>{channel[0]}</loc>"
                    f'<rs:ln rel="hub" href="{channel[1]}"/>'
                    f'<rs:md capability="{capability}"/></url>'
                )
    return lines


def say(line: str) -> None:
    """Print one line at once (a supervisor or a test waits for it)."""
    print(line, flush=True)
