"""MQTT topic names every mainstream broker accepts (pure).

MQTT itself allows almost any UTF-8 in a topic level (MQTT 3.1.1 section 4.7:
only ``+`` and ``#`` are wildcards, and section 4.7.2 reserves a leading
``$``), but brokers and bridges restrict more.  NATS maps topic levels onto
its subjects and disconnects a client that publishes on a topic holding ``.``
or a space ("characters ' ' and '.' not supported for MQTT topics"); AWS IoT
allows at most 8 levels and 256 bytes; Azure and others have their own lists.
Collection ids are built from host names, so they contain dots, and the first
publisher on NATS was dropped on its first PUBLISH.

The **broker-safe** names used since this module exist are made of levels of
``[A-Za-z0-9_-]`` only, each at most :data:`MAX_LEVEL` characters:

* ``<prefix>/<level>/changes`` and ``<prefix>/<level>/head``, where ``<prefix>``
  is one to :data:`MAX_PREFIX_LEVELS` such levels (``--topic-prefix``) and
  ``<level>`` is :func:`topic_level` of the collection id;
* :func:`topic_level` is the collection id itself when it is already safe and
  short enough, else its dots and other characters folded to ``-`` (shortened
  to stay readable) followed by 16 hex digits of the SHA-256 of the whole id:
  stable (a pure function of the id), bounded, and two collections share a
  level only if 64 bits of SHA-256 collide.

The **legacy** names (``<prefix>/<collection id>/...``) are still what a
publisher started with ``--legacy-topics`` writes, and what subscribers and
the dashboard read beside the safe names, so a deployment keeps working while
its parts are upgraded in any order (README, "MQTT topic names").
"""

from __future__ import annotations

import argparse
import hashlib
import re
from dataclasses import dataclass

from ..errors import InvalidTopic

MAX_LEVEL = 64
MAX_PREFIX_LEVELS = 4
MAX_PREFIX_CHARS = 128
#: What every broker we know of accepts in a topic level (letters, digits, ``-``, ``_``).
SAFE_LEVEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FOLD = re.compile(r"[^a-z0-9]+")
_READABLE = 40  # characters of the folded id kept before the digest
DIGEST_HEX = 16
CHANGES = "changes"
HEAD = "head"


def check_prefix(prefix: str) -> str:
    """The prefix without surrounding slashes, or :class:`InvalidTopic` saying what to change."""
    text = prefix.strip("/")
    problem = None
    if not text:
        problem = "it is empty"
    elif len(text) > MAX_PREFIX_CHARS:
        problem = f"it is longer than {MAX_PREFIX_CHARS} characters"
    elif text.count("/") >= MAX_PREFIX_LEVELS:
        problem = f"it has more than {MAX_PREFIX_LEVELS} levels"
    else:
        bad = next((level for level in text.split("/") if not SAFE_LEVEL.fullmatch(level)), None)
        if bad is not None:
            problem = f"level {bad[:80]!r} is not 1-{MAX_LEVEL} of letters, digits, '-' and '_'"
    if problem is not None:
        raise InvalidTopic(
            f"topic prefix {prefix[:80]!r}: {problem}; use levels of letters, digits, '-' and "
            "'_' separated by '/', e.g. 'resourcesync' (brokers such as NATS refuse '.' and "
            "spaces, '+' and '#' are wildcards and a leading '$' is reserved: MQTT 3.1.1 "
            "section 4.7)"
        )
    return text


def prefix_argument(text: str) -> str:
    """``--topic-prefix`` for argparse: the same check, as a one-line usage error."""
    try:
        return check_prefix(text)
    except InvalidTopic as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def protocol_argument(text: str) -> str:
    """``--mqtt-protocol`` for argparse."""
    if text not in ("auto", "5", "3.1.1"):
        raise argparse.ArgumentTypeError(f"{text!r}: choose auto, 5 or 3.1.1")
    return text


def topic_level(collection: str) -> str:
    """The broker-safe topic level of a collection id (see the module docstring)."""
    if SAFE_LEVEL.fullmatch(collection):
        return collection
    digest = hashlib.sha256(collection.encode("utf-8")).hexdigest()[:DIGEST_HEX]
    readable = _FOLD.sub("-", collection.lower()).strip("-")[:_READABLE].rstrip("-")
    return f"{readable}-{digest}" if readable else digest


@dataclass(frozen=True, slots=True)
class Topics:
    """The topic names under one prefix; ``legacy`` writes the pre-safe names."""

    prefix: str = "resourcesync"
    legacy: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", check_prefix(self.prefix))

    def level(self, collection: str) -> str:
        return collection if self.legacy else topic_level(collection)

    def changes(self, collection: str) -> str:
        return f"{self.prefix}/{self.level(collection)}/{CHANGES}"

    def head(self, collection: str) -> str:
        return f"{self.prefix}/{self.level(collection)}/{HEAD}"

    def read(self, collection: str) -> list[tuple[str, str, bool]]:
        """What a reader subscribes to: ``(topic, "changes"|"head", legacy)``, safe names first.

        The legacy names are read too (when they differ) so that a subscriber
        follows a publisher that still writes them; a broker that refuses
        them (NATS) refuses only that subscription.
        """
        safe, old = topic_level(collection), collection
        levels = [(safe, False)] + ([(old, True)] if old != safe else [])
        return [
            (f"{self.prefix}/{level}/{kind}", kind, legacy)
            for level, legacy in levels
            for kind in (CHANGES, HEAD)
        ]

    def head_filter(self) -> str:
        """Every collection's head under this prefix, whatever the naming."""
        return f"{self.prefix}/+/{HEAD}"


def prefix_of(topic: str) -> str | None:
    """The prefix of an advertised ``<prefix>/<level>/changes`` topic, or None."""
    levels = topic.strip("/").split("/")
    if len(levels) < 3 or levels[-1] != CHANGES:
        return None
    return "/".join(levels[:-2])
