"""Seed inputs for atheris: one valid example of everything each raw target reads.

Coverage-guided fuzzing mutates from seeds; starting from a valid Change List,
envelope and frame gets it past the tokenizers in the first second.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from rsnotify import envelope
from rsnotify.model import ChangeType
from rsnotify.transport import wsproto

SPEC = Path(__file__).parent.parent / "data" / "spec"


def _notification() -> envelope.Notification:
    return envelope.Notification(
        collection="c1",
        seq=7,
        capabilitylist="http://example.com/capabilitylist.xml",
        changelist="http://example.com/changelist.xml",
        loc="http://example.com/res1",
        change=ChangeType.UPDATED,
        datetime=datetime(2013, 1, 3, 9, tzinfo=UTC),
        hash="md5:1e0d5cb8ef6ba40c99b14c0237be735e",
        length=8876,
        type="text/html",
        links=[{"rel": "duplicate", "href": "http://mirror.example.com/res1", "pri": 1}],
    )


def seeds(name: str) -> list[bytes]:
    n = _notification()
    payloads = [envelope.encode(n, "json"), envelope.encode(n, "xml")]
    if name == "sitemap":
        return [path.read_bytes() for path in sorted(SPEC.glob("example-*.xml"))]
    if name == "envelope":
        signed = [envelope.sign(p, b"fuzz-secret").encode() + b"\n" + p for p in payloads]
        return [*payloads, *signed]
    if name == "ws-server":
        tail = wsproto.notification_tail("json", payloads[0], envelope.sign(payloads[0], b"k"))
        return [
            wsproto.hello("c1", 7, 1, server="s").encode(),
            wsproto.notification_frame("c1", 7, 6, tail),
            wsproto.skipped("c1", 3, 5).encode(),
            wsproto.gap_too_old("c1", 1, 5, "http://example.com/cap.xml").encode(),
            wsproto.heartbeat("c1", 7).encode(),
            wsproto.error("bad_request", "no", collection="c1").encode(),
        ]
    if name == "ws-client":
        return [
            b"/c1?since=5&prefix=http%3A%2F%2Fexample.com%2F&change=created,deleted",
            b"/c1?access_token=secret",
            wsproto.subscribe_frame({"c1": 5, "c2": None}, prefix="http://e/").encode(),
        ]
    raise KeyError(name)


def write_corpus(name: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(seeds(name)):
        (directory / f"seed-{i}").write_bytes(data)
